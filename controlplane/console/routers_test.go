package console

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
)

const exposition = `# HELP llmgw_prefix_decisions_total Tier-1 prefix scorer decisions.
# TYPE llmgw_prefix_decisions_total counter
llmgw_prefix_decisions_total{decision="hit"} %d
llmgw_prefix_decisions_total{decision="miss"} %d
# HELP llmgw_router_session_decisions_total Tier-0.
# TYPE llmgw_router_session_decisions_total counter
llmgw_router_session_decisions_total{decision="new"} %d
# HELP llmgw_router_inflight Completion requests being served.
# TYPE llmgw_router_inflight gauge
llmgw_router_inflight 3
`

func TestParseDecisions(t *testing.T) {
	got, err := ParseDecisions(fmt.Appendf(nil, exposition, 7, 2, 5))
	if err != nil {
		t.Fatal(err)
	}
	if got[0]["new"] != 5 || got[1]["hit"] != 7 || got[1]["miss"] != 2 || len(got[2]) != 0 {
		t.Fatalf("decisions %v", got)
	}
	for _, bad := range []string{
		"llmgw_prefix_decisions_total{decision=\"hit\" 1\n",
		"# TYPE llmgw_prefix_decisions_total gauge\nllmgw_prefix_decisions_total{decision=\"hit\"} 1\n",
	} {
		if _, err := ParseDecisions([]byte(bad)); err == nil {
			t.Errorf("ParseDecisions(%q) accepted it", bad)
		}
	}
}

func FuzzParseDecisions(f *testing.F) {
	f.Add(fmt.Appendf(nil, exposition, 1, 2, 3))
	f.Add([]byte("llmgw_kv_decisions_total{decision=\"no_data\"} 1e3\n"))
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := ParseDecisions(body)
		if err == nil && len(got) != len(Tiers) {
			t.Fatalf("%d tiers, want %d", len(got), len(Tiers))
		}
	})
}

// fakeRouter serves an exposition whose counters a test sets.
type fakeRouter struct {
	mu                sync.Mutex
	hit, miss, newSes int
	down              bool
}

func (f *fakeRouter) set(hit, miss, newSes int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hit, f.miss, f.newSes = hit, miss, newSes
}

func (f *fakeRouter) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		http.Error(w, "down", http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintf(w, exposition, f.hit, f.miss, f.newSes)
}

func decisionsOf(t *testing.T, v RouterView, tier int) map[string]DecisionView {
	t.Helper()
	out := map[string]DecisionView{}
	for _, d := range v.Tiers[tier].Decisions {
		out[d.Decision] = d
	}
	return out
}

