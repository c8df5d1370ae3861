// Command simsweep predicts a closed-loop concurrency sweep of the GPU-timed
// simulator in virtual time (sim.SimulateClosedLoop: the server's own
// scheduler, cache and roofline, no waiting), and compares a sweep with a
// reference table. scripts/sim-sweep.sh runs the real one over HTTP. With
// --fit it grids the calibration against several published vLLM sweeps at
// once instead — different GPUs and model sizes (fit.go's references) —
// and reports every published cell's error (docs/benchmarks.md
// "Concurrency fidelity (issue 32)", how the constants were chosen).
//
//	go run ./scripts/simsweep --gpu l4 --model Qwen/Qwen2.5-0.5B-Instruct --gpu-memory-utilization 0.6
//	go run ./scripts/simsweep --fit --requests-per-client 20 --seeds 4
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/llmgw/llmgw/sim"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "simsweep:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("simsweep", flag.ContinueOnError)
	gpu := fs.String("gpu", "l4", "GPU profile")
	model := fs.String("model", "Qwen/Qwen2.5-0.5B-Instruct", "model id (its built-in shape)")
	util := fs.Float64("gpu-memory-utilization", 0.9, "vLLM's --gpu-memory-utilization")
	maxLen := fs.Int("max-model-len", 8192, "vLLM's --max-model-len")
	batched := fs.Int("max-num-batched-tokens", 0, "token budget (0: vLLM's default)")
	seqs := fs.Int("max-num-seqs", 0, "max_num_seqs (0: vLLM's default)")
	conc := fs.String("concurrency", "1,2,4,8,16,32", "comma-separated concurrencies")
	in := fs.Int("input-tokens", 256, "prompt tokens")
	out := fs.Int("output-tokens", 128, "output tokens (ignore_eos)")
	outMin := fs.Int("output-tokens-min", 0, "with it, each request's output is a uniform draw from [min, --output-tokens] (a sweep without ignore_eos)")
	perLevel := fs.Int("requests-per-client", 10, "requests per client at each concurrency")
	doFit := fs.Bool("fit", false, "grid the calibration against the published sweeps (fit.go's references; --gpu, --model and the shape flags are theirs)")
	sweeps := fs.String("fit-sweeps", "", "with --fit: comma-separated reference names (default all)")
	gemms := fs.String("fit-small-gemm", "1024", "with --fit: small-GEMM hidden sizes to try")
	tails := fs.String("fit-tail-ms", "0", "with --fit: exponential tails (means) of the request overhead to try, ms")
	fronts := fs.String("fit-front-end-ms", "12", "with --fit: request overheads to try for the hosts whose profile has its own (sim.GPUProfile.FrontEnd), ms")
	derates := fs.String("fit-clock-derate", "0", "with --fit: clock derates (exponents of base/boost) to try")
	seeds := fs.Int("seeds", 1, "with --fit: seeds per concurrency (the score is the worst)")
	top := fs.Int("top", 12, "with --fit: rows to print, best first")
	effs := fs.String("fit-compute-eff", "0.5,0.55,0.6,0.66", "with --fit: compute efficiencies to try")
	ovs := fs.String("fit-overhead-ms", "18,20,22,24", "with --fit: request overheads to try, ms")
	sers := fs.String("fit-serial-ms", "0,0.5,1,1.5,2,3", "with --fit: serialized parts to try, ms")
	jits := fs.String("fit-jitter-ms", "0,1,2,4", "with --fit: request jitters (±) to try, ms")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg := sim.DefaultConfig()
	cfg.Model, cfg.GPU, cfg.GPUMemoryUtilization, cfg.MaxModelLen = *model, *gpu, *util, *maxLen
	cfg.MaxNumBatchedTokens, cfg.MaxNumSeqs = *batched, *seqs
	if *doFit {
		var lists [8][]float64
		for i, list := range []string{*effs, *gemms, *ovs, *sers, *jits, *derates, *tails, *fronts} {
			for _, f := range strings.Split(list, ",") {
				x, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
				if err != nil {
					return fmt.Errorf("--fit-*: %q: %w", f, err)
				}
				lists[i] = append(lists[i], x)
			}
		}
		refs, err := pickSweeps(*sweeps)
		if err != nil {
			return err
		}
		return fit(refs, *perLevel, *seeds, *top, grid{lists[0], lists[1], lists[2], lists[3], lists[4], lists[5], lists[6], lists[7]})
	}
	fmt.Println("| concurrency | req/s | out tok/s | TTFT p50 | TTFT p95 | ITL p50 | ITL p95 | E2E p50 | E2E p95 | preemptions |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	for _, c := range strings.Split(*conc, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil {
			return fmt.Errorf("--concurrency: %q: %w", c, err)
		}
		r, err := sim.SimulateClosedLoop(cfg, sim.ClosedLoop{Concurrency: n, InputTokens: *in, OutputTokens: *out,
			OutputTokensMin: *outMin, Requests: n * *perLevel, Seed: uint64(n)})
		if err != nil {
			return err
		}
		fmt.Printf("| %d | %.1f | %.0f | %.1f | %.1f | %.1f | %.1f | %.0f | %.0f | %d |\n", n, r.RequestsPerSecond,
			r.OutputTokensPerS, r.TTFT.P50, r.TTFT.P95, r.ITL.P50, r.ITL.P95, r.E2E.P50, r.E2E.P95, r.Preemptions)
	}
	return nil
}
