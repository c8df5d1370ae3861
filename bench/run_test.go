package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeRouter is an OpenAI streaming endpoint in the router's shape: SSE
// chunks, usage with cached_tokens on the last, X-Llmgw-Replica on answers,
// and failures by request number. It tallies what it did so the tests can
// hold the report against the truth.
type fakeRouter struct {
	replicas  int
	failEvery int // every failEvery-th request (1-based) gets a 503; 0 never
	midEvery  int // every midEvery-th request breaks mid-stream; 0 never
	block     chan struct{}
	// metrics serves GET /metrics with decision counters: session hits
	// count the requests answered, the rest stay put.
	metrics bool
	// apiKey, when set, is the only key answered; anything else gets 401.
	apiKey string

	mu       sync.Mutex
	n        int
	served   map[string]int
	failed   int
	broken   int
	prompt   int
	cached   int
	asked    int              // max_tokens asked for, summed
	eos      int              // requests with ignore_eos
	sessions map[string][]int // message counts per session, in arrival order
	ids      map[string]bool  // X-Request-ID values seen
}

func newFakeRouter() *fakeRouter {
	return &fakeRouter{replicas: 3, served: map[string]int{}, sessions: map[string][]int{}, ids: map[string]bool{}}
}

func (f *fakeRouter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.metrics && r.Method == http.MethodGet && r.URL.Path == "/metrics" {
		f.mu.Lock()
		n := f.n
		f.mu.Unlock()
		fmt.Fprintf(w, "# TYPE llmgw_router_session_decisions_total counter\n"+
			"llmgw_router_session_decisions_total{decision=\"hit\"} %d\n"+
			"llmgw_router_session_decisions_total{decision=\"new\"} 3\n"+
			"llmgw_prefix_decisions_total{decision=\"miss\"} 7\n"+
			"llmgw_router_scheduling_seconds_count 12\n", 100+n)
		return
	}
	var body struct {
		Model         string    `json:"model"`
		Messages      []Message `json:"messages"`
		MaxTokens     int       `json:"max_tokens"`
		IgnoreEOS     bool      `json:"ignore_eos"`
		Stream        bool      `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if f.apiKey != "" && r.Header.Get("Authorization") != "Bearer "+f.apiKey {
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"error":{"message":"invalid api key","type":"invalid_request_error","code":"invalid_api_key"}}`)
		return
	}
	if r.URL.Path != "/v1/chat/completions" || json.NewDecoder(r.Body).Decode(&body) != nil || !body.Stream || !body.StreamOptions.IncludeUsage || body.Model == "" {
		http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	if f.block != nil {
		<-r.Context().Done()
		return
	}
	words := 0
	for _, m := range body.Messages {
		words += len(strings.Fields(m.Content))
	}
	f.mu.Lock()
	f.n++
	n := f.n
	f.asked += body.MaxTokens
	if body.IgnoreEOS {
		f.eos++
	}
	f.ids[r.Header.Get("X-Request-ID")] = true
	if sid := r.Header.Get("X-Session-ID"); sid != "" {
		f.sessions[sid] = append(f.sessions[sid], len(body.Messages))
	}
	if f.failEvery > 0 && n%f.failEvery == 0 {
		f.failed++
		f.mu.Unlock()
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":{"message":"no replica able to serve","type":"unavailable","param":null,"code":503}}`)
		return
	}
	replica := fmt.Sprintf("r%d", n%f.replicas)
	f.served[replica]++
	broken := f.midEvery > 0 && n%f.midEvery == 0
	cached := words / 2
	if broken {
		f.broken++
	} else {
		f.prompt += words
		f.cached += cached
	}
	f.mu.Unlock()

	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Llmgw-Replica", replica)
	fl := w.(http.Flusher)
	send := func(s string) {
		io.WriteString(w, "data: "+s+"\n\n")
		fl.Flush()
	}
	send(`{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`)
	send(`{"choices":[{"index":0,"delta":{"content":" tok"}}]}`)
	if broken {
		send(`{"error":{"message":"engine went away"}}`)
		return
	}
	for range max(body.MaxTokens, 1) - 1 {
		send(`{"choices":[{"index":0,"delta":{"content":" tok"}}]}`)
	}
	send(fmt.Sprintf(`{"choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`, words, max(body.MaxTokens, 1), cached))
	send("[DONE]")
}

