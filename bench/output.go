package bench

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Table lays the runs out side by side: one row per measure, one column per
// run, so two routing policies read across a line.
func (res Result) Table() (header []string, rows [][]string) {
	header = []string{"METRIC"}
	for _, r := range res.Runs {
		header = append(header, r.Label)
	}
	row := func(name string, f func(Report) string) {
		line := []string{name}
		for _, r := range res.Runs {
			line = append(line, f(r))
		}
		rows = append(rows, line)
	}
	ms := func(v float64) string { return strconv.FormatFloat(v*1000, 'f', 1, 64) }
	row("workload", func(r Report) string { return r.Workload })
	row("seed", func(r Report) string { return strconv.FormatUint(r.Seed, 10) })
	row("requests", func(r Report) string { return strconv.Itoa(r.Requests) })
	row("errors", func(r Report) string { return errorsCell(r) })
	row("duration (s)", func(r Report) string { return strconv.FormatFloat(r.DurationSeconds, 'f', 2, 64) })
	row("throughput (req/s)", func(r Report) string { return strconv.FormatFloat(r.ThroughputRPS, 'f', 2, 64) })
	row("output tokens/s", func(r Report) string { return strconv.FormatFloat(r.OutputTokensPerSecond, 'f', 1, 64) })
	row("cache hit share", func(r Report) string { return strconv.FormatFloat(r.CacheHitShare, 'f', 3, 64) })
	row("cache hit ceiling", func(r Report) string { return optFloat(r.CacheHitCeiling) })
	row("hit/ceiling", func(r Report) string { return optFloat(r.HitOverCeiling) })
	row("caches", func(r Report) string {
		switch {
		case r.WarmStart && len(r.CacheNotReset) > 0:
			return fmt.Sprintf("WARM (%d tokens), cache not reset", r.WarmCacheTokens)
		case r.WarmStart:
			return fmt.Sprintf("WARM (%d tokens)", r.WarmCacheTokens)
		case len(r.CacheNotReset) > 0:
			return "cache not reset"
		case r.CachesReset:
			return "reset"
		case r.CacheHitCeiling != nil:
			return "cold"
		}
		return "unknown"
	})
	for _, m := range []struct {
		name string
		get  func(Report) Summary
	}{
		{"ttft", func(r Report) Summary { return r.TTFT }},
		{"itl", func(r Report) Summary { return r.ITL }},
		{"e2e", func(r Report) Summary { return r.E2E }},
	} {
		row(m.name+" p50 (ms)", func(r Report) string { return ms(m.get(r).P50) })
		row(m.name+" p90 (ms)", func(r Report) string { return ms(m.get(r).P90) })
		row(m.name+" p99 (ms)", func(r Report) string { return ms(m.get(r).P99) })
		row(m.name+" mean (ms)", func(r Report) string { return ms(m.get(r).Mean) })
		row(m.name+" max (ms)", func(r Report) string { return ms(m.get(r).Max) })
	}
	row("replicas", func(r Report) string { return strconv.Itoa(len(r.Replicas)) })
	row("replica max/mean", func(r Report) string { return strconv.FormatFloat(r.ReplicaMaxOverMean, 'f', 2, 64) })
	row("replica spread", func(r Report) string {
		var parts []string
		for _, n := range r.replicaNames() {
			parts = append(parts, fmt.Sprintf("%s=%d", n, r.Replicas[n]))
		}
		if len(parts) == 0 {
			return "-"
		}
		return strings.Join(parts, " ")
	})
	if slices.ContainsFunc(res.Runs, func(r Report) bool { return r.Decisions != nil }) {
		row("session decisions", func(r Report) string { return r.Decisions.cell("session") })
		row("prefix decisions", func(r Report) string { return r.Decisions.cell("prefix") })
		row("kv decisions", func(r Report) string { return r.Decisions.cell("kv") })
		if slices.ContainsFunc(res.Runs, func(r Report) bool { return len(r.Decisions["kv_pressure"]) > 0 }) {
			row("kv pressure decisions", func(r Report) string { return r.Decisions.cell("kv_pressure") })
		}
	}
	return header, rows
}

// optFloat is a measure that may be missing, as "-".
func optFloat(p *float64) string {
	if p == nil {
		return "-"
	}
	return strconv.FormatFloat(*p, 'f', 3, 64)
}

// errorsCell is the error count with its kinds, e.g. "3 (http_503=2 timeout=1)".
func errorsCell(r Report) string {
	if r.Errors == 0 {
		return "0"
	}
	kinds := make([]string, 0, len(r.ErrorsByKind))
	for k := range r.ErrorsByKind {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	for i, k := range kinds {
		kinds[i] = fmt.Sprintf("%s=%d", k, r.ErrorsByKind[k])
	}
	return fmt.Sprintf("%d (%s)", r.Errors, strings.Join(kinds, " "))
}
