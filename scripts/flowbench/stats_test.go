package main

import (
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/scripts/internal/benchchat"
)

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

func TestJain(t *testing.T) {
	for _, tc := range []struct {
		name string
		xs   []float64
		want float64
	}{
		{"equal", []float64{5, 5, 5, 5}, 1},
		{"one takes all", []float64{10, 0, 0, 0, 0}, 0.2},
		{"nothing served", []float64{0, 0, 0}, 1},
		{"two to one", []float64{2, 1}, 9.0 / 10},
		{"ten, one at half", []float64{1, 1, 1, 1, 1, 1, 1, 1, 1, 0.5}, 9.5 * 9.5 / (10 * 9.25)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := jain(tc.xs); !near(got, tc.want, 1e-12) {
				t.Fatalf("jain(%v) = %v, want %v", tc.xs, got, tc.want)
			}
		})
	}
}

func TestArrivals(t *testing.T) {
	const rate, d = 50.0, 200 * time.Second
	a := benchchat.Arrivals(rand.New(rand.NewPCG(1, 2)), rate, d)
	// Poisson: the count's standard deviation is √(rate·d) = 100.
	if n := float64(len(a)); !near(n, rate*d.Seconds(), 400) {
		t.Fatalf("%v arrivals, want about %v", n, rate*d.Seconds())
	}
	var sum, sq float64
	for i, at := range a {
		if at < 0 || at >= d || (i > 0 && at < a[i-1]) {
			t.Fatalf("arrival %d at %v: out of order or range", i, at)
		}
		gap := at.Seconds()
		if i > 0 {
			gap -= a[i-1].Seconds()
		}
		sum += gap
		sq += gap * gap
	}
	// Exponential gaps: the mean and the standard deviation are both 1/rate.
	mean := sum / float64(len(a))
	sd := math.Sqrt(sq/float64(len(a)) - mean*mean)
	if !near(mean, 1/rate, 0.05/rate) || !near(sd, 1/rate, 0.05/rate) {
		t.Fatalf("gaps: mean %v, sd %v; want both %v", mean, sd, 1/rate)
	}
	if again := benchchat.Arrivals(rand.New(rand.NewPCG(1, 2)), rate, d); len(again) != len(a) || again[len(a)-1] != a[len(a)-1] {
		t.Fatal("the same seed gave another schedule")
	}
	if benchchat.Arrivals(rand.New(rand.NewPCG(1, 2)), 0, d) != nil {
		t.Fatal("rate 0 gave arrivals")
	}
}

func TestPerBucket(t *testing.T) {
	start := time.Unix(1000, 0)
	at := func(s float64) time.Time { return start.Add(time.Duration(s * float64(time.Second))) }
	evs := []event{
		{"a", at(-1), 100}, // before the start
		{"a", at(0), 1},
		{"b", at(59.9), 2},
		{"a", at(60), 4},
		{"c", at(61), 8}, // a tenant not asked for
		{"b", at(119.99), 16},
		{"a", at(120), 32}, // after the last bucket
	}
	got := perBucket(evs, []string{"a", "b", "z"}, start, time.Minute, 2)
	want := []map[string]float64{{"a": 1, "b": 2, "z": 0}, {"a": 4, "b": 16, "z": 0}}
	if len(got) != len(want) {
		t.Fatalf("%d buckets, want %d", len(got), len(want))
	}
	for m := range want {
		for k, v := range want[m] {
			if g, ok := got[m][k]; !ok || g != v {
				t.Fatalf("bucket %d tenant %s = %v (present %v), want %v", m, k, g, ok, v)
			}
		}
		if len(got[m]) != len(want[m]) {
			t.Fatalf("bucket %d: %v", m, got[m])
		}
	}
	if j := jain(values(got[0], []string{"a", "b", "z"})); !near(j, 9.0/15, 1e-12) {
		t.Fatalf("Jain of bucket 0 with the idle tenant = %v", j)
	}
}

func TestFairShares(t *testing.T) {
	for _, tc := range []struct {
		name     string
		demand   map[string]float64
		capacity float64
		want     map[string]float64
	}{
		{"all over", map[string]float64{"a": 10, "b": 10}, 4, map[string]float64{"a": 2, "b": 2}},
		{"all under", map[string]float64{"a": 1, "b": 2}, 10, map[string]float64{"a": 1, "b": 2}},
		{"one heavy", map[string]float64{"h": 100, "a": 1, "b": 1, "c": 1}, 10, map[string]float64{"h": 7, "a": 1, "b": 1, "c": 1}},
		{"issue's phase 4: 10r and 9 × r at 2 × capacity", func() map[string]float64 {
			m := map[string]float64{"f0": 20.0 / 19}
			for _, k := range []string{"f1", "f2", "f3", "f4", "f5", "f6", "f7", "f8", "f9"} {
				m[k] = 2.0 / 19
			}
			return m
		}(), 1, map[string]float64{"f0": 0.1, "f1": 0.1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := fairShares(tc.demand, tc.capacity)
			for k, v := range tc.want {
				if !near(got[k], v, 1e-9) {
					t.Fatalf("share of %s = %v, want %v (all: %v)", k, got[k], v, got)
				}
			}
		})
	}
}

