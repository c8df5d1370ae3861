package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/sim"
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
	var flags *sim.Flags
	cmd := &cobra.Command{
		Use:   "serve MODEL",
		Short: "Serve a simulated model on vLLM's OpenAI-compatible API",
		Long: `Serve a simulated model on vLLM's OpenAI-compatible API.

Takes vLLM's flags, as strictly as vLLM does: every flag of vllm serve is
accepted (those the simulator has no use for are ignored), --no-X for its
boolean ones, --x_y for --x-y, and a flag neither vLLM nor the simulator
knows is refused ("unrecognized arguments"). --served-model-name and
--lora-modules take one or more values, as vLLM's do.

With --sim-gpu the engine takes steps over the whole batch as vLLM's V1
scheduler does, each priced by a roofline of the GPU and the model's shape,
and the KV cache is sized from the GPU's memory; --sim-timing simple keeps
the per-request --sim-*-per-token latencies.

With --sim-gpu the engine takes as long to start as vLLM would to load the
model there (its fixed startup, the weights read from disk and copied over
the host link), and with --enable-sleep-mode a level-1 sleep and a wake each
copy the weights over the host link; --sim-load-scale scales all three (0:
at once), --sim-startup-delay sets the start outright.

PYTHONHASHSEED, VLLM_ALLOW_RUNTIME_LORA_UPDATING, VLLM_SERVER_DEV_MODE (1:
serve /sleep, /wake_up and /is_sleeping, as vLLM's dev mode does)
and VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES (0 or false: hashes in KV events
as 32-byte digests) are read from the environment, and LLMGW_SIM_FAULTS may hold the fault
injection settings as JSON ({"slowdown":2,"fail_rate":0.1,"fail_status":503,
"crash_after":100,"kv_drop_rate":0.1,"kv_reorder_rate":0}); the --sim-* flags
override it.`,
		// The flags are parsed in RunE, after NormalizeArgs has put vLLM's
		// argparse forms (nargs="+", -tp, --x_y) in pflag's.
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			cmd.InheritedFlags() // merges --log-level and --log-format into Flags
			if err := cmd.Flags().Parse(sim.NormalizeArgs(args)); err != nil {
				return cmd.FlagErrorFunc()(cmd, err)
			}
			if help, _ := cmd.Flags().GetBool("help"); help {
				return cmd.Help()
			}
			args = cmd.Flags().Args()
			cfg, err := flags.Resolve()
			if err != nil {
				return err
			}
			if m, _ := cmd.Flags().GetString("model"); len(args) == 0 && m != "" {
				args = []string{m} // vllm serve --model M
			}
			switch {
			case len(args) == 0:
				return errors.New("sim serve: MODEL is required")
			case len(args) > 1:
				return fmt.Errorf("unrecognized arguments: %s", strings.Join(args[1:], " "))
			}
			cfg.Model = args[0]
			log, err := newLogger(cmd)
			if err != nil {
				return err
			}
			cfg.PythonHashSeed = os.Getenv("PYTHONHASHSEED")
			switch strings.ToLower(strings.TrimSpace(os.Getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING"))) {
			case "1", "true":
				cfg.AllowRuntimeLoRAUpdating = true
			}
			if v := strings.TrimSpace(os.Getenv("VLLM_SERVER_DEV_MODE")); v != "" {
				// vLLM reads it as bool(int(...)): anything else stops it.
				n, err := strconv.Atoi(v)
				if err != nil {
					return fmt.Errorf("VLLM_SERVER_DEV_MODE: %q: must be an integer (1: dev mode)", v)
				}
				cfg.DevMode = n != 0
			}
			switch strings.ToLower(strings.TrimSpace(os.Getenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"))) {
			case "0", "false":
				cfg.KVEventsBytesHashes = true
			}
			if err := applyFaultsEnv(cmd, &cfg.Faults); err != nil {
				return err
			}
			srv, err := sim.New(cfg, log)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
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
	flags = sim.NewFlags(cmd.Flags())
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		// vLLM's argparse words it so, naming the flag.
		msg := err.Error()
		for _, p := range []string{"unknown flag: ", "unknown shorthand flag: "} {
			if rest, ok := strings.CutPrefix(msg, p); ok {
				if i := strings.LastIndex(rest, " in "); i >= 0 {
					rest = rest[i+4:]
				}
				return fmt.Errorf("unrecognized arguments: %s", rest)
			}
		}
		return err
	})
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
