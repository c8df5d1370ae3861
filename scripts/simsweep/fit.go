package main

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/llmgw/llmgw/sim"
)

// refSweep is one published concurrency sweep of vLLM (docs/benchmarks.md
// "Concurrency fidelity (issue 32)" cites each): the setup the simulator
// reproduces and the cells it is scored on.
type refSweep struct {
	name, source string
	gpu, model   string
	util         float64
	maxLen       int
	// in is the prompt; out the output, or with outMin set a uniform draw
	// from [outMin, out] (a sweep without --ignore-eos: its measured mean
	// output is (outMin+out)/2).
	in, outMin, out int
	cells           []refCell
}

// refCell is one concurrency's published figures; 0 is "not published".
// gain is output tok/s relative to the sweep's first cell, for a source
// that publishes only the ratio.
type refCell struct {
	c                        int
	outTokS, ttft, itl, gain float64
	// unfitted cells are reported, not scored (docs/benchmarks.md says
	// why for each).
	unfitted bool
}

// references are the sweeps --fit scores on, all at once.
var references = []refSweep{
	{
		name:   "l4-qwen2.5-0.5b",
		source: "https://ai.wmx.dev/benchmarks (vLLM v0.23.0, 256/128, --ignore-eos)",
		gpu:    "l4", model: "Qwen/Qwen2.5-0.5B-Instruct", util: 0.6, maxLen: 8192, in: 256, out: 128,
		cells: []refCell{
			{c: 1, outTokS: 168, ttft: 27.0, itl: 5.1},
			{c: 2, outTokS: 367, ttft: 37.8, itl: 5.2},
			{c: 4, outTokS: 698, ttft: 50.1, itl: 5.3},
			{c: 8, outTokS: 1312, ttft: 60.9, itl: 5.5},
			{c: 16, outTokS: 2277, ttft: 103.8, itl: 6.0},
			{c: 32, outTokS: 3773, ttft: 135.3, itl: 7.1},
		},
	},
	{
		name: "rtx4090-mistral-7b",
		source: "https://mushfiqrahman.dev/benchmarking-mistral-7b-on-rtx-4090-vllm-concurrency-latency-and-capacity-planning/ " +
			"(256 in, max 128 out without --ignore-eos: 100 out on average)",
		gpu: "rtx4090", model: "mistralai/Mistral-7B-Instruct-v0.3", util: 0.9, maxLen: 32768, in: 256, outMin: 72, out: 128,
		cells: []refCell{
			{c: 4, outTokS: 210, ttft: 53},
			{c: 8, outTokS: 377, ttft: 55},
			{c: 16, outTokS: 644, ttft: 97, unfitted: true},
			{c: 32, outTokS: 975, ttft: 277, unfitted: true},
			{c: 48, outTokS: 1190, ttft: 840, unfitted: true},
		},
	},
	{
		name:   "a100-40gb-llama-3.1-8b",
		source: "https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on (vLLM 0.23.0, 1024/128, --ignore-eos; figures from its text)",
		gpu:    "a100-40gb", model: "meta-llama/Llama-3.1-8B-Instruct", util: 0.9, maxLen: 16384, in: 1024, out: 128,
		cells: []refCell{
			{c: 1, itl: 1000.0 / 75}, // "decode at one request ... about 75 tokens/sec"
			{c: 8, gain: 6.6},        // "a 6.6x gain" in output throughput from 1 to 8
		},
	},
}

// cellErr is one published figure against the simulated one, relative
// error; kind is "out tok/s", "TTFT p50", "ITL p50" or "gain".
type cellErr struct {
	sweep, kind string
	c           int
	ref, sim    float64
	err         float64
	unfitted    bool
}

// fitPoint is one calibration tried, with its errors.
type fitPoint struct {
	cal sim.Calibration
	// frontEnd is the request overhead of the hosts with their own.
	frontEnd time.Duration
	worst    float64
	// errs are the means over the seeds; worst is the worst single seed's
	// cell.
	errs []cellErr
}

// grid is the calibration values --fit tries.
type grid struct {
	computeEff, smallGEMM, overheadMs, serialMs, jitterMs, clockDerate, tailMs, frontEndMs []float64
}

