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

// issue18 is the reference sweep of issue 18: vLLM v0.23.0 on one L4,
// Qwen2.5-0.5B-Instruct, 256 in / 128 out with --ignore-eos, closed loop.
var issue18 = []struct {
	c                  int
	outTokS, ttft, itl float64
}{
	{1, 168, 27.0, 5.1},
	{2, 367, 37.8, 5.2},
	{4, 698, 50.1, 5.3},
	{8, 1312, 60.9, 5.5},
	{16, 2277, 103.8, 6.0},
	{32, 3773, 135.3, 7.1},
}

// fitPoint is one calibration tried, with its errors against issue18.
type fitPoint struct {
	cal   sim.Calibration
	worst float64
	// ttftErr, tputErr, itlErr are per concurrency, in issue18's order,
	// each the mean over the seeds; worst is the worst single seed's cell.
	ttftErr, tputErr, itlErr []float64
}

// fit grids the calibration's compute efficiency and the API server's
// overhead and serialized part over the issue-18 sweep in virtual time,
// scoring each by its worst relative error over out tok/s, TTFT p50 and
// ITL p50 at every concurrency and seed, and prints the best top.
func fit(cfg sim.Config, perLevel, seeds, top int, effs, overheads, serials, jitters []float64) error {
	var points []fitPoint
	for _, ce := range effs {
		for _, ovMs := range overheads {
			for _, serMs := range serials {
				for _, jitMs := range jitters {
					cal := sim.DefaultCalibration
					cal.RequestJitter = time.Duration(jitMs * float64(time.Millisecond))
					cal.ComputeEfficiency = ce
					cal.RequestOverhead = time.Duration(ovMs * float64(time.Millisecond))
					cal.RequestSerial = time.Duration(serMs * float64(time.Millisecond))
					p, err := score(cfg, cal, perLevel, seeds)
					if err != nil {
						return err
					}
					points = append(points, p)
				}
			}
		}
	}
	slices.SortStableFunc(points, func(a, b fitPoint) int { return cmp.Compare(a.worst, b.worst) })
	fmt.Println("| compute eff. | request overhead | serialized | jitter ± | worst error | TTFT p50 error at c = 1 / 2 / 4 / 8 / 16 / 32 | out tok/s error | ITL p50 error |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for _, p := range points[:min(top, len(points))] {
		fmt.Printf("| %.2f | %v | %v | %v | %.0f %% | %s | %s | %s |\n", p.cal.ComputeEfficiency, p.cal.RequestOverhead,
			p.cal.RequestSerial, p.cal.RequestJitter, 100*p.worst, pcts(p.ttftErr), pcts(p.tputErr), pcts(p.itlErr))
	}
	return nil
}

// score runs the sweep for one calibration over seeds 1..seeds.
func score(cfg sim.Config, cal sim.Calibration, perLevel, seeds int) (fitPoint, error) {
	p := fitPoint{cal: cal, ttftErr: make([]float64, len(issue18)), tputErr: make([]float64, len(issue18)),
		itlErr: make([]float64, len(issue18))}
	for i, ref := range issue18 {
		for seed := 1; seed <= seeds; seed++ {
			r, err := sim.SimulateClosedLoop(cfg, sim.ClosedLoop{Concurrency: ref.c, InputTokens: 256, OutputTokens: 128,
				Requests: ref.c * perLevel, Seed: uint64(seed), Calibration: &cal})
			if err != nil {
				return p, err
			}
			errs := []float64{r.TTFT.P50/ref.ttft - 1, r.OutputTokensPerS/ref.outTokS - 1, r.ITL.P50/ref.itl - 1}
			p.ttftErr[i] += errs[0] / float64(seeds)
			p.tputErr[i] += errs[1] / float64(seeds)
			p.itlErr[i] += errs[2] / float64(seeds)
			for _, e := range errs {
				p.worst = math.Max(p.worst, math.Abs(e))
			}
		}
	}
	return p, nil
}

func pcts(xs []float64) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprintf("%+.0f", 100*x)
	}
	return strings.Join(s, " / ") + " %"
}
