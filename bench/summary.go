package bench

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// A comparison over several seeds (issue 14, item 5): one seed's hit share
// moves with how the groups happen to hash over the replicas, so a policy is
// better only if it is better on the mean and seed by seed. SeedSummary
// gives both: each target's mean and range, and for each pair of targets
// how many seeds each won.

// Spread is a measure over the seeds.
type Spread struct {
	Mean float64 `json:"mean"`
	Min  float64 `json:"min"`
	Max  float64 `json:"max"`
	// N is how many seeds had the measure (a ceiling may be missing).
	N int `json:"n"`
}

func spreadOf(xs []float64) Spread {
	if len(xs) == 0 {
		return Spread{}
	}
	s := Spread{Min: xs[0], Max: xs[0], N: len(xs)}
	for _, x := range xs {
		s.Mean += x
		s.Min, s.Max = min(s.Min, x), max(s.Max, x)
	}
	s.Mean /= float64(len(xs))
	return s
}

// TargetSummary is one target (label) over the seeds.
type TargetSummary struct {
	Label  string `json:"label"`
	Seeds  int    `json:"seeds"`
	Errors int    `json:"errors"`
	// Measures by the keys of summaryMeasures.
	Measures map[string]Spread `json:"measures"`
}

// PairWins counts, for targets A and B, the seeds on which each did better
// on a measure (higher hit share, lower latency); ties count for neither.
type PairWins struct {
	A       string `json:"a"`
	B       string `json:"b"`
	Measure string `json:"measure"`
	AWins   int    `json:"a_wins"`
	BWins   int    `json:"b_wins"`
	Ties    int    `json:"ties"`
}

// SeedSummary is Result.Summary.
type SeedSummary struct {
	Seeds   []uint64        `json:"seeds"`
	Targets []TargetSummary `json:"targets"`
	Wins    []PairWins      `json:"wins"`
}

// summaryMeasure is one line of the summary: how to read it from a report
// and which way is better.
type summaryMeasure struct {
	key, name    string
	get          func(Report) (float64, bool)
	higherBetter bool
	ms           bool
}

func always(f func(Report) float64) func(Report) (float64, bool) {
	return func(r Report) (float64, bool) { return f(r), true }
}

func optional(f func(Report) *float64) func(Report) (float64, bool) {
	return func(r Report) (float64, bool) {
		if p := f(r); p != nil {
			return *p, true
		}
		return 0, false
	}
}

// summaryMeasures are the measures the must-show criteria read, in order.
var summaryMeasures = []summaryMeasure{
	{key: "cache_hit_share", name: "hit share", get: always(func(r Report) float64 { return r.CacheHitShare }), higherBetter: true},
	{key: "cache_hit_ceiling", name: "ceiling", get: optional(func(r Report) *float64 { return r.CacheHitCeiling }), higherBetter: true},
	{key: "hit_over_ceiling", name: "hit/ceiling", get: optional(func(r Report) *float64 { return r.HitOverCeiling }), higherBetter: true},
	{key: "ttft_p50_seconds", name: "ttft p50", get: always(func(r Report) float64 { return r.TTFT.P50 }), ms: true},
	{key: "ttft_p90_seconds", name: "ttft p90", get: always(func(r Report) float64 { return r.TTFT.P90 }), ms: true},
	{key: "itl_p50_seconds", name: "itl p50", get: always(func(r Report) float64 { return r.ITL.P50 }), ms: true},
	{key: "e2e_p90_seconds", name: "e2e p90", get: always(func(r Report) float64 { return r.E2E.P90 }), ms: true},
}

// winMeasures are the measures counted seed by seed (the ceiling is the
// workload's, not the target's, so it wins nothing).
var winMeasures = []string{"cache_hit_share", "hit_over_ceiling", "ttft_p50_seconds", "ttft_p90_seconds"}

// SummarizeSeeds summarizes runs by label over their seeds. Targets keep
// the order of their first run; seeds the order they first appear.
func SummarizeSeeds(runs []Report) *SeedSummary {
	s := &SeedSummary{}
	var labels []string
	byLabel := map[string]map[uint64]Report{}
	for _, r := range runs {
		if !slices.Contains(s.Seeds, r.Seed) {
			s.Seeds = append(s.Seeds, r.Seed)
		}
		if byLabel[r.Label] == nil {
			labels = append(labels, r.Label)
			byLabel[r.Label] = map[uint64]Report{}
		}
		byLabel[r.Label][r.Seed] = r
	}
	for _, l := range labels {
		ts := TargetSummary{Label: l, Seeds: len(byLabel[l]), Measures: map[string]Spread{}}
		for _, m := range summaryMeasures {
			var xs []float64
			for _, seed := range s.Seeds {
				r, ok := byLabel[l][seed]
				if !ok {
					continue
				}
				if v, ok := m.get(r); ok {
					xs = append(xs, v)
				}
			}
			if len(xs) > 0 {
				ts.Measures[m.key] = spreadOf(xs)
			}
		}
		for _, r := range byLabel[l] {
			ts.Errors += r.Errors
		}
		s.Targets = append(s.Targets, ts)
	}
	for i, a := range labels {
		for _, b := range labels[i+1:] {
			for _, key := range winMeasures {
				m := measureByKey(key)
				w := PairWins{A: a, B: b, Measure: key}
				for _, seed := range s.Seeds {
					ra, okA := byLabel[a][seed]
					rb, okB := byLabel[b][seed]
					if !okA || !okB {
						continue
					}
					va, okA := m.get(ra)
					vb, okB := m.get(rb)
					switch {
					case !okA || !okB:
					case va == vb:
						w.Ties++
					case (va > vb) == m.higherBetter:
						w.AWins++
					default:
						w.BWins++
					}
				}
				s.Wins = append(s.Wins, w)
			}
		}
	}
	return s
}