// fit grids the calibration over every reference sweep at once in virtual
// time, scoring each point by its worst relative error over every
// published cell and seed, prints the best top, then every cell of the
// best.
func fit(sweeps []refSweep, perLevel, seeds, top int, g grid) error {
	ms := func(x float64) time.Duration { return time.Duration(x * float64(time.Millisecond)) }
	axes := []struct {
		values []float64
		set    func(*sim.Calibration, float64)
	}{
		{g.clockDerate, func(c *sim.Calibration, x float64) { c.ClockDerate = x }},
		{g.computeEff, func(c *sim.Calibration, x float64) { c.ComputeEfficiency = x }},
		{g.smallGEMM, func(c *sim.Calibration, x float64) { c.SmallGEMMHidden = x }},
		{g.overheadMs, func(c *sim.Calibration, x float64) { c.RequestOverhead = ms(x) }},
		{g.serialMs, func(c *sim.Calibration, x float64) { c.RequestSerial = ms(x) }},
		{g.jitterMs, func(c *sim.Calibration, x float64) { c.RequestJitter = ms(x) }},
		{g.tailMs, func(c *sim.Calibration, x float64) { c.RequestTail = ms(x) }},
	}
	// The front end of the hosts whose profile has its own
	// (sim.GPUProfile.FrontEnd); the overhead axis is the calibration's,
	// every other host's.
	var fe time.Duration
	axes = append(axes, struct {
		values []float64
		set    func(*sim.Calibration, float64)
	}{g.frontEndMs, func(_ *sim.Calibration, x float64) { fe = ms(x) }})
	// Every combination: idx counts in mixed radix over the axes.
	var points []fitPoint
	idx := make([]int, len(axes))
	for {
		cal := sim.DefaultCalibration
		for i, a := range axes {
			a.set(&cal, a.values[idx[i]])
		}
		p, err := score(sweeps, cal, fe, perLevel, seeds)
		if err != nil {
			return err
		}
		points = append(points, p)
		i := len(axes) - 1
		for ; i >= 0; i-- {
			if idx[i]++; idx[i] < len(axes[i].values) {
				break
			}
			idx[i] = 0
		}
		if i < 0 {
			break
		}
	}
	slices.SortStableFunc(points, func(a, b fitPoint) int { return cmp.Compare(a.worst, b.worst) })
	fmt.Println("| clock derate | compute eff. | small-GEMM hidden | request overhead | own front ends | serialized | jitter ± | exp. tail | worst error (any seed) | worst mean error |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	for _, p := range points[:min(top, len(points))] {
		var worstMean float64
		for _, e := range p.errs {
			if e.unfitted {
				continue
			}
			worstMean = math.Max(worstMean, math.Abs(e.err))
		}
		fmt.Printf("| %.2f | %.2f | %.0f | %v | %v | %v | %v | %v | %.0f %% | %.0f %% |\n", p.cal.ClockDerate, p.cal.ComputeEfficiency, p.cal.SmallGEMMHidden,
			p.cal.RequestOverhead, p.frontEnd, p.cal.RequestSerial, p.cal.RequestJitter, p.cal.RequestTail, 100*p.worst, 100*worstMean)
	}
	fmt.Println()
	printCells(points[0])
	return nil
}

// printCells prints every published cell of one point: reference,
// simulated (mean over the seeds), error.
func printCells(p fitPoint) {
	fmt.Println("| sweep | C | figure | published | simulated | error |")
	fmt.Println("|---|---|---|---|---|---|")
	for _, e := range p.errs {
		note := ""
		if e.unfitted {
			note = " (not fitted)"
		}
		fmt.Printf("| %s | %d | %s | %.4g | %.4g | %+.0f %%%s |\n", e.sweep, e.c, e.kind, e.ref, e.sim, 100*e.err, note)
	}
}

// score runs every sweep for one calibration over seeds 1..seeds.
func score(sweeps []refSweep, cal sim.Calibration, frontEnd time.Duration, perLevel, seeds int) (fitPoint, error) {
	p := fitPoint{cal: cal, frontEnd: frontEnd}
	for _, sw := range sweeps {
		cfg := sim.DefaultConfig()
		cfg.Model, cfg.GPU, cfg.GPUMemoryUtilization, cfg.MaxModelLen = sw.model, sw.gpu, sw.util, sw.maxLen
		if prof, ok := sim.LookupGPU(sw.gpu); ok && prof.FrontEnd > 0 {
			cfg.RequestOverhead = frontEnd
		}
		type acc struct{ tput, ttft, itl, gain float64 }
		means := make([]acc, len(sw.cells))
		for seed := 1; seed <= seeds; seed++ {
			var first float64
			for i, ref := range sw.cells {
				r, err := sim.SimulateClosedLoop(cfg, sim.ClosedLoop{Concurrency: ref.c, InputTokens: sw.in,
					OutputTokens: sw.out, OutputTokensMin: sw.outMin, Requests: ref.c * perLevel,
					Seed: uint64(seed), Calibration: &cal})
				if err != nil {
					return p, fmt.Errorf("%s c=%d: %w", sw.name, ref.c, err)
				}
				if i == 0 {
					first = r.OutputTokensPerS
				}
				got := acc{r.OutputTokensPerS, r.TTFT.P50, r.ITL.P50, r.OutputTokensPerS / first}
				for _, pair := range [][2]float64{{ref.outTokS, got.tput}, {ref.ttft, got.ttft}, {ref.itl, got.itl}, {ref.gain, got.gain}} {
					if pair[0] > 0 && !ref.unfitted {
						p.worst = math.Max(p.worst, math.Abs(pair[1]/pair[0]-1))
					}
				}
				means[i].tput += got.tput / float64(seeds)
				means[i].ttft += got.ttft / float64(seeds)
				means[i].itl += got.itl / float64(seeds)
				means[i].gain += got.gain / float64(seeds)
			}
		}
		for i, ref := range sw.cells {
			m := means[i]
			for _, f := range []struct {
				kind     string
				ref, sim float64
			}{{"out tok/s", ref.outTokS, m.tput}, {"TTFT p50 ms", ref.ttft, m.ttft}, {"ITL p50 ms", ref.itl, m.itl},
				{"out tok/s ÷ first cell's", ref.gain, m.gain}} {
				if f.ref > 0 {
					p.errs = append(p.errs, cellErr{sweep: sw.name, kind: f.kind, c: ref.c, ref: f.ref, sim: f.sim,
						err: f.sim/f.ref - 1, unfitted: ref.unfitted})
				}
			}
		}
	}
	return p, nil
}

// pickSweeps selects references by name; empty is all.
func pickSweeps(names string) ([]refSweep, error) {
	if names == "" {
		return references, nil
	}
	var out []refSweep
	for _, n := range strings.Split(names, ",") {
		i := slices.IndexFunc(references, func(r refSweep) bool { return r.name == strings.TrimSpace(n) })
		if i < 0 {
			all := make([]string, len(references))
			for j, r := range references {
				all[j] = r.name
			}
			return nil, fmt.Errorf("--fit-sweeps: %q: not a reference (%s)", n, strings.Join(all, ", "))
		}
		out = append(out, references[i])
	}
	return out, nil
}
