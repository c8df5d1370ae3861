package sim

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

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
	// EnableAutoToolChoice and ToolCallParser are vLLM's
	// --enable-auto-tool-choice and --tool-call-parser: without both a chat
	// request with tool_choice "auto" (the default when it has tools) is
	// refused, as vLLM refuses it; with them the simulated model calls a
	// tool by a fixed rule (output.go). The parser's name is recorded only.
	EnableAutoToolChoice bool
	ToolCallParser       string
	// MaxLogprobs is vLLM's --max-logprobs: the most alternatives a
	// request may ask for at each position (-1: no limit).
	MaxLogprobs int
	// StreamWriteTimeout is how long one write of a stream may block on a
	// client that stopped reading before the request is aborted
	// (--sim-stream-write-timeout; 0: never). vLLM has no such limit, but
	// its engine stops a request whose client has gone; a reader that
	// stalls holds a sequence until then.
	StreamWriteTimeout time.Duration
	// PrefixCachingHashAlgo is accepted and reported; the simulator always
	// hashes with sha256_cbor, the only algorithm reproducible outside
	// Python.
	PrefixCachingHashAlgo string
	// PythonHashSeed seeds the hash of a prompt's first block
	// (PYTHONHASHSEED). Empty means a random seed per process, as vLLM.
	PythonHashSeed string

	// OTLPTracesEndpoint is vLLM's --otlp-traces-endpoint: where each
	// request's llm_request span is sent (trace.go); empty: none.
	OTLPTracesEndpoint string

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
	// LoRAInfoFrozen freezes vllm:lora_requests_info once it has named an
	// adapter (--sim-lora-info-frozen): it keeps showing those adapters
	// running or waiting, as current, for the rest of the run. Engines
	// exist whose adapter-activity metric never returns to idle (issue
	// 27); this is how a test makes one, so that nothing may wait on it.
	LoRAInfoFrozen bool

	// Seed makes generated text, request ids, injected failures and (GPU
	// timing) the API server's per-request jitter reproducible.
	Seed int64
	// DefaultMaxTokens is the completion length when a request gives none.
	// (vLLM defaults to the rest of the context; a short default keeps
	// simulated runs fast.)
	DefaultMaxTokens int

	// Timing is how engine time passes (--sim-timing): TimingSimple sleeps
	// each request its own PrefillPerToken × uncached tokens and
	// DecodePerToken per later token, independently of every other;
	// TimingGPU takes engine steps over the whole batch, priced by a
	// roofline of GPU and the model's shape (sched.go, gpu.go). Empty means
	// TimingGPU when GPU is set, else TimingSimple.
	Timing string
	// GPU is the --sim-gpu profile (GPUProfileNames); with it the KV
	// capacity is derived from memory as vLLM derives it, unless
	// NumGPUBlocks is given.
	GPU string
	// ModelShape is --sim-model-shape: a built-in shape id or key=value
	// pairs (ParseModelShape). Empty looks Model up in the built-in table.
	ModelShape string
	// GPUMemoryUtilization is vLLM's --gpu-memory-utilization.
	GPUMemoryUtilization float64
	// MaxNumBatchedTokens is a step's token budget; 0 means vLLM's default
	// for the GPU (8192 on ≥70 GiB devices other than A100s, else 2048).
	MaxNumBatchedTokens int
	// LongPrefillTokenThreshold caps one sequence's prefill chunk in a
	// step; 0 means no cap, vLLM's default with one partial prefill.
	LongPrefillTokenThreshold int
	// EnableChunkedPrefill splits prefills over steps to fit the budget;
	// vLLM V1 has it on.
	EnableChunkedPrefill bool
	// SchedulingPolicy is vLLM's --scheduling-policy: "fcfs" (arrival
	// order) or "priority" (requests' `priority`, lower first, then
	// arrival; the lowest priority is preempted first). Only then may a
	// request carry a priority other than 0.
	SchedulingPolicy string

	// PrefillPerToken is the time to prefill one token the cache did not
	// supply; DecodePerToken the time per generated token after the first.
	// Simple timing only.
	PrefillPerToken time.Duration
	DecodePerToken  time.Duration
	// StartupDelay, when above 0, is the whole start: how long the engine
	// "loads" before it listens (--sim-startup-delay). 0 derives the start
	// from GPU's profile (LoadTimes), or none without one. Until it
	// listens every connection is refused, as vLLM's are: vLLM binds its
	// port first but listens only once the engine core is up.
	StartupDelay time.Duration
	// LoadScale multiplies the start, sleep and wake times derived from
	// GPU's profile (--sim-load-scale): 1 is the profile's own, 0 none, for
	// tests and demos that need engines at once.
	LoadScale float64
	// KVOffloadingSize is vLLM's --kv-offloading-size: GiB of host memory
	// for the native offloading connector's CPU tier (design §8 "KV
	// offload"); 0 is none. Its capacity in blocks is the size over a
	// block's bytes, from the model's shape (numCPUBlocks), unless
	// NumCPUBlocks is set.
	KVOffloadingSize float64
	// KVOffloadingBackend is vLLM's --kv-offloading-backend; only
	// "native" (the OffloadingConnector) is simulated.
	KVOffloadingBackend string
	// NumCPUBlocks, when above 0, is the CPU tier's capacity in blocks
	// outright (vLLM's kv_connector_extra_config num_cpu_blocks).
	NumCPUBlocks int
	// RequestOverhead, when above 0, is the API server's time for a
	// request before the engine sees it (--sim-request-overhead), in place
	// of the profile's host's (GPUProfile.FrontEnd) or the calibration's.
	// GPU timing only.
	RequestOverhead time.Duration

	// EnableSleepMode is vLLM's --enable-sleep-mode: sleep level 1 moves
	// the weights to host memory and back, taking LoadTimes' Sleep and
	// Wake. Without it a sleep frees nothing and takes no time, as vLLM's
	// (the engine still pauses and drops its prefix cache).
	EnableSleepMode bool
	// DevMode is VLLM_SERVER_DEV_MODE: vLLM serves its development
	// endpoints, /sleep, /wake_up and /is_sleeping among them, only then.
	DevMode bool

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
		MaxModelLen:           8192,
		EnablePrefixCaching:   true,
		PrefixCachingHashAlgo: "sha256",
		MaxLoRAs:              1,
		MaxLoRARank:           16,
		DefaultMaxTokens:      16,
		MaxLogprobs:           20,
		StreamWriteTimeout:    10 * time.Second,
		GPUMemoryUtilization:  0.9,
		EnableChunkedPrefill:  true,
		SchedulingPolicy:      "fcfs",
		PrefillPerToken:       50 * time.Microsecond,
		DecodePerToken:        10 * time.Millisecond,
		LoadScale:             1,
	}
}