func serve(t *testing.T, f *fakeRouter) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(f)
	t.Cleanup(s.Close)
	return s
}

func testConfig(targets ...string) Config {
	cfg := DefaultConfig()
	for i, u := range targets {
		// The fake serves its counters beside the API, as an operations port.
		cfg.Targets = append(cfg.Targets, Target{Label: fmt.Sprintf("t%d", i), URL: u, Metrics: u})
	}
	cfg.Workload = WorkloadConfig{Name: SharedPrefix, Model: "m", Seed: 1, MaxTokens: 4, SystemWords: 50, PromptWords: 10, Groups: 2}
	cfg.RequestTimeout = time.Minute
	return cfg
}

func TestRunCountsErrorsHitsAndReplicas(t *testing.T) {
	f := newFakeRouter()
	f.failEvery, f.midEvery = 5, 7
	s := serve(t, f)
	cfg := testConfig(s.URL)
	cfg.Requests, cfg.Concurrency = 40, 4
	var progress sync.WaitGroup
	progress.Add(40)
	cfg.Progress = func(Sample) { progress.Done() }
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	progress.Wait() // Progress was called once per request, or this never returns
	if len(res.Runs) != 1 {
		t.Fatalf("%d runs, want 1", len(res.Runs))
	}
	r := res.Runs[0]
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Requests != 40 || f.n != 40 {
		t.Fatalf("report %d requests, server saw %d, want 40", r.Requests, f.n)
	}
	if len(f.ids) != 40 || f.ids[""] {
		t.Fatalf("%d distinct X-Request-IDs for 40 requests (empty among them: %v)", len(f.ids), f.ids[""])
	}
	if r.Errors != f.failed+f.broken || r.ErrorsByKind["http_503"] != f.failed || r.ErrorsByKind["stream_error"] != f.broken {
		t.Fatalf("errors %d %v, server failed %d and broke %d", r.Errors, r.ErrorsByKind, f.failed, f.broken)
	}
	if want := float64(f.cached) / float64(f.prompt); r.CacheHitShare != want || r.CacheHitShare <= 0 {
		t.Fatalf("cache hit share %g, want the server's %g", r.CacheHitShare, want)
	}
	total, most := 0, 0
	for rep, n := range f.served {
		if r.Replicas[rep] != n {
			t.Fatalf("replica %s: report %d, server %d", rep, r.Replicas[rep], n)
		}
		total += n
		most = max(most, n)
	}
	if want := float64(most) / (float64(total) / float64(len(f.served))); r.ReplicaMaxOverMean != want {
		t.Fatalf("max/mean %g, want %g", r.ReplicaMaxOverMean, want)
	}
	if ok := 40 - r.Errors; r.TTFT.Count != ok || r.E2E.Count != ok || r.ITL.Count != ok*3 {
		t.Fatalf("ttft %d e2e %d itl %d samples for %d successes of 4 tokens", r.TTFT.Count, r.E2E.Count, r.ITL.Count, ok)
	}
	if r.TTFT.P50 > r.TTFT.P90 || r.TTFT.P90 > r.TTFT.P99 || r.TTFT.P99 > r.TTFT.Max {
		t.Fatalf("percentiles out of order: %+v", r.TTFT)
	}
}

func TestRunSendsTheAPIKey(t *testing.T) {
	f := newFakeRouter()
	f.apiKey = "sk-llmgw-test"
	s := serve(t, f)
	for _, tt := range []struct {
		key        string
		wantErrors int
	}{{"", 6}, {"sk-llmgw-other", 6}, {"sk-llmgw-test", 0}} {
		cfg := testConfig(s.URL)
		cfg.Requests, cfg.Concurrency, cfg.APIKey = 6, 2, tt.key
		res, err := Run(context.Background(), cfg)
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		r := res.Runs[0]
		if r.Errors != tt.wantErrors || r.ErrorsByKind["http_401"] != tt.wantErrors {
			t.Errorf("key %q: %d errors %v, want %d http_401", tt.key, r.Errors, r.ErrorsByKind, tt.wantErrors)
		}
	}
}

