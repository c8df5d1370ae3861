package api

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/auth"
	"github.com/llmgw/llmgw/router/breaker"
	"github.com/llmgw/llmgw/router/endpoint"
	"github.com/llmgw/llmgw/router/flow"
	"github.com/llmgw/llmgw/router/scheduler"
)

// flowLoads reads the table's endpoints as fresh replicas running
// `running` requests each, plus this router's own in flight.
type flowLoads struct {
	tb      *table
	running atomic.Int64
}

func (l *flowLoads) Loads(model string, dst []endpoint.Load) []endpoint.Load {
	for _, e := range l.tb.models[model] {
		dst = append(dst, endpoint.Load{Reading: endpoint.Reading{Running: float64(l.running.Load())}, Inflight: e.Inflight()})
	}
	return dst
}

// flowHandler is a handler over one engine with flow control of
// concurrency 4 per replica, its dispatcher running until the test ends.
func flowHandler(t testing.TB, engineURL string, mod func(*flow.Config), tenants map[string]*llmgwv1.Tenant, keys *auth.Set) (*Handler, *flowLoads) {
	t.Helper()
	tb := &table{models: map[string][]*endpoint.Endpoint{"demo": {ep("demo-0", strings.TrimPrefix(engineURL, "http://"))}}}
	loads := &flowLoads{tb: tb}
	fcfg := flow.DefaultConfig()
	fcfg.ReplicaConcurrency = 4
	fcfg.Tick = time.Millisecond
	if mod != nil {
		mod(&fcfg)
	}
	fc, err := flow.New(fcfg, loads, slog.New(slog.DiscardHandler), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = fc.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	cfg := DefaultConfig()
	cfg.Flow = fc
	cfg.Tenants = func() map[string]*llmgwv1.Tenant { return tenants }
	if keys != nil {
		cfg.Keys = func() *auth.Set { return keys }
	}
	br, err := breaker.NewSet(breaker.DefaultConfig(), func(k scheduler.Key) string { return k.ID }, nil)
	if err != nil {
		t.Fatal(err)
	}
	return newHandler(t, cfg, tb, inOrder{}, br, slog.New(slog.DiscardHandler), prometheus.NewRegistry()), loads
}

const flowBody = `{"model":"demo","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`

func flowPost(ctx context.Context, h http.Handler, hdr map[string]string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(flowBody)).WithContext(ctx)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

// TestFlowClassHeaders: the class served is on the answer; a header may
// raise a class only to the tenant's maximum; one naming no class is 400.
func TestFlowClassHeaders(t *testing.T) {
	eng := okEngine()
	defer eng.Close()
	const secret = "sk-llmgw-0123456789abcdefghijklmnopqrstuvwxyzABCDEFG"
	k := apiKey("k", secret)
	k.Tenant = "t"
	keys := (*auth.Set)(nil).Clone()
	keys.Put(k)
	tenants := map[string]*llmgwv1.Tenant{"t": {Name: "t", DefaultClass: "batch", MaxClass: "standard"}}
	h, _ := flowHandler(t, eng.URL, nil, tenants, keys)
	auth := "Bearer " + secret
	cases := []struct {
		header string
		code   int
		class  string
	}{
		{"", 200, "batch"},
		{"standard", 200, "standard"},
		{"interactive", 200, "standard"},
		{"bogus", 400, ""},
	}
	for _, tc := range cases {
		w := flowPost(context.Background(), h, map[string]string{"Authorization": auth, "X-Llmgw-Priority": tc.header})
		if w.Code != tc.code || w.Header().Get("X-Llmgw-Priority") != tc.class {
			t.Errorf("priority %q: %d class %q, want %d %q (%s)", tc.header, w.Code, w.Header().Get("X-Llmgw-Priority"), tc.code, tc.class, w.Body)
		}
		if tc.code == 400 && !strings.Contains(w.Body.String(), "invalid_priority") {
			t.Errorf("400 body %s", w.Body)
		}
	}
}

// TestFlowQueuesAtSaturation: at saturation a request waits and is
// served once room frees, with the time it waited on the answer; past the
// queue's bound the next gets 429 with its reason and Retry-After.
func TestFlowQueuesAtSaturation(t *testing.T) {
	eng := okEngine()
	defer eng.Close()
	h, loads := flowHandler(t, eng.URL, func(c *flow.Config) { c.Classes[1].MaxQueued = 1 }, nil, nil)
	loads.running.Store(4) // full

	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- flowPost(context.Background(), h, nil) }()
	fc := h.cfg.Flow.(*flow.Controller)
	for deadline := time.Now().Add(10 * time.Second); len(fc.Depths()) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) || len(first) > 0 {
			t.Fatal("the first request was not queued within 10s while the replica was full")
		}
	}
	// The second finds the queue full: its bound is one.
	w := flowPost(context.Background(), h, nil)
	if w.Code != http.StatusTooManyRequests || w.Header().Get("X-Llmgw-Flow-Reason") != flow.ReasonQueueFull || w.Header().Get("Retry-After") == "" {
		t.Fatalf("past the bound: %d reason %q retry %q, want 429 queue_full with Retry-After", w.Code,
			w.Header().Get("X-Llmgw-Flow-Reason"), w.Header().Get("Retry-After"))
	}
	var body struct {
		Error struct{ Code string } `json:"error"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || body.Error.Code != "rate_limit_exceeded" {
		t.Fatalf("429 body %s", w.Body)
	}
	loads.running.Store(0) // room frees
	select {
	case w := <-first:
		if w.Code != 200 || w.Header().Get("X-Llmgw-Queue-Ms") == "" {
			t.Fatalf("queued request: %d, queue-ms %q", w.Code, w.Header().Get("X-Llmgw-Queue-Ms"))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the queued request was not served within 10s of room freeing")
	}
}

// TestFlowClientLeaves: a client that goes while its request waits gets
// 499 and the queue is left empty.
func TestFlowClientLeaves(t *testing.T) {
	eng := okEngine()
	defer eng.Close()
	h, loads := flowHandler(t, eng.URL, nil, nil, nil)
	loads.running.Store(4)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	w := flowPost(ctx, h, nil)
	// The recorder's code stays 200 when nothing is written.
	if w.Header().Get("X-Llmgw-Priority") != "standard" || w.Body.Len() != 0 || w.Header().Get("X-Llmgw-Replica") != "" {
		t.Fatalf("left while queued: %d %q %q, want nothing served", w.Code, w.Header().Get("X-Llmgw-Priority"), w.Body)
	}
	fc := h.cfg.Flow.(*flow.Controller)
	if d := fc.Depths(); len(d) != 0 {
		t.Fatalf("queue after the client left: %v", d)
	}
}

// BenchmarkHandlerFlow is one chat request through the whole handler with
// flow control off and on, below saturation (docs/benchmarks.md "Flow
// control"): on, it is a mutex, one pass over the model's replicas and a
// counter; the difference is what flow control costs a request when it
// holds nothing.
func BenchmarkHandlerFlow(b *testing.B) {
	eng := okEngine()
	defer eng.Close()
	for _, on := range []bool{false, true} {
		name := "flow=off"
		if on {
			name = "flow=on"
		}
		b.Run(name, func(b *testing.B) {
			h, _ := flowHandler(b, eng.URL, func(c *flow.Config) { c.Enabled = on; c.ReplicaConcurrency = 1 << 20 }, nil, nil)
			b.ReportAllocs()
			cpu0 := processCPU()
			for b.Loop() {
				if w := flowPost(context.Background(), h, nil); w.Code != 200 {
					b.Fatalf("status %d: %s", w.Code, w.Body)
				}
			}
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// TestFlowEnginePriority: an engine that schedules by priority is told
// the request's class, 0 the highest, whatever the client put in the
// body; an engine that does not gets the body as sent.
func TestFlowEnginePriority(t *testing.T) {
	var got atomic.Value
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		p, ok := body["priority"]
		got.Store([]any{p, ok})
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`))
	}))
	defer eng.Close()
	h, loads := flowHandler(t, eng.URL, nil, nil, nil)
	post := func(class, body string) []any {
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Llmgw-Priority", class)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			t.Fatalf("%s: %d %s", class, w.Code, w.Body)
		}
		return got.Load().([]any)
	}
	const sneaky = `{"model":"demo","priority":-1000,"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`
	if p := post("batch", sneaky); p[0] != -1000.0 {
		t.Fatalf("an engine without priority scheduling got priority %v, want the body as sent", p)
	}
	loads.tb.list = []*llmgwv1.Model{{Name: "demo", ExtraArgs: []string{"--scheduling-policy", "priority"}}}
	// Without a tenant the class is at most the default, standard: the
	// header may lower it, never raise it.
	for class, want := range map[string]float64{"interactive": 1, "standard": 1, "batch": 2} {
		if p := post(class, sneaky); p[0] != want {
			t.Errorf("class %s: the engine got priority %v, want %v", class, p, want)
		}
	}
}
