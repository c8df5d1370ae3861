package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// seq returns the tokens from..to-1.
func seq(from, to int) []int {
	out := make([]int, 0, to-from)
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

func cat(parts ...[]int) []int {
	var out []int
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func TestComputeCeiling(t *testing.T) {
	const bs = 4
	tests := []struct {
		name       string
		in         []ceilingInput
		wantShare  float64
		wantWarm   int
		wantMisses int
		warm       bool
	}{
		{name: "nothing", in: nil},
		{
			name: "a prompt seen twice hits its full blocks but the last token's",
			in:   []ceilingInput{{start: 1, prompt: seq(0, 9)}, {start: 2, prompt: seq(0, 9)}},
			// second: min(2 full blocks, (9-1)/4 = 2) = 8 tokens
			wantShare: 8.0 / 18, wantMisses: 10,
		},
		{
			name: "a prompt of whole blocks recomputes its last block",
			in:   []ceilingInput{{start: 1, prompt: seq(0, 8)}, {start: 2, prompt: seq(0, 8)}},
			// (8-1)/4 = 1 block
			wantShare: 4.0 / 16, wantMisses: 12,
		},
		{
			name: "a block under another prefix is another block",
			in: []ceilingInput{
				{start: 1, prompt: cat(seq(0, 4), seq(10, 14), seq(20, 21))},
				{start: 2, prompt: cat(seq(100, 104), seq(10, 14), seq(20, 21))},
			},
			wantShare: 0, wantMisses: 18,
		},
		{
			name: "the order is the order sent, not the order given",
			in: []ceilingInput{
				{start: 5, prompt: cat(seq(0, 8), seq(50, 52)), cachedTokens: 8},
				{start: 1, prompt: cat(seq(0, 8), seq(60, 62))},
			},
			wantShare: 8.0 / 20, wantMisses: 12,
		},
		{
			name: "an answer the next turn resends was cached while decoding",
			in: []ceilingInput{
				{start: 1, prompt: seq(0, 6), after: seq(0, 12)},
				{start: 2, prompt: seq(0, 14), cachedTokens: 12},
			},
			// second: blocks 0..2 (12 tokens) seen through the first's answer
			wantShare: 12.0 / 20, wantMisses: 8,
		},
		{
			name: "hits a cold start cannot have are a warm cache",
			in: []ceilingInput{
				{start: 1, prompt: seq(0, 41), cachedTokens: 40},
				{start: 2, prompt: seq(100, 141), cachedTokens: 40},
			},
			wantShare: 0, wantWarm: 80, wantMisses: 82, warm: true,
		},
		{
			name: "a hit on a request sent just after, before the first token, is a race, not warmth",
			in: []ceilingInput{
				{start: 1, firstToken: 100, prompt: seq(0, 41), cachedTokens: 40},
				{start: 2, firstToken: 50, prompt: seq(0, 41)},
			},
			wantShare: 40.0 / 82, wantWarm: 0, wantMisses: 42, warm: false,
		},
		{
			name: "a hit only a request sent after the first token holds was warm",
			in: []ceilingInput{
				{start: 1, firstToken: 100, prompt: seq(0, 41), cachedTokens: 40},
				{start: 200, firstToken: 250, prompt: seq(0, 41), cachedTokens: 40},
			},
			wantShare: 40.0 / 82, wantWarm: 40, wantMisses: 42, warm: true,
		},
		{
			name: "a block's worth over the ideal among many misses is a race, not warmth",
			in: []ceilingInput{
				{start: 1, prompt: seq(0, 200), cachedTokens: 4},
				{start: 2, prompt: seq(1000, 1200)},
			},
			wantShare: 0, wantWarm: 4, wantMisses: 400, warm: false,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := computeCeiling(tt.in, bs)
			if math.Abs(c.share-tt.wantShare) > 1e-12 || c.warmTokens != tt.wantWarm || c.coldMisses != tt.wantMisses || c.isWarm() != tt.warm {
				t.Fatalf("share %v warm %d misses %d isWarm %v, want %v %d %d %v",
					c.share, c.warmTokens, c.coldMisses, c.isWarm(), tt.wantShare, tt.wantWarm, tt.wantMisses, tt.warm)
			}
		})
	}
}

// fakeEngine serves an engine's /tokenize (a token per word, the word's
// hash), /reset_prefix_cache and /metrics with vLLM's cache_config_info.
type fakeEngine struct {
	mu       sync.Mutex
	noReset  bool // answer /reset_prefix_cache 404, as vLLM outside its dev mode
	resets   int
	tokenize int
	cont     int // tokenizations with continue_final_message
	// head and tail are the chat template's tokens around the last
	// message (tail only when it is closed); 0 and 0: none.
	head, tail int
}

func (e *fakeEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/reset_prefix_cache":
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.noReset {
			http.NotFound(w, r)
			return
		}
		e.resets++
	case "/metrics":
		fmt.Fprintln(w, `vllm:cache_config_info{block_size="4",engine="0"} 1`)
	case "/tokenize":
		var b tokenizeBody
		if err := json.NewDecoder(r.Body).Decode(&b); err != nil || b.Model == "" || len(b.Messages) == 0 || b.AddGenerationPrompt == b.ContinueFinalMessage {
			http.Error(w, `{"error":{"message":"bad tokenize"}}`, http.StatusBadRequest)
			return
		}
		e.mu.Lock()
		e.tokenize++
		if b.ContinueFinalMessage {
			e.cont++
		}
		e.mu.Unlock()
		var toks []int
		for i, m := range b.Messages {
			if i == len(b.Messages)-1 {
				toks = append(toks, make([]int, e.head)...)
			}
			for _, wd := range strings.Fields(m.Content) {
				h := fnv.New32a()
				h.Write([]byte(wd))
				toks = append(toks, int(h.Sum32()))
			}
		}
		if !b.ContinueFinalMessage {
			toks = append(toks, make([]int, e.tail)...)
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"count": len(toks), "tokens": toks})
	default:
		http.NotFound(w, r)
	}
}