func TestRunMultiTurnSessionsAreSequentialAndGrow(t *testing.T) {
	f := newFakeRouter()
	s := serve(t, f)
	cfg := testConfig(s.URL)
	cfg.Workload = WorkloadConfig{Name: MultiTurn, Model: "m", Seed: 9, Sessions: 3, Turns: 4, MaxTokens: 2, SystemWords: 5, PromptWords: 5}
	// More clients than sessions, and a budget that ends mid-session: the
	// spare clients must wait for a session and then stop, not hang.
	cfg.Requests, cfg.Concurrency = 14, 5
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := res.Runs[0].Requests; got != 14 {
		t.Fatalf("%d requests, want 14", got)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.sessions) < 4 {
		t.Fatalf("%d sessions seen, want the 3 live ones and at least one started after one finished", len(f.sessions))
	}
	for sid, counts := range f.sessions {
		for i, c := range counts {
			// system, then a user/assistant pair per earlier turn, then the new user message
			if want := 2 + 2*i; c != want {
				t.Fatalf("session %s turn %d: %d messages, want %d (history %v)", sid, i, c, want, counts)
			}
		}
	}
}

func TestRunOpenLoop(t *testing.T) {
	f := newFakeRouter()
	s := serve(t, f)
	cfg := testConfig(s.URL)
	cfg.Concurrency, cfg.Rate, cfg.Requests = 0, 5000, 30
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if r := res.Runs[0]; r.Requests != 30 || r.Errors != 0 {
		t.Fatalf("requests %d errors %d %v, want 30 and 0", r.Requests, r.Errors, r.ErrorsByKind)
	}
}

func TestRunForADuration(t *testing.T) {
	f := newFakeRouter()
	s := serve(t, f)
	cfg := testConfig(s.URL)
	cfg.Requests, cfg.Duration, cfg.Concurrency = 0, 100*time.Millisecond, 2
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if r := res.Runs[0]; r.Requests == 0 || r.Errors != 0 {
		t.Fatalf("requests %d errors %v", r.Requests, r.ErrorsByKind)
	}
}

func TestRunTargetsSideBySideAndRoundRobin(t *testing.T) {
	fa, fb := newFakeRouter(), newFakeRouter()
	a, b := serve(t, fa), serve(t, fb)

	cfg := testConfig(a.URL, b.URL)
	cfg.Requests, cfg.Concurrency = 10, 2
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if len(res.Runs) != 2 || res.Runs[0].Label != "t0" || res.Runs[1].Label != "t1" || res.Runs[1].Target != b.URL {
		t.Fatalf("runs %+v", res.Runs)
	}
	if fa.n != 10 || fb.n != 10 {
		t.Fatalf("side by side: servers saw %d and %d, want 10 each", fa.n, fb.n)
	}
	if res.Runs[0].CacheHitShare != res.Runs[1].CacheHitShare {
		t.Fatal("the same prompts gave different hit shares on identical servers")
	}

	fa.n, fb.n = 0, 0
	cfg.RoundRobin, cfg.Requests = true, 20
	res, err = Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if len(res.Runs) != 1 || res.Runs[0].Requests != 20 || res.Runs[0].Label != "t0+t1" {
		t.Fatalf("round-robin runs %+v", res.Runs)
	}
	if fa.n != 10 || fb.n != 10 {
		t.Fatalf("round robin: servers saw %d and %d, want 10 each", fa.n, fb.n)
	}
}

