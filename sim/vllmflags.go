package sim

import (
	"strings"

	"github.com/spf13/pflag"
)

// vLLM's `vllm serve` flags (design §8 "Strict flags"), so the simulator
// refuses what vLLM would refuse and accepts what it accepts. Taken from
// vllm/engine/arg_utils.py (EngineArgs.add_cli_args, AsyncEngineArgs) and
// vllm/entrypoints/openai/cli_args.py (make_arg_parser, FrontendArgs,
// BaseFrontendArgs) in the stored copies of upstream. The kind decides how
// argparse reads the flag:
//
//   - optionalBool flags are argparse.BooleanOptionalAction (every bool
//     config field): --x and --no-x;
//   - storeTrue flags are action="store_true": --x only;
//   - value flags take one value (--x v or --x=v);
//   - list flags are nargs="+": one or more values (--x a b);
//   - --hf-token is nargs="?": a value or none.
//
// Flags the simulator uses are registered with their meaning (Flags);
// every other one is accepted and ignored.
var (
	vllmOptionalBool = fields(`
		trust-remote-code enforce-eager disable-sliding-window disable-cascade-attn skip-tokenizer-init
		enable-prompt-embeds enable-sleep-mode use-tqdm-on-load data-parallel-hybrid-lb
		data-parallel-multi-port-external-lb enable-expert-parallel enable-dbo
		disable-nccl-for-dp-synchronization enable-eplb eplb-log-balancedness ray-workers-use-nsight
		disable-custom-all-reduce enable-prefix-caching calculate-kv-scales kv-sharing-fast-prefill
		enable-mm-embeds interleave-mm-strings skip-mm-profiling enable-lora fully-sharded-loras
		enable-chunked-prefill disable-chunked-mm-input disable-hybrid-kv-cache-manager async-scheduling
		enable-log-requests trust-request-chat-template return-tokens-as-token-ids enable-auto-tool-choice
		exclude-tools-when-tool-choice-none enable-prompt-tokens-details enable-per-request-metrics
		enable-server-load-tracking enable-force-include-usage enable-tokenizer-info-endpoint
		enable-log-outputs enable-log-deltas cohere-is-reasoning-model log-error-stack tokens-only
		disable-uvicorn-access-log allow-credentials enable-ssl-refresh enable-request-id-headers
		disable-fastapi-docs enable-offline-docs enable-flash-late-interaction`)
	vllmStoreTrue = fields(`
		enable-multimodal-encoder-data-parallel disable-mm-preprocessor-cache disable-log-stats
		aggregate-engine-logging disable-log-requests headless grpc`)
	vllmValue = fields(`
		model runner convert task tokenizer tokenizer-mode dtype seed hf-config-path
		allowed-local-media-path revision code-revision rope-scaling rope-theta tokenizer-revision
		max-model-len quantization max-logprobs logprobs-mode config-format hf-overrides pooler-config
		override-pooler-config logits-processor-pattern generation-config override-generation-config
		model-impl override-attention-dtype io-processor-plugin
		load-format download-dir safetensors-load-strategy model-loader-extra-config pt-load-map-location
		reasoning-parser guided-decoding-backend guided-decoding-disable-fallback
		guided-decoding-disable-any-whitespace guided-decoding-disable-additional-properties
		distributed-executor-backend pipeline-parallel-size tensor-parallel-size
		decode-context-parallel-size data-parallel-size data-parallel-rank data-parallel-start-rank
		data-parallel-size-local data-parallel-address data-parallel-rpc-port data-parallel-backend
		all2all-backend dbo-decode-token-threshold dbo-prefill-token-threshold eplb-config
		expert-placement-strategy num-redundant-experts eplb-window-size eplb-step-interval
		max-parallel-loading-workers worker-cls worker-extension-cls
		block-size gpu-memory-utilization kv-cache-memory-bytes swap-space kv-cache-dtype
		num-gpu-blocks-override prefix-caching-hash-algo cpu-offload-gb mamba-cache-dtype
		mamba-ssm-cache-dtype mamba-block-size
		limit-mm-per-prompt media-io-kwargs mm-processor-kwargs mm-processor-cache-gb
		mm-processor-cache-type mm-shm-cache-max-object-size-mb mm-encoder-tp-mode
		mm-encoder-attn-backend video-pruning-rate
		max-loras max-lora-rank lora-extra-vocab-size lora-dtype max-cpu-loras default-mm-loras
		show-hidden-metrics-for-version otlp-traces-endpoint
		max-num-batched-tokens max-num-seqs max-num-partial-prefills max-long-partial-prefills
		long-prefill-token-threshold num-lookahead-slots scheduling-policy scheduler-cls
		max-cudagraph-capture-size speculative-config kv-transfer-config kv-events-config
		compilation-config additional-config structured-outputs-config
		api-server-count config
		chat-template chat-template-content-format default-chat-template-kwargs response-role
		tool-call-parser tool-parser-plugin tool-server log-config-file max-log-len cohere-format
		fingerprint-mode fingerprint-value
		host port data-parallel-supervisor-port dp-supervisor-probe-interval-s
		dp-supervisor-probe-timeout-s dp-supervisor-probe-failure-threshold uds uvicorn-log-level
		disable-access-log-for-endpoints allowed-origins allowed-methods allowed-headers
		ssl-keyfile ssl-certfile ssl-ca-certs ssl-cert-reqs ssl-ciphers root-path middleware
		h11-max-incomplete-event-size h11-max-header-count`)
	vllmList = fields(`
		allowed-media-domains served-model-name logits-processors ignore-patterns
		collect-detailed-traces cudagraph-capture-sizes cuda-graph-sizes lora-modules api-key`)
	vllmOptionalValue = fields(`hf-token`)
	// vllmShort are argparse's single-dash aliases.
	vllmShort = map[string]string{
		"-q": "quantization", "-pp": "pipeline-parallel-size", "-tp": "tensor-parallel-size",
		"-dcp": "decode-context-parallel-size", "-dp": "data-parallel-size", "-dpn": "data-parallel-rank",
		"-dpr": "data-parallel-start-rank", "-dpl": "data-parallel-size-local",
		"-dpa": "data-parallel-address", "-dpp": "data-parallel-rpc-port", "-dpb": "data-parallel-backend",
		"-asc": "api-server-count", "-O": "compilation-config",
	}
)

