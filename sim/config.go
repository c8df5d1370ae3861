package sim

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/llmgw/llmgw/vllm"
)

// Config is one simulated engine. Names follow vLLM's flags, so the agent's
// vLLM driver can start the simulator with the arguments it gives vLLM.
type Config struct {
	// Model is the model path or id ("vllm serve MODEL"). Required.
	Model string
	// ServedModelNames are the names requests may use; the first is the
	// model_name label of every metric. Empty means Model, as in vLLM.
	ServedModelNames []string
	// Host and Port are where to listen; an empty Host is every interface,
	// as vLLM's default.
	Host string
	Port int

	// BlockSize is the prefix cache's block size in tokens: only full
	// blocks are cached and hashed.
	BlockSize int
	// NumGPUBlocks is the KV cache's capacity in blocks
	// (--num-gpu-blocks-override); it bounds how much prefix stays cached.
	NumGPUBlocks int
	// MaxNumSeqs is how many sequences run at once; more wait in FIFO order.
	MaxNumSeqs int
	// MaxModelLen bounds prompt plus completion tokens. It must fit in the
	// cache: NumGPUBlocks*BlockSize >= MaxModelLen.
	MaxModelLen int
	// EnablePrefixCaching is vLLM's default (true). Off, nothing is ever a
	// cache hit.
	EnablePrefixCaching bool
	// EnablePromptTokensDetails makes usage carry
	// prompt_tokens_details.cached_tokens; vLLM reports null without it.
	EnablePromptTokensDetails bool
	// PrefixCachingHashAlgo is accepted and reported; the simulator always
	// hashes with sha256_cbor, the only algorithm reproducible outside
	// Python.
	PrefixCachingHashAlgo string
	// PythonHashSeed seeds the hash of a prompt's first block
	// (PYTHONHASHSEED). Empty means a random seed per process, as vLLM.
	PythonHashSeed string

	// KVEventsConfig is --kv-events-config, JSON (KVEventsConfig in
	// kvpub.go); when it enables events, the server publishes them.
	KVEventsConfig string
	// KVEventsEncoding is how events are written: map (vLLM since
	// mid-2026, the zero value) or array (older vLLM).
	KVEventsEncoding vllm.Encoding
	// KVEventsBytesHashes publishes block hashes as 32-byte digests
	// instead of ints: VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0.
	KVEventsBytesHashes bool
	// KVBufferSteps, when above 0, replaces the KV events config's
	// buffer_steps (--sim-kv-buffer-steps). The agent writes
	// --kv-events-config itself and a model's extra arguments may not
	// override it, so this is how a test makes the replay buffer too small
	// to close a gap (an unrepairable gap: the replica goes untrusted,
	// design §7.5). 0 keeps the config's own value.
	KVBufferSteps int
	// Deviations of vLLM-compatible engines (issue 14), to test that tier 2
	// survives them: KVSeqStart numbers batches from it instead of 0
	// (--sim-kv-seq-start), and KVParentZero sends a first block's
	// parent_block_hash as 0 instead of None (--sim-kv-parent-zero).
	KVSeqStart   uint64
	KVParentZero bool
	// LoRA (lora.go): EnableLoRA is --enable-lora; MaxLoRAs bounds the
	// adapters held at once; MaxLoRARank is checked and recorded;
	// LoRAModules are --lora-modules items (name=path or JSON) loaded at
	// start; AllowRuntimeLoRAUpdating (VLLM_ALLOW_RUNTIME_LORA_UPDATING)
	// serves the runtime load and unload API.
	EnableLoRA               bool
	MaxLoRAs                 int
	MaxLoRARank              int
	LoRAModules              []string
	AllowRuntimeLoRAUpdating bool
	// LoRALoadDelay is how long a runtime load takes: reading a PEFT
	// adapter onto the GPU is not free, and a router waiting for a cold
	// adapter should see it.
	LoRALoadDelay time.Duration

	// Seed makes generated text, request ids and injected failures
	// reproducible.
	Seed int64
	// DefaultMaxTokens is the completion length when a request gives none.
	// (vLLM defaults to the rest of the context; a short default keeps
	// simulated runs fast.)
	DefaultMaxTokens int

	// PrefillPerToken is the time to prefill one token the cache did not
	// supply; DecodePerToken the time per generated token after the first.
	PrefillPerToken time.Duration
	DecodePerToken  time.Duration
	// StartupDelay is how long the engine "loads weights" before it
	// listens: /health is unreachable until then, as with vLLM.
	StartupDelay time.Duration

	// Faults are injected failures for tests; they can also be changed at
	// run time through POST /sim/faults.
	Faults Faults
}