func measureByKey(key string) summaryMeasure {
	for _, m := range summaryMeasures {
		if m.key == key {
			return m
		}
	}
	panic("bench: no summary measure " + key)
}

// Table lays the summary out as Result.Table does: a row per measure, a
// column per target, each cell "mean (min–max)"; then a row per pair of
// targets and measure with the seeds each won, "a 8-2 b".
func (s *SeedSummary) Table() (header []string, rows [][]string) {
	header = []string{"SUMMARY"}
	for _, t := range s.Targets {
		header = append(header, t.Label)
	}
	line := []string{"seeds"}
	for _, t := range s.Targets {
		line = append(line, strconv.Itoa(t.Seeds))
	}
	rows = append(rows, line)
	line = []string{"errors"}
	for _, t := range s.Targets {
		line = append(line, strconv.Itoa(t.Errors))
	}
	rows = append(rows, line)
	for _, m := range summaryMeasures {
		name := m.name
		if m.ms {
			name += " (ms)"
		}
		line := []string{name + " mean (range)"}
		for _, t := range s.Targets {
			sp, ok := t.Measures[m.key]
			if !ok {
				line = append(line, "-")
				continue
			}
			line = append(line, fmtSpread(sp, m.ms))
		}
		rows = append(rows, line)
	}
	for _, w := range s.Wins {
		line := []string{measureByKey(w.Measure).name + " wins"}
		cell := fmt.Sprintf("%s %d-%d %s", w.A, w.AWins, w.BWins, w.B)
		if w.Ties > 0 {
			cell += fmt.Sprintf(" (%d ties)", w.Ties)
		}
		line = append(line, cell)
		for range len(s.Targets) - 1 {
			line = append(line, "")
		}
		rows = append(rows, line)
	}
	return header, rows
}

// fmtSpread is "0.421 (0.401–0.440)" or, for seconds shown as
// milliseconds, "354.2 (320.1–401.0)".
func fmtSpread(s Spread, ms bool) string {
	if ms {
		return fmt.Sprintf("%.1f (%.1f–%.1f)", s.Mean*1000, s.Min*1000, s.Max*1000)
	}
	return fmt.Sprintf("%.3f (%.3f–%.3f)", s.Mean, s.Min, s.Max)
}

// ParseSeeds reads --seeds: a count N (seeds first, first+1, ...,
// first+N-1), a list "1,4,7", or a range "1-10" (both ends included).
func ParseSeeds(s string, first uint64) ([]uint64, error) {
	var out []uint64
	bad := func(err error) ([]uint64, error) {
		return nil, fmt.Errorf("--seeds %q: want a count (10), a list (1,4,7) or a range (1-10): %w", s, err)
	}
	if !strings.ContainsAny(s, ",-") {
		n, err := strconv.Atoi(s)
		if err != nil {
			return bad(err)
		}
		if n < 1 || n > maxSeeds {
			return bad(fmt.Errorf("a count must be 1 to %d", maxSeeds))
		}
		for i := range n {
			out = append(out, first+uint64(i))
		}
		return out, nil
	}
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.ParseUint(lo, 10, 64)
		if err != nil {
			return bad(err)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseUint(hi, 10, 64); err != nil {
				return bad(err)
			}
			if b < a || b-a >= maxSeeds {
				return bad(fmt.Errorf("range %d-%d: want low ≤ high and at most %d seeds", a, b, maxSeeds))
			}
		}
		for v := a; v <= b; v++ {
			if slices.Contains(out, v) {
				return bad(fmt.Errorf("seed %d twice", v))
			}
			out = append(out, v)
			if len(out) > maxSeeds {
				return bad(fmt.Errorf("more than %d seeds", maxSeeds))
			}
		}
	}
	return out, nil
}

// maxSeeds bounds --seeds: a thousand runs of one comparison is a typo.
const maxSeeds = 1000