func fields(s string) map[string]bool {
	m := make(map[string]bool)
	for _, f := range strings.Fields(s) {
		m[f] = true
	}
	return m
}

// NormalizeArgs rewrites a `vllm serve` argv into the form pflag reads, as
// vLLM's FlexibleArgumentParser and argparse read it: underscores in flag
// names become dashes, single-dash aliases (-tp 2, -O3) become long flags,
// and the values of nargs="+" and nargs="?" flags are attached, one
// --flag=value each.
func NormalizeArgs(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		if long, ok := vllmShort[a]; ok {
			a = "--" + long
		} else if strings.HasPrefix(a, "-O") && len(a) > 2 && !strings.HasPrefix(a, "--") {
			a = "--compilation-config=" + strings.TrimPrefix(a[2:], "=")
		}
		if !strings.HasPrefix(a, "--") {
			out = append(out, a)
			continue
		}
		name, value, hasValue := strings.Cut(a[2:], "=")
		name = strings.ReplaceAll(name, "_", "-")
		flag := "--" + name
		switch {
		case hasValue:
			out = append(out, flag+"="+value)
		case vllmList[name]:
			n := 0
			for i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				i++
				n++
				out = append(out, flag+"="+args[i])
			}
			if n == 0 {
				out = append(out, flag) // pflag reports the missing value
			}
		case vllmOptionalValue[name]:
			if i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				i++
				out = append(out, flag+"="+args[i])
			} else {
				out = append(out, flag)
			}
		default:
			out = append(out, flag)
		}
	}
	return out
}

// negation is a --no-X flag: setting it sets X to false.
type negation struct{ target *pflag.Flag }

func (n negation) String() string { return "false" }
func (n negation) Type() string   { return "bool" }
func (n negation) Set(v string) error {
	if v != "true" {
		return nil
	}
	return n.target.Value.Set("false")
}
func (n negation) IsBoolFlag() bool { return true }

// registerVLLMFlags adds every vLLM flag fs does not define yet as an
// accepted, ignored, hidden one, and a --no-X for every BooleanOptionalAction
// flag, those the simulator uses included.
func registerVLLMFlags(fs *pflag.FlagSet) {
	hide := func(name string) { _ = fs.MarkHidden(name) }
	for name := range vllmOptionalBool {
		if fs.Lookup(name) == nil {
			fs.Bool(name, false, "vLLM flag, accepted and ignored")
			hide(name)
		}
		if no := "no-" + name; fs.Lookup(no) == nil {
			fs.Var(negation{fs.Lookup(name)}, no, "vLLM flag: --"+name+"=false")
			fs.Lookup(no).NoOptDefVal = "true"
			hide(no)
		}
	}
	for name := range vllmStoreTrue {
		if fs.Lookup(name) == nil {
			fs.Bool(name, false, "vLLM flag, accepted and ignored")
			hide(name)
		}
	}
	for _, set := range []map[string]bool{vllmValue, vllmOptionalValue} {
		for name := range set {
			if fs.Lookup(name) == nil {
				fs.String(name, "", "vLLM flag, accepted and ignored")
				hide(name)
			}
		}
	}
	for name := range vllmOptionalValue {
		fs.Lookup(name).NoOptDefVal = "True"
	}
	for name := range vllmList {
		if fs.Lookup(name) == nil {
			fs.StringArray(name, nil, "vLLM flag, accepted and ignored")
			hide(name)
		}
	}
}