// Faults are the simulator's fault-injection knobs (design §8). The zero
// value injects nothing.
type Faults struct {
	// Slowdown multiplies every prefill and decode time; 0 means 1.
	Slowdown float64 `json:"slowdown"`
	// FailRate is the share of requests, in [0, 1], answered with
	// FailStatus instead of being served (drawn from the seeded source).
	FailRate float64 `json:"fail_rate"`
	// FailStatus is the HTTP status of injected failures; 0 means 500.
	FailStatus int `json:"fail_status"`
	// CrashAfter makes the server die abruptly — listener and every
	// connection closed, Run returning ErrCrashed — when the given number
	// of generation requests has arrived. 0 never crashes.
	CrashAfter int `json:"crash_after"`
	// KVDropRate is the share of KV-event batches, in [0, 1], not sent:
	// their seq is used, so subscribers see a gap, which the replay
	// buffer can repair.
	KVDropRate float64 `json:"kv_drop_rate"`
	// KVReorderRate is the share of KV-event batches, in [0, 1], sent
	// after the batch that follows them.
	KVReorderRate float64 `json:"kv_reorder_rate"`
}

// Validate checks the faults; errors name the flag.
func (f Faults) Validate() error {
	var errs []error
	if f.Slowdown < 0 {
		errs = append(errs, fmt.Errorf("--sim-slowdown: %v: must not be negative", f.Slowdown))
	}
	if f.FailRate < 0 || f.FailRate > 1 {
		errs = append(errs, fmt.Errorf("--sim-fail-rate: %v: must be in [0, 1]", f.FailRate))
	}
	if f.FailStatus != 0 && (f.FailStatus < 400 || f.FailStatus > 599) {
		errs = append(errs, fmt.Errorf("--sim-fail-status: %d: must be an HTTP error status (400-599)", f.FailStatus))
	}
	if f.CrashAfter < 0 {
		errs = append(errs, fmt.Errorf("--sim-crash-after: %d: must not be negative", f.CrashAfter))
	}
	if f.KVDropRate < 0 || f.KVDropRate > 1 {
		errs = append(errs, fmt.Errorf("--sim-kv-drop-rate: %v: must be in [0, 1]", f.KVDropRate))
	}
	if f.KVReorderRate < 0 || f.KVReorderRate > 1 {
		errs = append(errs, fmt.Errorf("--sim-kv-reorder-rate: %v: must be in [0, 1]", f.KVReorderRate))
	}
	return errors.Join(errs...)
}

// DefaultConfig is a small GPU's worth of engine: vLLM's block size and
// max_num_seqs, 2048 blocks of cache, and latencies of the order of a 8B
// model on one GPU (prefill 50µs per token, decode 10ms per token).
func DefaultConfig() Config {
	return Config{
		Port:                  8000,
		BlockSize:             16,
		NumGPUBlocks:          2048,
		MaxNumSeqs:            256,
		MaxModelLen:           8192,
		EnablePrefixCaching:   true,
		PrefixCachingHashAlgo: "sha256",
		MaxLoRAs:              1,
		MaxLoRARank:           16,
		DefaultMaxTokens:      16,
		PrefillPerToken:       50 * time.Microsecond,
		DecodePerToken:        10 * time.Millisecond,
	}
}

// KVEvents is the KV events config the server publishes with:
// --kv-events-config over vLLM's defaults, its buffer_steps replaced by
// KVBufferSteps when that is set.
func (c *Config) KVEvents() (KVEventsConfig, error) {
	kv, err := ParseKVEventsConfig(c.KVEventsConfig)
	if err != nil {
		return kv, err
	}
	if c.KVBufferSteps > 0 {
		kv.BufferSteps = c.KVBufferSteps
	}
	return kv, nil
}