func TestCountInversions(t *testing.T) {
	t0 := time.Unix(0, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	rounds := []round{
		{at(0), 0, 0},
		{at(50), 10, 0.02},     // 10 batch, interactive waited 20 ms: none
		{at(100), 20, 0.15},    // 10 batch, interactive waiting 150 ms at the end: strict and conservative
		{at(150), 25, 0},       // 5 batch, the waiter left: conservative only
		{at(300), 40, 0},       // 15 batch, a 150 ms gap
		{at(350), 2, 0.3},      // a router restarted: 2 counted, strict
		{at(400), 2, 0.5},      // nothing dispatched while interactive waited
		{at(450), 3, 0.100001}, // just over
	}
	got := countInversions(rounds, 0.1)
	want := inversionCount{strict: 10 + 2 + 1, conservative: 10 + 5 + 2 + 1, total: 10 + 10 + 5 + 15 + 2 + 0 + 1, maxGap: 150 * time.Millisecond}
	if got != want {
		t.Fatalf("countInversions = %+v, want %+v", got, want)
	}
	if c := countInversions(rounds[:1], 0.1); c != (inversionCount{}) {
		t.Fatalf("one round: %+v", c)
	}
}

func TestQuantile(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(101-i)*time.Millisecond)
	}
	if q := benchchat.Quantile(ds, 0.99); q != 99*time.Millisecond {
		t.Fatalf("p99 = %v", q)
	}
	if q := benchchat.Quantile(ds, 0.5); q != 50*time.Millisecond {
		t.Fatalf("p50 = %v", q)
	}
	if ds[0] != 100*time.Millisecond {
		t.Fatal("quantile sorted its input")
	}
	if benchchat.Quantile(nil, 0.99) != 0 {
		t.Fatal("no samples")
	}
}

func TestClassify(t *testing.T) {
	h := func(kv ...string) http.Header {
		out := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			out.Set(kv[i], kv[i+1])
		}
		return out
	}
	ttl := 30 * time.Second
	for _, tc := range []struct {
		name    string
		res     benchchat.Result
		want    outcome
		reason  string
		whyPart string
	}{
		{"served", benchchat.Result{Code: 200, Complete: true}, served, "", ""},
		{"cut stream", benchchat.Result{Code: 200}, lost, "", "unfinished"},
		{"connect error", benchchat.Result{ConnectError: true}, lost, "", "error"},
		{"queue full", benchchat.Result{Code: 429, Header: h(hdrReason, "queue_full", hdrRetry, "1")}, refused, "queue_full", ""},
		{"queue bytes", benchchat.Result{Code: 429, Header: h(hdrReason, "queue_bytes", hdrRetry, "1")}, refused, "queue_bytes", ""},
		{"timeout after the TTL", benchchat.Result{Code: 429, Elapsed: 31 * time.Second, Header: h(hdrReason, "queue_timeout", hdrRetry, "2")}, refused, "queue_timeout", ""},
		{"timeout before the TTL", benchchat.Result{Code: 429, Elapsed: 29 * time.Second, Header: h(hdrReason, "queue_timeout", hdrRetry, "2")}, lost, "queue_timeout", "before"},
		{"no reason", benchchat.Result{Code: 429, Header: h(hdrRetry, "1")}, lost, "", "without X-Llmgw-Flow-Reason"},
		{"no Retry-After", benchchat.Result{Code: 429, Header: h(hdrReason, "queue_full")}, lost, "queue_full", "without Retry-After"},
		{"unknown reason", benchchat.Result{Code: 429, Header: h(hdrReason, "tenant_rpm", hdrRetry, "1")}, lost, "tenant_rpm", "unknown"},
		{"503", benchchat.Result{Code: 503}, lost, "", "503"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, reason, why := classify(tc.res, ttl)
			if o != tc.want || reason != tc.reason || !strings.Contains(why, tc.whyPart) {
				t.Fatalf("classify = %v, %q, %q; want %v, %q, …%q…", o, reason, why, tc.want, tc.reason, tc.whyPart)
			}
		})
	}
}

func TestMeanSD(t *testing.T) {
	m, sd := meanSD([]float64{2, 4, 4, 4, 5, 5, 7, 9})
	if m != 5 || !near(sd, math.Sqrt(32.0/7), 1e-12) {
		t.Fatalf("meanSD = %v, %v", m, sd)
	}
}