// TestSamplerWindows: the last minute and the window are increases over
// the samples at their edges; a router restart (counters going down)
// counts from zero; history beyond the window is dropped; a failed read
// keeps the last figures and says why.
func TestSamplerWindows(t *testing.T) {
	fr := &fakeRouter{}
	srv := httptest.NewServer(fr)
	defer srv.Close()
	now := time.Unix(1_000_000, 0)
	s := NewSampler(SamplerConfig{Routers: []string{srv.URL}, Interval: 30 * time.Second, Window: 2 * time.Minute,
		Client: srv.Client(), Now: func() time.Time { return now }}, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	read := func(hit, miss, newSes int) {
		fr.set(hit, miss, newSes)
		s.ReadAll(ctx)
		now = now.Add(30 * time.Second)
	}
	read(10, 0, 0) // t=0
	read(20, 1, 0) // t=30
	read(30, 1, 0) // t=60
	read(40, 1, 2) // t=90
	read(50, 3, 2) // t=120
	v := s.View().Routers[0]
	if v.Error != "" || v.SpanSeconds != 120 {
		t.Fatalf("view %+v", v)
	}
	d := decisionsOf(t, v, 1)
	// Last minute: from t=60 (30) to t=120 (50); window: from t=0 (10).
	if d["hit"].LastMinute != 20 || d["hit"].Window != 40 || d["hit"].Total != 50 || d["miss"].Window != 3 {
		t.Fatalf("tier 1 %+v", d)
	}
	if got := v.Tiers[1].PerInterval; fmt.Sprint(got) != "[11 10 10 12]" {
		t.Fatalf("per interval %v", got)
	}
	if s0 := decisionsOf(t, v, 0); s0["new"].Window != 2 {
		t.Fatalf("tier 0 %+v", s0)
	}

	read(5, 0, 0) // t=150: the router restarted
	v = s.View().Routers[0]
	if d := decisionsOf(t, v, 1); d["hit"].LastMinute != 5 {
		t.Fatalf("after a restart: %+v", d)
	}
	// The window keeps one sample at or before its start (t=30).
	if v.SpanSeconds != 120 {
		t.Fatalf("span %v after trimming, want 120", v.SpanSeconds)
	}

	fr.mu.Lock()
	fr.down = true
	fr.mu.Unlock()
	s.ReadAll(ctx)
	v = s.View().Routers[0]
	if !strings.Contains(v.Error, "503") || len(v.Tiers) != len(Tiers) {
		t.Fatalf("a failed read: %+v", v)
	}
}

func TestSamplerRunStops(t *testing.T) {
	fr := &fakeRouter{}
	srv := httptest.NewServer(fr)
	defer srv.Close()
	s := NewSampler(SamplerConfig{Routers: []string{srv.URL}, Interval: 10 * time.Millisecond, Client: srv.Client()}, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	testkit.Wait(t, "the sampler reading the router", func() bool { return s.View().Routers[0].ReadUnixMs != 0 })
	cancel()
	<-done
}

func TestCheckRouterURL(t *testing.T) {
	for s, ok := range map[string]bool{
		"http://127.0.0.1:8080": true, "https://router.example:8443": true,
		"127.0.0.1:8080": false, "ftp://x": false, "http://": false, "http://x/?a=b": false,
	} {
		if err := CheckRouterURL(s); (err == nil) != ok {
			t.Errorf("CheckRouterURL(%q) = %v", s, err)
		}
	}
}

// warnRecorder counts the warnings and infos logged.
type warnRecorder struct {
	mu           sync.Mutex
	warns, infos []string
}

func (r *warnRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *warnRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch rec.Level {
	case slog.LevelWarn:
		r.warns = append(r.warns, rec.Message)
	case slog.LevelInfo:
		r.infos = append(r.infos, rec.Message)
	}
	return nil
}
func (r *warnRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *warnRecorder) WithGroup(string) slog.Handler      { return r }

func (r *warnRecorder) counts() (warns, infos int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.warns), len(r.infos)
}

// TestSamplerQuietStart: a router not up yet when the control plane starts
// (llmgw dev starts the control node first) is waited for quietly; one
// that stays unreadable past Quiet, or fails after it was read, is warned
// of once (issue 34).
func TestSamplerQuietStart(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	rec := &warnRecorder{}
	const r = "http://127.0.0.1:7406"
	s := NewSampler(SamplerConfig{Routers: []string{r}, Interval: 5 * time.Second, Now: func() time.Time { return now }}, slog.New(rec)) // Quiet: 30 s, the default
	refused := errors.New("connection refused")
	steps := []struct {
		after      time.Duration
		err        error
		warns, inf int
	}{
		{0, refused, 0, 0},               // the router is starting
		{5 * time.Second, refused, 0, 0}, // still starting: quiet
		{5 * time.Second, nil, 0, 0},     // up: nothing to say
		{5 * time.Second, refused, 1, 0}, // read before, fails now: warned at once
		{5 * time.Second, refused, 1, 0}, // once
		{5 * time.Second, nil, 1, 1},     // readable again
		{5 * time.Second, refused, 2, 1}, // and again
	}
	for i, st := range steps {
		now = now.Add(st.after)
		var counts []map[string]float64
		if st.err == nil {
			counts = make([]map[string]float64, len(Tiers))
		}
		s.record(r, counts, st.err)
		if w, in := rec.counts(); w != st.warns || in != st.inf {
			t.Fatalf("step %d: %d warnings, %d infos; want %d, %d", i, w, in, st.warns, st.inf)
		}
	}

	// A router that never answers is warned of once Quiet has passed.
	rec = &warnRecorder{}
	s = NewSampler(SamplerConfig{Routers: []string{r}, Interval: 5 * time.Second, Now: func() time.Time { return now }}, slog.New(rec)) // Quiet: 30 s, the default
	for i := range 8 {
		s.record(r, nil, refused)
		want := 0
		if i >= 6 { // 30 s after the first failure
			want = 1
		}
		if w, _ := rec.counts(); w != want {
			t.Fatalf("never read, %d s in: %d warnings, want %d", i*5, w, want)
		}
		now = now.Add(5 * time.Second)
	}
	if v := s.View().Routers[0]; v.Error == "" {
		t.Errorf("the page does not say the router is unreadable: %+v", v)
	}
}