func TestRunResetsCachesCeilingAndRefusesWarm(t *testing.T) {
	eng := &fakeEngine{}
	es := httptest.NewServer(eng)
	defer es.Close()
	// The fake router reports half of every prompt cached, from the very
	// first request: the hits of a cache warmed before the run.
	s := serve(t, newFakeRouter())
	cfg := testConfig(s.URL, s.URL)
	cfg.Requests, cfg.Concurrency = 10, 2
	cfg.Seeds = []uint64{3, 4}
	cfg.Engines = func(context.Context) ([]string, error) { return []string{es.URL}, nil }
	cfg.ResetCaches, cfg.ResetSettle = true, 0

	res, err := Run(context.Background(), cfg)
	if !errors.Is(err, ErrWarm) || !strings.Contains(err.Error(), "--allow-warm") {
		t.Fatalf("err = %v, want ErrWarm naming --allow-warm", err)
	}
	if len(res.Runs) != 4 || eng.resets != 4 || eng.tokenize != 40 {
		t.Fatalf("%d runs, %d resets, %d tokenizations; want 4, 4, 40", len(res.Runs), eng.resets, eng.tokenize)
	}
	// Seed 3 runs t0 then t1; seed 4 is rotated.
	order := []string{res.Runs[0].Label, res.Runs[1].Label, res.Runs[2].Label, res.Runs[3].Label}
	if !equal(order, []string{"t0", "t1", "t1", "t0"}) {
		t.Fatalf("run order %v", order)
	}
	for _, r := range res.Runs {
		if r.CacheHitCeiling == nil || r.HitOverCeiling == nil || r.BlockSize != 4 || !r.CachesReset || !r.WarmStart || r.WarmCacheTokens == 0 {
			t.Fatalf("run %s seed %d: ceiling %v hit/ceiling %v block %d reset %v warm %v (%d)",
				r.Label, r.Seed, r.CacheHitCeiling, r.HitOverCeiling, r.BlockSize, r.CachesReset, r.WarmStart, r.WarmCacheTokens)
		}
		if c := *r.CacheHitCeiling; c <= 0 || c >= 1 || math.Abs(*r.HitOverCeiling-r.CacheHitShare/c) > 1e-12 {
			t.Fatalf("ceiling %v, hit/ceiling %v for hit %v", c, *r.HitOverCeiling, r.CacheHitShare)
		}
	}
	if res.Summary == nil || len(res.Summary.Targets) != 2 || !equal([]string{fmt.Sprint(res.Summary.Seeds)}, []string{"[3 4]"}) {
		t.Fatalf("summary %+v", res.Summary)
	}

	cfg.AllowWarm = true
	if _, err := Run(context.Background(), cfg); err != nil {
		t.Fatalf("with AllowWarm: %v", err)
	}
	cfg.Seeds, cfg.Targets = nil, cfg.Targets[:1]
	if _, err := Run(context.Background(), cfg); err != nil {
		t.Fatalf("one run has nothing to compare with, yet: %v", err)
	}
}