// LoadTimes are the engine's simulated start, sleep (level 1 offload) and
// wake (design §8 "Loading and sleeping"): GPU's profile's, scaled by
// LoadScale; StartupDelay, when set, as the start. Without a GPU profile
// only StartupDelay costs anything. The config must be valid.
func (c *Config) LoadTimes() LoadTimes {
	var lt LoadTimes
	if c.GPU != "" {
		if g, err := c.gpuModel(); err == nil {
			lt = g.loadTimes()
		}
		scale := func(d time.Duration) time.Duration { return time.Duration(float64(d) * c.LoadScale) }
		lt = LoadTimes{Start: scale(lt.Start), Sleep: scale(lt.Sleep), Wake: scale(lt.Wake)}
	}
	if c.StartupDelay > 0 {
		lt.Start = c.StartupDelay
	}
	return lt
}

// Timing modes (--sim-timing).
const (
	TimingSimple = "simple"
	TimingGPU    = "gpu"
)

// TimingMode is Timing with its default applied.
func (c *Config) TimingMode() string {
	switch {
	case c.Timing != "":
		return c.Timing
	case c.GPU != "":
		return TimingGPU
	}
	return TimingSimple
}

// gpuModel is the roofline of GPU and the model's shape; errors name the
// flag to fix.
func (c *Config) gpuModel() (*gpuModel, error) {
	p, ok := LookupGPU(c.GPU)
	if !ok {
		return nil, fmt.Errorf("--sim-gpu: %q: not a profile (%s)", c.GPU, strings.Join(GPUProfileNames(), ", "))
	}
	id := c.ModelShape
	if id == "" {
		id = c.Model
	}
	m, err := ParseModelShape(id)
	if err != nil {
		if c.ModelShape == "" {
			return nil, fmt.Errorf("--sim-model-shape: model %q has no built-in shape (%s); give one as key=value pairs", c.Model, strings.Join(ModelShapeNames(), ", "))
		}
		return nil, fmt.Errorf("--sim-model-shape: %w", err)
	}
	return &gpuModel{gpu: p, shape: m, cal: c.frontEnd(DefaultCalibration, p)}, nil
}

