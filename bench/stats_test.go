package bench

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	ten := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	hundred := make([]float64, 100)
	for i := range hundred {
		hundred[i] = float64(i + 1)
	}
	tests := []struct {
		name   string
		sorted []float64
		p      float64
		want   float64
	}{
		{"empty", nil, 50, 0},
		{"one sample", []float64{4.2}, 99, 4.2},
		{"p0 is the minimum", ten, 0, 1},
		{"p50 of ten", ten, 50, 5},
		{"p90 of ten", ten, 90, 9},
		{"p99 of ten is the maximum", ten, 99, 10},
		{"p100", ten, 100, 10},
		{"p50 of two takes the lower", []float64{1, 3}, 50, 1},
		{"p99 of a hundred", hundred, 99, 99},
		{"p90 of a hundred", hundred, 90, 90},
		{"p91.5 rounds the rank up", hundred, 91.5, 92},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Percentile(tt.sorted, tt.p); got != tt.want {
				t.Fatalf("Percentile(p%g) = %g, want %g", tt.p, got, tt.want)
			}
		})
	}
}

func TestSummarize(t *testing.T) {
	got := summarize([]float64{3, 1, 2, 4})
	want := Summary{Count: 4, P50: 2, P90: 4, P99: 4, Mean: 2.5, Max: 4}
	if got != want {
		t.Fatalf("summarize = %+v, want %+v", got, want)
	}
	if (summarize(nil) != Summary{}) {
		t.Fatal("summary of nothing is not zero")
	}
}

func TestSummarizeSamples(t *testing.T) {
	ms := time.Millisecond
	samples := []Sample{
		{Replica: "r0", Start: 0, TTFT: 10 * ms, ITL: []time.Duration{ms, 2 * ms}, E2E: 20 * ms, PromptTokens: 100, CachedTokens: 80, CompletionTokens: 3},
		{Replica: "r0", Start: 5 * ms, TTFT: 30 * ms, E2E: 40 * ms, PromptTokens: 100, CachedTokens: 0, CompletionTokens: 1},
		{Replica: "r1", Start: 10 * ms, TTFT: 20 * ms, ITL: []time.Duration{3 * ms}, E2E: 90 * ms, PromptTokens: 200, CachedTokens: 100, CompletionTokens: 2},
		{Replica: "r1", Start: 20 * ms, E2E: ms, Status: 503, ErrKind: "http_503", PromptTokens: 1000},
	}
	r := Summarize("x", "http://x", SharedPrefix, samples)
	if r.Requests != 4 || r.Errors != 1 || r.ErrorsByKind["http_503"] != 1 {
		t.Fatalf("requests %d errors %d %v", r.Requests, r.Errors, r.ErrorsByKind)
	}
	if r.CacheHitShare != 180.0/400 {
		t.Fatalf("cache hit share %g, want 180/400 (the failed request's tokens left out)", r.CacheHitShare)
	}
	if r.TTFT.Count != 3 || r.TTFT.P50 != 0.02 || r.ITL.Count != 3 || r.E2E.Max != 0.09 {
		t.Fatalf("ttft %+v itl %+v e2e %+v", r.TTFT, r.ITL, r.E2E)
	}
	if r.DurationSeconds != 0.1 || math.Abs(r.ThroughputRPS-30) > 1e-9 {
		t.Fatalf("duration %g throughput %g, want 0.1 s and 3 successes / 0.1 s", r.DurationSeconds, r.ThroughputRPS)
	}
	if r.Replicas["r0"] != 2 || r.Replicas["r1"] != 2 || r.ReplicaMaxOverMean != 1 {
		t.Fatalf("replicas %v max/mean %g", r.Replicas, r.ReplicaMaxOverMean)
	}
}

func TestArrivalsArePoisson(t *testing.T) {
	for _, rate := range []float64{0.5, 10, 250} {
		a := NewArrivals(rand.NewPCG(42, uint64(rate)), rate)
		const n = 200000
		sum, sumSq := 0.0, 0.0
		for range n {
			d := a.Next()
			if d < 0 {
				t.Fatalf("negative gap %s", d)
			}
			x := d.Seconds()
			sum += x
			sumSq += x * x
		}
		mean := sum / n
		// The mean of n exponential gaps has standard deviation
		// (1/rate)/sqrt(n); allow five of them.
		if want, tol := 1/rate, 5/rate/math.Sqrt(n); math.Abs(mean-want) > tol {
			t.Fatalf("rate %g: mean gap %g, want %g ± %g", rate, mean, want, tol)
		}
		// An exponential law's standard deviation equals its mean.
		sd := math.Sqrt(sumSq/n - mean*mean)
		if math.Abs(sd-mean)/mean > 0.05 {
			t.Fatalf("rate %g: sd %g against mean %g; not exponential", rate, sd, mean)
		}
	}
}