func TestRunStopsOnCancel(t *testing.T) {
	f := newFakeRouter()
	f.block = make(chan struct{})
	s := serve(t, f)
	cfg := testConfig(s.URL)
	cfg.Requests, cfg.Concurrency = 100, 3
	ctx, cancel := context.WithCancel(context.Background())
	sent := make(chan struct{})
	var once sync.Once
	cfg.Client = &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.Method == http.MethodPost { // not the /metrics scrape
			once.Do(func() { close(sent) })
		}
		return http.DefaultTransport.RoundTrip(r)
	})}
	t.Cleanup(http.DefaultTransport.(*http.Transport).CloseIdleConnections)
	go func() { <-sent; cancel() }()
	res, err := Run(ctx, cfg)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
	if len(res.Runs) != 1 || res.Runs[0].Requests == 0 || res.Runs[0].Errors != res.Runs[0].Requests || res.Runs[0].ErrorsByKind["canceled"] == 0 {
		t.Fatalf("partial report %+v, want the cancelled requests counted", res.Runs)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestReportJSONTableAndChart(t *testing.T) {
	f := newFakeRouter()
	f.failEvery = 4
	s := serve(t, f)
	cfg := testConfig(s.URL, s.URL)
	cfg.Targets[0].Label, cfg.Targets[1].Label = "a<&>", "b"
	cfg.Requests, cfg.Concurrency = 12, 3
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}

	raw, err := json.Marshal(res.Runs[0])
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]any
	if err := json.Unmarshal(raw, &top); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"requests", "errors", "throughput_rps", "cache_hit_share", "ttft_seconds", "itl_seconds", "e2e_seconds", "replicas", "errors_by_kind", "label", "target"} {
		if _, ok := top[k]; !ok {
			t.Fatalf("JSON has no %q: %s", k, raw)
		}
	}
	for _, k := range []string{"ttft_seconds", "itl_seconds", "e2e_seconds"} {
		m, _ := top[k].(map[string]any)
		for _, p := range []string{"p50", "p90", "p99"} {
			if _, ok := m[p].(float64); !ok {
				t.Fatalf("%s has no number %s: %v", k, p, m)
			}
		}
	}
	raw, _ = json.Marshal(res)
	var multi struct {
		Runs []map[string]any `json:"runs"`
	}
	if err := json.Unmarshal(raw, &multi); err != nil || len(multi.Runs) != 2 {
		t.Fatalf("several runs as JSON: %v %s", err, raw)
	}

	header, rows := res.Table()
	if !equal(header, []string{"METRIC", "a<&>", "b"}) {
		t.Fatalf("header %v", header)
	}
	found := map[string][]string{}
	for _, r := range rows {
		if len(r) != 3 {
			t.Fatalf("row %v has %d cells, want 3", r, len(r))
		}
		found[r[0]] = r[1:]
	}
	for _, name := range []string{"requests", "errors", "cache hit share", "ttft p50 (ms)", "itl p99 (ms)", "e2e p90 (ms)", "replica spread"} {
		if _, ok := found[name]; !ok {
			t.Fatalf("table has no %q row", name)
		}
	}
	if found["requests"][0] != "12" || !strings.Contains(found["errors"][0], "http_503=3") {
		t.Fatalf("requests %v errors %v", found["requests"], found["errors"])
	}

	var svg bytes.Buffer
	if err := WriteChart(&svg, res); err != nil {
		t.Fatal(err)
	}
	checkSVG(t, svg.Bytes(), 2)
}

func TestChartOfNothingIsStillSVG(t *testing.T) {
	var svg bytes.Buffer
	if err := WriteChart(&svg, Result{Runs: []Report{{Label: "empty"}}}); err != nil {
		t.Fatal(err)
	}
	checkSVG(t, svg.Bytes(), 0)
}

// checkSVG parses the chart as XML and counts its CDF lines.
func checkSVG(t *testing.T, b []byte, lines int) {
	t.Helper()
	if doc := parseSVG(t, b); doc.polylines != lines {
		t.Fatalf("%d polylines, want %d", doc.polylines, lines)
	}
}

func equal(a, b []string) bool { return strings.Join(a, "\x00") == strings.Join(b, "\x00") }

