package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/sim"
	"github.com/llmgw/llmgw/vllm"
)

// newSimCmd is `llmgw sim`, the vLLM-compatible engine simulator (design §8).
// Its serve subcommand takes vLLM's flags so the agent's vLLM driver can
// start it with the very argv it gives `vllm serve`.
func newSimCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "A vLLM-compatible engine simulator",
	}
	cmd.AddCommand(newSimServeCmd())
	return cmd
}

func newSimServeCmd() *cobra.Command {
	cfg := sim.DefaultConfig()
	var (
		noPrefixCaching bool
		prefillUS       float64
		decodeMS        float64
		kvEncoding      string
	)
	cmd := &cobra.Command{
		Use:   "serve MODEL",
		Short: "Serve a simulated model on vLLM's OpenAI-compatible API",
		Long: `Serve a simulated model on vLLM's OpenAI-compatible API.

Takes vLLM's flags; flags it does not know are ignored, so extra engine
arguments meant for vLLM do not stop it. --lora-modules takes one or more
values, as vLLM's does. PYTHONHASHSEED and VLLM_ALLOW_RUNTIME_LORA_UPDATING
and VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES (0 or false: hashes in KV events
as 32-byte digests) are read from the environment, and LLMGW_SIM_FAULTS may hold the fault
injection settings as JSON ({"slowdown":2,"fail_rate":0.1,"fail_status":503,
"crash_after":100,"kv_drop_rate":0.1,"kv_reorder_rate":0}); the --sim-* flags
override it.`,
		Args: cobra.MinimumNArgs(1),
		// vLLM has many flags the simulator has no use for; the agent may
		// pass any of them as a model's extra engine arguments.
		FParseErrWhitelist: cobra.FParseErrWhitelist{UnknownFlags: true},
		RunE: func(cmd *cobra.Command, args []string) error {
			log, err := newLogger(cmd)
			if err != nil {
				return err
			}
			cfg.Model = args[0]
			if len(args) > 1 {
				// vLLM's --lora-modules is nargs='+': values after the first
				// arrive here as positional arguments.
				if !cmd.Flags().Changed("lora-modules") {
					return fmt.Errorf("unexpected arguments %q after MODEL", args[1:])
				}
				cfg.LoRAModules = append(cfg.LoRAModules, args[1:]...)
			}
			if noPrefixCaching {
				cfg.EnablePrefixCaching = false
			}
			cfg.PrefillPerToken = time.Duration(prefillUS * float64(time.Microsecond))
			cfg.DecodePerToken = time.Duration(decodeMS * float64(time.Millisecond))
			cfg.PythonHashSeed = os.Getenv("PYTHONHASHSEED")
			switch strings.ToLower(strings.TrimSpace(os.Getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING"))) {
			case "1", "true":
				cfg.AllowRuntimeLoRAUpdating = true
			}
			switch strings.ToLower(strings.TrimSpace(os.Getenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"))) {
			case "0", "false":
				cfg.KVEventsBytesHashes = true
			}
			if cfg.KVEventsEncoding, err = vllm.ParseEncoding(kvEncoding); err != nil {
				return fmt.Errorf("--sim-kv-events-encoding: %w", err)
			}
			if err := applyFaultsEnv(cmd, &cfg.Faults); err != nil {
				return err
			}
			srv, err := sim.New(cfg, log)
			if err != nil {
				return err
			}
			ctx, stop := signalContext()
			defer stop()
			if err := srv.Run(ctx); err != nil {
				if errors.Is(err, sim.ErrCrashed) {
					return fmt.Errorf("sim serve: %w", err)
				}
				return err
			}
			return nil
		},
	}
	f := cmd.Flags()
	// vLLM's own flags.
	f.StringVar(&cfg.Host, "host", cfg.Host, "host to listen on (empty: every interface)")
	f.IntVar(&cfg.Port, "port", cfg.Port, "port to listen on")
	f.StringArrayVar(&cfg.ServedModelNames, "served-model-name", nil, "name(s) requests use for the model (default: MODEL)")
	f.IntVar(&cfg.BlockSize, "block-size", cfg.BlockSize, "KV cache block size in tokens")
	f.StringVar(&cfg.PrefixCachingHashAlgo, "prefix-caching-hash-algo", cfg.PrefixCachingHashAlgo, "recorded only; the simulator always hashes with sha256_cbor")
	f.BoolVar(&cfg.EnablePrefixCaching, "enable-prefix-caching", cfg.EnablePrefixCaching, "cache prompt prefixes")
	f.BoolVar(&noPrefixCaching, "no-enable-prefix-caching", false, "disable prefix caching")
	f.StringVar(&cfg.KVEventsConfig, "kv-events-config", "", "KV cache events configuration, JSON (vLLM's KVEventsConfig)")
	f.BoolVar(&cfg.EnableLoRA, "enable-lora", false, "enable LoRA adapters")
	f.IntVar(&cfg.MaxLoRAs, "max-loras", cfg.MaxLoRAs, "LoRA adapters held at once (the simulator refuses a load beyond it)")
	f.IntVar(&cfg.MaxLoRARank, "max-lora-rank", cfg.MaxLoRARank, "maximum LoRA rank (checked, recorded)")
	f.StringArrayVar(&cfg.LoRAModules, "lora-modules", nil, "LoRA adapters loaded at start, name=path or JSON {\"name\",\"path\",\"base_model_name\"}; one or more; each path must exist")
	f.IntVar(&cfg.MaxNumSeqs, "max-num-seqs", cfg.MaxNumSeqs, "sequences running at once; more wait")
	f.IntVar(&cfg.NumGPUBlocks, "num-gpu-blocks-override", cfg.NumGPUBlocks, "KV cache capacity in blocks")
	f.BoolVar(&cfg.EnablePromptTokensDetails, "enable-prompt-tokens-details", false, "report usage.prompt_tokens_details.cached_tokens")
	f.IntVar(&cfg.MaxModelLen, "max-model-len", cfg.MaxModelLen, "maximum prompt plus completion tokens")
	f.Int64Var(&cfg.Seed, "seed", cfg.Seed, "seed of generated text, request ids and injected failures")
	// The simulator's own.
	f.Float64Var(&prefillUS, "sim-prefill-us-per-token", float64(cfg.PrefillPerToken)/float64(time.Microsecond), "prefill time per uncached prompt token, microseconds")
	f.Float64Var(&decodeMS, "sim-decode-ms-per-token", float64(cfg.DecodePerToken)/float64(time.Millisecond), "decode time per generated token, milliseconds")
	f.DurationVar(&cfg.StartupDelay, "sim-startup-delay", cfg.StartupDelay, "time spent \"loading weights\" before listening")
	f.DurationVar(&cfg.LoRALoadDelay, "sim-lora-load-delay", cfg.LoRALoadDelay, "time a runtime LoRA load takes (POST /v1/load_lora_adapter)")
	f.IntVar(&cfg.DefaultMaxTokens, "sim-default-max-tokens", cfg.DefaultMaxTokens, "completion length when a request sets none")
	f.Float64Var(&cfg.Faults.Slowdown, "sim-slowdown", 0, "fault injection: multiply prefill and decode times")
	f.Float64Var(&cfg.Faults.FailRate, "sim-fail-rate", 0, "fault injection: share of requests failed with --sim-fail-status")
	f.IntVar(&cfg.Faults.FailStatus, "sim-fail-status", 0, "fault injection: HTTP status of failed requests (default 500)")
	f.IntVar(&cfg.Faults.CrashAfter, "sim-crash-after", 0, "fault injection: die abruptly when this many requests have arrived")
	f.StringVar(&kvEncoding, "sim-kv-events-encoding", "map", "KV event encoding: map (vLLM since mid-2026) or array (older vLLM)")
	f.Float64Var(&cfg.Faults.KVDropRate, "sim-kv-drop-rate", 0, "fault injection: share of KV event batches not sent (a seq gap replay can repair)")
	f.IntVar(&cfg.KVBufferSteps, "sim-kv-buffer-steps", 0, "batches the KV replay buffer holds, replacing --kv-events-config's buffer_steps (0: keep it); small values make gaps unrepairable")
	f.Uint64Var(&cfg.KVSeqStart, "sim-kv-seq-start", 0, "engine deviation: number KV event batches from this seq (vLLM: 0; some compatible engines: 1)")
	f.BoolVar(&cfg.KVParentZero, "sim-kv-parent-zero", false, "engine deviation: send a first block's parent_block_hash as 0 instead of None")
	f.Float64Var(&cfg.Faults.KVReorderRate, "sim-kv-reorder-rate", 0, "fault injection: share of KV event batches sent after the next one")
	return cmd
}

// applyFaultsEnv reads LLMGW_SIM_FAULTS under the --sim-* flags: a flag
// given on the command line wins over the environment.
func applyFaultsEnv(cmd *cobra.Command, faults *sim.Faults) error {
	raw := os.Getenv("LLMGW_SIM_FAULTS")
	if raw == "" {
		return nil
	}
	var env sim.Faults
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&env); err != nil {
		return fmt.Errorf("LLMGW_SIM_FAULTS: %w", err)
	}
	f := cmd.Flags()
	if !f.Changed("sim-slowdown") {
		faults.Slowdown = env.Slowdown
	}
	if !f.Changed("sim-fail-rate") {
		faults.FailRate = env.FailRate
	}
	if !f.Changed("sim-fail-status") {
		faults.FailStatus = env.FailStatus
	}
	if !f.Changed("sim-crash-after") {
		faults.CrashAfter = env.CrashAfter
	}
	if !f.Changed("sim-kv-drop-rate") {
		faults.KVDropRate = env.KVDropRate
	}
	if !f.Changed("sim-kv-reorder-rate") {
		faults.KVReorderRate = env.KVReorderRate
	}
	return nil
}