func TestRunMultiTurnCeilingCountsTheAnswers(t *testing.T) {
	eng := &fakeEngine{}
	es := httptest.NewServer(eng)
	defer es.Close()
	cfg := testConfig(serve(t, newFakeRouter()).URL)
	cfg.Workload = WorkloadConfig{Name: MultiTurn, Model: "m", Seed: 1, MaxTokens: 4, SystemWords: 20, PromptWords: 5, Sessions: 2, Turns: 3}
	cfg.Requests, cfg.Concurrency = 6, 2
	cfg.TokenizeURL = es.URL
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if eng.cont != 6 || res.Runs[0].CacheHitCeiling == nil {
		t.Fatalf("%d tokenizations with the answer, ceiling %v; want 6 and a ceiling", eng.cont, res.Runs[0].CacheHitCeiling)
	}
}

func TestResetCachesNamesTheEngineThatRefuses(t *testing.T) {
	refuse := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":{"message":"blocks in use"}}`, http.StatusBadRequest)
	}))
	defer refuse.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no waiting out the retries
	_, err := resetCaches(ctx, http.DefaultClient, []string{refuse.URL}, 0)
	if err == nil {
		t.Fatal("a refused reset passed")
	}
	if _, err := resetCaches(context.Background(), http.DefaultClient, nil, 0); err == nil || !strings.Contains(err.Error(), "no engines") {
		t.Fatalf("no engines: %v", err)
	}
}

// TestResetCachesWithoutTheEndpoint: an engine that has no POST
// /reset_prefix_cache (404, 405, 501) is named at once, without retries,
// and the others are still reset; an engine that refuses is an error. The
// reset asks for the connector's cache too (reset_external=true).
func TestResetCachesWithoutTheEndpoint(t *testing.T) {
	type engine struct {
		code  int
		calls atomic.Int32
	}
	tests := []struct {
		name        string
		codes       []int
		wantNoReset []int // indexes of the engines named
		wantErr     bool
	}{
		{"every engine resets", []int{200, 200}, nil, false},
		{"vLLM without VLLM_SERVER_DEV_MODE", []int{404}, []int{0}, false},
		{"method not allowed", []int{405}, []int{0}, false},
		{"not implemented", []int{501}, []int{0}, false},
		{"one of two lacks it", []int{200, 404}, []int{1}, false},
		{"a refusal is still an error", []int{400}, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var urls []string
			var engines []*engine
			for _, code := range tt.codes {
				e := &engine{code: code}
				s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					e.calls.Add(1)
					if r.Method != http.MethodPost || r.URL.Path != "/reset_prefix_cache" || r.URL.Query().Get("reset_external") != "true" {
						http.Error(w, "wrong request", http.StatusTeapot)
						return
					}
					w.WriteHeader(e.code)
				}))
				t.Cleanup(s.Close)
				urls, engines = append(urls, s.URL), append(engines, e)
			}
			ctx := context.Background()
			if tt.wantErr {
				c, cancel := context.WithCancel(ctx)
				cancel() // no waiting out the refusal's retries
				ctx = c
			}
			noReset, err := resetCaches(ctx, http.DefaultClient, urls, 0)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want an error: %v", err, tt.wantErr)
			}
			var want []string
			for _, i := range tt.wantNoReset {
				want = append(want, urls[i])
			}
			if !equal(noReset, want) {
				t.Fatalf("engines without a reset %v, want %v", noReset, want)
			}
			for i, e := range engines {
				if n := e.calls.Load(); n != 1 && e.code != 400 {
					t.Errorf("engine %d (status %d) asked %d times, want once", i, e.code, n)
				}
			}
		})
	}
}