func TestConfigValidate(t *testing.T) {
	base := func() Config { return testConfig("http://127.0.0.1:1") }
	tests := []struct {
		name   string
		modify func(*Config)
		want   string
	}{
		{"default", func(*Config) {}, ""},
		{"no target", func(c *Config) { c.Targets = nil }, "--target"},
		{"round robin of one", func(c *Config) { c.RoundRobin = true }, "--targets-round-robin"},
		{"rate and concurrency", func(c *Config) { c.Rate = 3 }, "choose one"},
		{"neither", func(c *Config) { c.Concurrency = 0 }, "--concurrency"},
		{"negative rate", func(c *Config) { c.Rate, c.Concurrency = -1, 0 }, "--rate"},
		{"endless", func(c *Config) { c.Requests = 0 }, "--duration, --requests"},
		{"negative duration", func(c *Config) { c.Duration = -time.Second }, "--duration"},
		{"no timeout", func(c *Config) { c.RequestTimeout = 0 }, "--request-timeout"},
		{"bad workload", func(c *Config) { c.Workload.Name = "x" }, "--workload"},
		{"messages", func(c *Config) { c.API = APIMessages }, ""},
		{"responses", func(c *Config) { c.API = APIResponses }, ""},
		{"bad api", func(c *Config) { c.API = "completions" }, "--api"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base()
			tt.modify(&c)
			err := c.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate = %v, want an error naming %s", err, tt.want)
			}
		})
	}
}

func TestParseTarget(t *testing.T) {
	tests := []struct {
		in      string
		want    Target
		wantErr bool
	}{
		{"http://127.0.0.1:8080", Target{Label: "127.0.0.1:8080", URL: "http://127.0.0.1:8080"}, false},
		{"http://a:8080/", Target{Label: "a:8080", URL: "http://a:8080"}, false},
		{"least-loaded=http://a:8080", Target{Label: "least-loaded", URL: "http://a:8080"}, false},
		{"http://a:8080/?x=1", Target{Label: "a:8080", URL: "http://a:8080/?x=1"}, false},
		{"=http://a", Target{}, true},
		{"a:8080", Target{}, true},
		{"ftp://a", Target{}, true},
		{"name=", Target{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseTarget(tt.in)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("ParseTarget(%q) = %+v, %v; want %+v, error %v", tt.in, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestRunReportsRouterDecisions(t *testing.T) {
	fa, fb := newFakeRouter(), newFakeRouter()
	fa.metrics, fb.metrics = true, true
	cfg := testConfig(serve(t, fa).URL, serve(t, fb).URL)
	cfg.RoundRobin, cfg.Requests = true, 20
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	// 10 requests each: the two routers' session hits rose by 20 in all;
	// counters that did not move are not reported.
	want := Decisions{"session": {"hit": 20}}
	if got := res.Runs[0].Decisions; !reflect.DeepEqual(got, want) {
		t.Fatalf("decisions %v, want %v", got, want)
	}
	_, rows := res.Table()
	found := false
	for _, r := range rows {
		if r[0] == "session decisions" && r[1] == "hit=20" {
			found = true
		}
	}
	if !found {
		t.Fatalf("table has no session decisions row: %v", rows)
	}

	// A target without the counters (the plain fake answers /metrics 400)
	// leaves the run without decisions rather than with a partial sum.
	cfg = testConfig(serve(t, fa).URL, serve(t, newFakeRouter()).URL)
	cfg.RoundRobin, cfg.Requests = true, 4
	if res, err = Run(context.Background(), cfg); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if d := res.Runs[0].Decisions; d != nil {
		t.Fatalf("decisions %v with one target unreadable, want none", d)
	}
	_, rows = res.Table()
	for _, r := range rows {
		if strings.HasSuffix(r[0], "decisions") {
			t.Fatalf("table shows %q without decisions", r[0])
		}
	}

	// Nor does a target whose operations port was not given.
	cfg = testConfig(serve(t, fa).URL)
	cfg.Targets[0].Metrics = ""
	cfg.Requests = 2
	if res, err = Run(context.Background(), cfg); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if d := res.Runs[0].Decisions; d != nil {
		t.Fatalf("decisions %v without an operations port, want none", d)
	}
}