// frontEnd is cal with the request overhead of this run's host: the
// profile's own (GPUProfile.FrontEnd), then --sim-request-overhead.
func (c *Config) frontEnd(cal Calibration, p GPUProfile) Calibration {
	if p.FrontEnd > 0 {
		cal.RequestOverhead = p.FrontEnd
	}
	if c.RequestOverhead > 0 {
		cal.RequestOverhead = c.RequestOverhead
	}
	return cal
}

// Derive fills in what vLLM derives when it is not given: with a GPU
// profile, max_num_batched_tokens and max_num_seqs from the device and
// num_gpu_blocks from memory; otherwise 2048, 256 and 2048 blocks. New
// calls it; errors are left for Validate.
func (c *Config) Derive() {
	tokens, seqs, blocks := 2048, 256, 2048
	if c.GPU != "" {
		if g, err := c.gpuModel(); err == nil {
			tokens, seqs = g.gpu.batchDefaults()
			blocks = 0
			if c.NumGPUBlocks == 0 {
				bt := c.MaxNumBatchedTokens
				if bt == 0 {
					bt = tokens
				}
				blocks = g.numGPUBlocks(c.GPUMemoryUtilization, c.BlockSize, bt)
			}
		}
	}
	if c.MaxNumBatchedTokens == 0 {
		c.MaxNumBatchedTokens = tokens
	}
	if c.MaxNumSeqs == 0 {
		c.MaxNumSeqs = seqs
	}
	if c.NumGPUBlocks == 0 {
		c.NumGPUBlocks = blocks
	}
}