// TestRunWithoutAResetEndpoint is issue 27's case: by default a bench
// against an engine without POST /reset_prefix_cache goes on, marks the
// run "cache not reset" and warns; when the reset is required it stops
// saying why.
func TestRunWithoutAResetEndpoint(t *testing.T) {
	eng := &fakeEngine{noReset: true}
	es := httptest.NewServer(eng)
	defer es.Close()
	cfg := testConfig(serve(t, newFakeRouter()).URL)
	cfg.Requests, cfg.Concurrency = 4, 2
	cfg.Engines = func(context.Context) ([]string, error) { return []string{es.URL}, nil }
	cfg.ResetCaches, cfg.ResetSettle = true, 0
	var logs bytes.Buffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))

	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("a run without the reset endpoint failed: %v", err)
	}
	r := res.Runs[0]
	if r.CachesReset || !equal(r.CacheNotReset, []string{es.URL}) || r.Requests != 4 {
		t.Fatalf("reset %v, not reset %v, %d requests; want false, [%s], 4", r.CachesReset, r.CacheNotReset, r.Requests, es.URL)
	}
	if !strings.Contains(logs.String(), "/reset_prefix_cache") || !strings.Contains(logs.String(), "VLLM_SERVER_DEV_MODE") {
		t.Errorf("no warning naming the missing endpoint:\n%s", logs.String())
	}
	_, rows := res.Table()
	// Two requests at once may hit what the other computed first, which
	// the table marks WARM beside the mark this test is about.
	if cell := rowOf(rows, "caches"); cell != "cache not reset" && !strings.HasSuffix(cell, "), cache not reset") {
		t.Errorf("caches cell %q, want \"cache not reset\" (after a WARM mark or alone)", cell)
	}

	cfg.RequireReset = true
	if _, err := Run(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "VLLM_SERVER_DEV_MODE=1") || !strings.Contains(err.Error(), es.URL) {
		t.Fatalf("required reset: err = %v, want one naming the engine and VLLM_SERVER_DEV_MODE=1", err)
	}
}

// rowOf is the first run's cell of the table row named name.
func rowOf(rows [][]string, name string) string {
	for _, r := range rows {
		if r[0] == name {
			return r[1]
		}
	}
	return ""
}

// TestRunCeilingFallsBackToAnotherEngine: the first engine listed is down
// (restarted by the run, say); the ceiling comes from the next.
func TestRunCeilingFallsBackToAnotherEngine(t *testing.T) {
	eng := &fakeEngine{}
	es := httptest.NewServer(eng)
	defer es.Close()
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	cfg := testConfig(serve(t, newFakeRouter()).URL)
	cfg.Requests, cfg.Concurrency = 4, 2
	cfg.Engines = func(context.Context) ([]string, error) { return []string{dead.URL, es.URL}, nil }
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Runs[0].CacheHitCeiling == nil || res.Runs[0].BlockSize != 4 || res.Runs[0].CachesReset {
		t.Fatalf("ceiling %v block %d reset %v: want a ceiling from the second engine, no reset asked",
			res.Runs[0].CacheHitCeiling, res.Runs[0].BlockSize, res.Runs[0].CachesReset)
	}
}