// ServedNames is ServedModelNames, or Model when none are given.
func (c *Config) ServedNames() []string {
	if len(c.ServedModelNames) > 0 {
		return c.ServedModelNames
	}
	return []string{c.Model}
}

// Validate reports every bad field at once; each error names its flag.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Model == "" {
		bad("model: required")
	}
	for i, n := range c.ServedModelNames {
		if n == "" {
			bad("--served-model-name: name %d is empty", i)
		}
	}
	if c.Port < 0 || c.Port > 65535 {
		bad("--port: %d: must be in 0..65535", c.Port)
	}
	if c.BlockSize < 1 {
		bad("--block-size: %d: must be at least 1", c.BlockSize)
	}
	if c.NumGPUBlocks < 1 {
		bad("--num-gpu-blocks-override: %d: must be at least 1", c.NumGPUBlocks)
	}
	if c.MaxNumSeqs < 1 {
		bad("--max-num-seqs: %d: must be at least 1", c.MaxNumSeqs)
	}
	if c.MaxModelLen < 1 {
		bad("--max-model-len: %d: must be at least 1", c.MaxModelLen)
	} else if c.BlockSize >= 1 && c.NumGPUBlocks >= 1 && c.NumGPUBlocks*c.BlockSize < c.MaxModelLen {
		bad("--max-model-len: %d tokens do not fit in %d blocks of %d tokens", c.MaxModelLen, c.NumGPUBlocks, c.BlockSize)
	}
	switch c.PrefixCachingHashAlgo {
	case "sha256", "sha256_cbor", "xxhash", "xxhash_cbor":
	default:
		bad("--prefix-caching-hash-algo: %q: must be one of sha256, sha256_cbor, xxhash, xxhash_cbor", c.PrefixCachingHashAlgo)
	}
	if c.PythonHashSeed != "" && c.PythonHashSeed != "random" {
		if n, err := strconv.ParseUint(c.PythonHashSeed, 10, 64); err != nil || n > 4294967295 {
			bad("PYTHONHASHSEED: %q: must be \"random\" or an integer in 0..4294967295", c.PythonHashSeed)
		}
	}
	if c.KVBufferSteps < 0 {
		bad("--sim-kv-buffer-steps: %d: must not be negative (0 keeps --kv-events-config's buffer_steps)", c.KVBufferSteps)
	} else if _, err := c.KVEvents(); err != nil {
		errs = append(errs, err)
	}
	if c.KVSeqStart >= vllm.ReplayEndSeq-1<<32 {
		bad("--sim-kv-seq-start: %d: must be below 2^64-2^32 (the seq of replay's end marker is 2^64-1)", c.KVSeqStart)
	}
	if c.KVEventsEncoding != vllm.EncodingMap && c.KVEventsEncoding != vllm.EncodingArray {
		bad("--sim-kv-events-encoding: %v: must be map or array", c.KVEventsEncoding)
	}
	if c.MaxLoRAs < 1 {
		bad("--max-loras: %d: must be at least 1", c.MaxLoRAs)
	}
	switch c.MaxLoRARank {
	case 1, 8, 16, 32, 64, 128, 256, 320, 512:
	default:
		bad("--max-lora-rank: %d: must be one of 1, 8, 16, 32, 64, 128, 256, 320, 512", c.MaxLoRARank)
	}
	errs = append(errs, c.validateLoRA()...)
	if c.DefaultMaxTokens < 1 {
		bad("--sim-default-max-tokens: %d: must be at least 1", c.DefaultMaxTokens)
	}
	if c.PrefillPerToken < 0 {
		bad("--sim-prefill-us-per-token: must not be negative")
	}
	if c.DecodePerToken < 0 {
		bad("--sim-decode-ms-per-token: must not be negative")
	}
	if c.StartupDelay < 0 {
		bad("--sim-startup-delay: must not be negative")
	}
	if err := c.Faults.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