// numCPUBlocks is the CPU tier's capacity in blocks: NumCPUBlocks, or
// KVOffloadingSize GiB over a block's bytes (all layers' K and V in BF16
// for BlockSize tokens, as the GPU's blocks), or 0 for no tier. The config
// must be valid.
func (c *Config) numCPUBlocks() int {
	if c.NumCPUBlocks > 0 {
		return c.NumCPUBlocks
	}
	if c.KVOffloadingSize <= 0 {
		return 0
	}
	g, err := c.gpuModel()
	if err != nil {
		return 0
	}
	return int(c.KVOffloadingSize * gib / (g.shape.kvBytesPerToken() * float64(c.BlockSize)))
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

// Validate reports every bad field at once, of the config as Derive
// completes it; each error names its flag.
func (c *Config) Validate() error {
	d := *c
	d.Derive()
	return d.validate()
}

func (c *Config) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if _, err := TraceEndpoint(c.OTLPTracesEndpoint); err != nil {
		bad("%w", err)
	}
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
	switch c.Timing {
	case "", TimingSimple:
	case TimingGPU:
		if c.GPU == "" {
			bad("--sim-timing: gpu needs --sim-gpu (%s)", strings.Join(GPUProfileNames(), ", "))
		}
	default:
		bad("--sim-timing: %q: must be simple or gpu", c.Timing)
	}
	gpuOK := true
	if c.GPU != "" {
		if _, err := c.gpuModel(); err != nil {
			errs = append(errs, err)
			gpuOK = false
		}
	}
	if c.GPUMemoryUtilization <= 0 || c.GPUMemoryUtilization > 1 {
		bad("--gpu-memory-utilization: %v: must be in (0, 1]", c.GPUMemoryUtilization)
	}
	if c.NumGPUBlocks < 1 && (c.GPU == "" || gpuOK) {
		if c.GPU != "" {
			bad("--gpu-memory-utilization: %v of %s leaves no memory for the KV cache of %s", c.GPUMemoryUtilization, c.GPU, c.Model)
		} else {
			bad("--num-gpu-blocks-override: %d: must be at least 1", c.NumGPUBlocks)
		}
	}
	if c.MaxNumBatchedTokens < 1 {
		bad("--max-num-batched-tokens: %d: must be at least 1", c.MaxNumBatchedTokens)
	} else if !c.EnableChunkedPrefill && c.MaxNumBatchedTokens < c.MaxModelLen {
		// vLLM's SchedulerConfig refuses it too: a prompt could never run.
		bad("--max-num-batched-tokens: %d is smaller than --max-model-len %d without chunked prefill", c.MaxNumBatchedTokens, c.MaxModelLen)
	}
	if c.LongPrefillTokenThreshold < 0 {
		bad("--long-prefill-token-threshold: %d: must not be negative", c.LongPrefillTokenThreshold)
	}
	if c.SchedulingPolicy != "fcfs" && c.SchedulingPolicy != "priority" {
		bad("--scheduling-policy: invalid choice: %q (choose from 'fcfs', 'priority')", c.SchedulingPolicy)
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
	if c.EnableAutoToolChoice && c.ToolCallParser == "" {
		bad("--enable-auto-tool-choice: requires --tool-call-parser")
	}
	if c.MaxLogprobs < -1 {
		bad("--max-logprobs: %d: must be -1 (no limit) or at least 0", c.MaxLogprobs)
	}
	if c.StreamWriteTimeout < 0 {
		bad("--sim-stream-write-timeout: must not be negative")
	}
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
	if c.KVOffloadingSize < 0 {
		bad("--kv-offloading-size: %v: must not be negative", c.KVOffloadingSize)
	}
	if c.KVOffloadingSize > 0 && c.NumCPUBlocks == 0 && c.TimingMode() != TimingGPU {
		bad("--kv-offloading-size: needs --sim-gpu (a block's bytes come from the model's shape)")
	}
	if b := c.KVOffloadingBackend; b != "" && b != "native" {
		bad("--kv-offloading-backend: %q: the simulator has the native one only", b)
	}
	if c.NumCPUBlocks < 0 {
		bad("num CPU blocks: %d: must not be negative", c.NumCPUBlocks)
	}
	if c.RequestOverhead < 0 {
		bad("--sim-request-overhead: must not be negative")
	}
	if c.LoadScale < 0 || c.LoadScale > 1 {
		bad("--sim-load-scale: %v: must be in [0, 1]", c.LoadScale)
	}
	if err := c.Faults.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Flags binds `llmgw sim serve`'s flags to a Config: the vLLM flags the
// simulator uses and its own --sim-* ones, one line each. Every other flag
// of vLLM's is accepted and ignored (vllmflags.go); anything else is an
// error, as in vLLM.
type Flags struct {
	Config     Config
	prefillUS  float64
	decodeMS   float64
	kvEncoding string
}

// NewFlags registers the flags on fs over DefaultConfig.
func NewFlags(fs *pflag.FlagSet) *Flags {
	f := &Flags{Config: DefaultConfig(), kvEncoding: "map"}
	c := &f.Config
	f.prefillUS = float64(c.PrefillPerToken) / float64(time.Microsecond)
	f.decodeMS = float64(c.DecodePerToken) / float64(time.Millisecond)
	// vLLM's own.
	fs.StringVar(&c.Host, "host", c.Host, "host to listen on (empty: every interface)")
	fs.IntVar(&c.Port, "port", c.Port, "port to listen on")
	fs.StringArrayVar(&c.ServedModelNames, "served-model-name", nil, "name(s) requests use for the model (default: MODEL); one or more")
	fs.IntVar(&c.BlockSize, "block-size", c.BlockSize, "KV cache block size in tokens")
	fs.StringVar(&c.PrefixCachingHashAlgo, "prefix-caching-hash-algo", c.PrefixCachingHashAlgo, "recorded only; the simulator always hashes with sha256_cbor")
	fs.BoolVar(&c.EnablePrefixCaching, "enable-prefix-caching", c.EnablePrefixCaching, "cache prompt prefixes (--no-enable-prefix-caching: off)")
	fs.StringVar(&c.KVEventsConfig, "kv-events-config", "", "KV cache events configuration, JSON (vLLM's KVEventsConfig)")
	fs.StringVar(&c.OTLPTracesEndpoint, "otlp-traces-endpoint", "", "OTLP/gRPC trace receiver, as vLLM's: a span llm_request per request, joined to its traceparent (http://host:port or host:port plain text, https:// TLS)")
	fs.BoolVar(&c.EnableLoRA, "enable-lora", false, "enable LoRA adapters")
	fs.IntVar(&c.MaxLoRAs, "max-loras", c.MaxLoRAs, "LoRA adapters held at once (the simulator refuses a load beyond it)")
	fs.IntVar(&c.MaxLoRARank, "max-lora-rank", c.MaxLoRARank, "maximum LoRA rank (checked, recorded)")
	fs.StringArrayVar(&c.LoRAModules, "lora-modules", nil, "LoRA adapters loaded at start, name=path or JSON {\"name\",\"path\",\"base_model_name\"}; one or more; each path must exist")
	fs.IntVar(&c.MaxNumSeqs, "max-num-seqs", c.MaxNumSeqs, "sequences running at once; more wait (0: vLLM's default for the GPU, 256 or 1024)")
	fs.IntVar(&c.MaxNumBatchedTokens, "max-num-batched-tokens", c.MaxNumBatchedTokens, "GPU timing: a step's token budget (0: vLLM's default for the GPU, 2048 or 8192)")
	fs.IntVar(&c.LongPrefillTokenThreshold, "long-prefill-token-threshold", c.LongPrefillTokenThreshold, "GPU timing: most prefill tokens of one sequence in a step (0: no cap)")
	fs.StringVar(&c.SchedulingPolicy, "scheduling-policy", c.SchedulingPolicy, "fcfs or priority: the order waiting requests are admitted in (GPU timing) and whether a request may carry a priority")
	fs.BoolVar(&c.EnableChunkedPrefill, "enable-chunked-prefill", c.EnableChunkedPrefill, "GPU timing: split long prefills over steps")
	fs.IntVar(&c.NumGPUBlocks, "num-gpu-blocks-override", c.NumGPUBlocks, "KV cache capacity in blocks (0: from --sim-gpu's memory as vLLM derives it, else 2048)")
	fs.Float64Var(&c.GPUMemoryUtilization, "gpu-memory-utilization", c.GPUMemoryUtilization, "share of GPU memory for weights, activations and KV cache (with --sim-gpu)")
	fs.BoolVar(&c.EnablePromptTokensDetails, "enable-prompt-tokens-details", false, "report usage.prompt_tokens_details.cached_tokens")
	fs.BoolVar(&c.EnableAutoToolChoice, "enable-auto-tool-choice", false, "let chat requests use tool_choice \"auto\" (needs --tool-call-parser): the model calls a tool when the last message is the user's")
	fs.StringVar(&c.ToolCallParser, "tool-call-parser", "", "tool-call parser for --enable-auto-tool-choice (recorded; calls are written in Llama 3 JSON)")
	fs.IntVar(&c.MaxLogprobs, "max-logprobs", c.MaxLogprobs, "most logprob alternatives a request may ask for (-1: no limit)")
	fs.BoolVar(&c.EnableSleepMode, "enable-sleep-mode", false, "sleep mode: a level-1 sleep moves the weights to host memory and a wake back, each over --sim-gpu's host link (the endpoints need VLLM_SERVER_DEV_MODE=1)")
	fs.IntVar(&c.MaxModelLen, "max-model-len", c.MaxModelLen, "maximum prompt plus completion tokens")
	fs.Int64Var(&c.Seed, "seed", c.Seed, "seed of generated text, request ids and injected failures")
	// The simulator's own.
	fs.StringVar(&c.Timing, "sim-timing", "", "engine time: gpu (steps over the batch, priced by a roofline of --sim-gpu) or simple (--sim-*-per-token sleeps per request); default gpu with --sim-gpu, else simple")
	fs.StringVar(&c.GPU, "sim-gpu", "", "GPU profile: "+strings.Join(GPUProfileNames(), ", "))
	fs.StringVar(&c.ModelShape, "sim-model-shape", "", "model shape for the roofline: a built-in id ("+strings.Join(ModelShapeNames(), ", ")+") or params=,layers=,hidden=,heads=,kv_heads=,head_dim=,vocab=[,tied=]; default: MODEL's")
	fs.Float64Var(&f.prefillUS, "sim-prefill-us-per-token", f.prefillUS, "simple timing: prefill time per uncached prompt token, microseconds")
	fs.Float64Var(&f.decodeMS, "sim-decode-ms-per-token", f.decodeMS, "simple timing: decode time per generated token, milliseconds")
	fs.DurationVar(&c.StartupDelay, "sim-startup-delay", c.StartupDelay, "the whole start, spent before listening (0: from --sim-gpu's profile, else none)")
	fs.Float64Var(&c.LoadScale, "sim-load-scale", c.LoadScale, "scale of the start, sleep and wake times from --sim-gpu's profile, 0..1 (0: engines ready at once)")
	fs.Float64Var(&c.KVOffloadingSize, "kv-offloading-size", 0, "GiB of host memory for offloaded KV blocks (the native OffloadingConnector's CPU tier; 0: none)")
	fs.StringVar(&c.KVOffloadingBackend, "kv-offloading-backend", "native", "KV offloading backend (native only)")
	fs.DurationVar(&c.RequestOverhead, "sim-request-overhead", c.RequestOverhead, "GPU timing: the API server's time for a request before the engine sees it, the host CPU's (0: --sim-gpu's profile's host, else 22ms)")
	fs.DurationVar(&c.LoRALoadDelay, "sim-lora-load-delay", c.LoRALoadDelay, "time a runtime LoRA load takes (POST /v1/load_lora_adapter)")
	fs.BoolVar(&c.LoRAInfoFrozen, "sim-lora-info-frozen", false, "engine deviation: vllm:lora_requests_info stops changing once it has named an adapter (an adapter-activity metric stuck busy)")
	fs.DurationVar(&c.StreamWriteTimeout, "sim-stream-write-timeout", c.StreamWriteTimeout, "abort a streamed request when one write blocks this long on a client that stopped reading (0: never)")
	fs.IntVar(&c.DefaultMaxTokens, "sim-default-max-tokens", c.DefaultMaxTokens, "completion length when a request sets none")
	fs.Float64Var(&c.Faults.Slowdown, "sim-slowdown", 0, "fault injection: multiply prefill and decode times")
	fs.Float64Var(&c.Faults.FailRate, "sim-fail-rate", 0, "fault injection: share of requests failed with --sim-fail-status")
	fs.IntVar(&c.Faults.FailStatus, "sim-fail-status", 0, "fault injection: HTTP status of failed requests (default 500)")
	fs.IntVar(&c.Faults.CrashAfter, "sim-crash-after", 0, "fault injection: die abruptly when this many requests have arrived")
	fs.StringVar(&f.kvEncoding, "sim-kv-events-encoding", f.kvEncoding, "KV event encoding: map (vLLM since mid-2026) or array (older vLLM)")
	fs.Float64Var(&c.Faults.KVDropRate, "sim-kv-drop-rate", 0, "fault injection: share of KV event batches not sent (a seq gap replay can repair)")
	fs.IntVar(&c.KVBufferSteps, "sim-kv-buffer-steps", 0, "batches the KV replay buffer holds, replacing --kv-events-config's buffer_steps (0: keep it); small values make gaps unrepairable")
	fs.Uint64Var(&c.KVSeqStart, "sim-kv-seq-start", 0, "engine deviation: number KV event batches from this seq (vLLM: 0; some compatible engines: 1)")
	fs.BoolVar(&c.KVParentZero, "sim-kv-parent-zero", false, "engine deviation: send a first block's parent_block_hash as 0 instead of None")
	fs.Float64Var(&c.Faults.KVReorderRate, "sim-kv-reorder-rate", 0, "fault injection: share of KV event batches sent after the next one")
	registerVLLMFlags(fs)
	return f
}

// Resolve finishes the Config once the flags are parsed: the latencies in
// their units and the KV event encoding.
func (f *Flags) Resolve() (Config, error) {
	c := f.Config
	c.PrefillPerToken = time.Duration(f.prefillUS * float64(time.Microsecond))
	c.DecodePerToken = time.Duration(f.decodeMS * float64(time.Millisecond))
	enc, err := vllm.ParseEncoding(f.kvEncoding)
	if err != nil {
		return c, fmt.Errorf("--sim-kv-events-encoding: %w", err)
	}
	c.KVEventsEncoding = enc
	return c, nil
}
