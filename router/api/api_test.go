package api

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/breaker"
	"github.com/llmgw/llmgw/router/director"
	"github.com/llmgw/llmgw/router/endpoint"
	"github.com/llmgw/llmgw/router/proxy"
	"github.com/llmgw/llmgw/router/scheduler"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// table is a fixed routing table.
type table struct {
	models map[string][]*endpoint.Endpoint
	// adapters resolve to their model; held lists, by replica id, the
	// adapters each endpoint holds.
	adapters map[string]endpoint.AdapterRef
	mu       sync.Mutex
	held     map[string]map[string]bool
	changed  chan struct{}
	// list is what Models returns; nil: demo and empty, if present.
	list []*llmgwv1.Model
	// maxLen is what MaxModelLen reports, by model; absent: unknown.
	maxLen map[string]int
}

func (t *table) MaxModelLen(m string) (int, bool) {
	n, ok := t.maxLen[m]
	return n, ok
}

func (t *table) Adapter(name string) (endpoint.AdapterRef, bool) {
	r, ok := t.adapters[name]
	return r, ok
}
func (t *table) Holds(e *endpoint.Endpoint, adapter string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.held[e.ReplicaID][adapter]
}
func (t *table) Changed() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.changed == nil {
		t.changed = make(chan struct{})
	}
	return t.changed
}

// hold marks replica as holding adapter and publishes the change.
func (t *table) hold(replica, adapter string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.held == nil {
		t.held = map[string]map[string]bool{}
	}
	if t.held[replica] == nil {
		t.held[replica] = map[string]bool{}
	}
	t.held[replica][adapter] = true
	if t.changed != nil {
		close(t.changed)
	}
	t.changed = make(chan struct{})
}

func (t *table) Lookup(m string) ([]*endpoint.Endpoint, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	eps, ok := t.models[m]
	return eps, ok
}

// route makes eps model's routable endpoints and publishes the change.
func (t *table) route(model string, eps ...*endpoint.Endpoint) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.models[model] = eps
	if t.changed != nil {
		close(t.changed)
	}
	t.changed = make(chan struct{})
}
func (t *table) Models() []*llmgwv1.Model {
	if t.list != nil {
		return t.list
	}
	var out []*llmgwv1.Model
	for _, n := range []string{"demo", "empty"} {
		if _, ok := t.models[n]; ok {
			out = append(out, &llmgwv1.Model{Name: n})
		}
	}
	return out
}
func (t *table) LoadOf(e *endpoint.Endpoint) endpoint.Load {
	return endpoint.Load{Inflight: e.Inflight()}
}

// inOrder picks the first candidate, so tests know which replica is tried first.
type inOrder struct{}

func (inOrder) ProfileFor(*llmgwv1.Model) *scheduler.Profile                        { return &scheduler.Profile{} }
func (inOrder) Observe(*scheduler.Profile, *scheduler.Request, scheduler.Candidate) {}
func (inOrder) Pick(_ *scheduler.Profile, _ *scheduler.Request, c []scheduler.Candidate) int {
	if len(c) == 0 {
		return -1
	}
	return 0
}

// newHandler builds the handler as router.New does: a director over tb,
// sched and brs (with opts) and a proxy over brs, handed to New. They are
// closed once the test, and every cleanup registered after this one (the
// servers over the handler), ended.
func newHandler(t testing.TB, cfg Config, tb *table, sched director.Scheduler, brs *breaker.Set[scheduler.Key], log *slog.Logger,
	reg prometheus.Registerer, opts ...director.Option,
) *Handler {
	t.Helper()
	dir := director.New(tb, sched, brs, reg, opts...)
	px := proxy.New(proxy.DefaultConfig(), brs, reg)
	t.Cleanup(func() { dir.Close(); px.Close() })
	return New(cfg, tb, dir, px, log, reg)
}

func breakers(t *testing.T) *breaker.Set[scheduler.Key] {
	t.Helper()
	s, err := breaker.NewSet(breaker.DefaultConfig(), func(k scheduler.Key) string { return k.ID }, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func ep(id, addr string) *endpoint.Endpoint {
	return &endpoint.Endpoint{ReplicaID: id, UID: 1, Model: "demo", Address: addr}
}

func engine(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return strings.TrimPrefix(s.URL, "http://")
}

func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func newRouter(t *testing.T, tb *table, mutate func(*Config)) *httptest.Server {
	t.Helper()
	cfg := DefaultConfig()
	if mutate != nil {
		mutate(&cfg)
	}
	reg := prometheus.NewRegistry()
	h := newHandler(t, cfg, tb, inOrder{}, breakers(t), slog.New(slog.DiscardHandler), reg)
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s
}

func post(t *testing.T, url, body string, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func TestErrors(t *testing.T) {
	ok := engine(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{}`) })
	tb := &table{models: map[string][]*endpoint.Endpoint{
		"demo":  {ep("demo-0", deadAddr(t))},
		"empty": nil,
		"fine":  {ep("fine-0", ok)},
	}}
	srv := newRouter(t, tb, func(c *Config) { c.MaxBodyBytes = 64 })
	tests := []struct {
		name       string
		body       string
		status     int
		typ, code  string
		param      string
		retryAfter bool
	}{
		{"invalid json", `{"model":`, 400, "invalid_request_error", "invalid_json", "", false},
		{"not an object", `[1]`, 400, "invalid_request_error", "invalid_json", "", false},
		{"no model", `{"stream":true}`, 400, "invalid_request_error", "invalid_value", "model", false},
		{"stream not bool", `{"model":"demo","stream":"yes"}`, 400, "invalid_request_error", "invalid_value", "stream", false},
		{"unknown model", `{"model":"nope"}`, 404, "invalid_request_error", "model_not_found", "model", false},
		{"too large", `{"model":"demo","prompt":"` + strings.Repeat("x", 100) + `"}`, 413, "invalid_request_error", "request_too_large", "", false},
		{"no replica", `{"model":"empty"}`, 503, "server_error", "no_replica_available", "", true},
		{"engine down", `{"model":"demo"}`, 502, "server_error", "upstream_error", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := post(t, srv.URL+"/v1/chat/completions", tt.body, nil)
			if resp.StatusCode != tt.status {
				t.Fatalf("status = %d, want %d", resp.StatusCode, tt.status)
			}
			var body apiError
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatalf("error body: %v", err)
			}
			e := body.Error
			if e.Type != tt.typ || e.Code == nil || *e.Code != tt.code || e.Message == "" {
				t.Fatalf("error = %+v (code %v), want type %s code %s", e, e.Code, tt.typ, tt.code)
			}
			if tt.param != "" && (e.Param == nil || *e.Param != tt.param) {
				t.Fatalf("param = %v, want %s", e.Param, tt.param)
			}
			if got := resp.Header.Get("Retry-After") != ""; got != tt.retryAfter {
				t.Fatalf("Retry-After present = %v, want %v", got, tt.retryAfter)
			}
			if resp.Header.Get("X-Request-ID") == "" {
				t.Fatal("no X-Request-ID on an error")
			}
		})
	}
}

// TestStreamingIsIncremental has the engine write one chunk and wait until
// the client has read it before writing the next: a router that buffered
// would deadlock here.
func TestStreamingIsIncremental(t *testing.T) {
	next := make(chan struct{})
	addr := engine(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"n\":1}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-next:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "data: {\"n\":2}\n\ndata: [DONE]\n\n")
	})
	srv := newRouter(t, &table{models: map[string][]*endpoint.Endpoint{"demo": {ep("demo-0", addr)}}}, nil)
	resp := post(t, srv.URL+"/v1/chat/completions", `{"model":"demo","stream":true}`, nil)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get("X-Llmgw-Replica") != "demo-0" {
		t.Fatalf("status %d headers %v", resp.StatusCode, resp.Header)
	}
	rd := bufio.NewReader(resp.Body)
	line, err := rd.ReadString('\n')
	if err != nil || line != "data: {\"n\":1}\n" {
		t.Fatalf("first chunk = %q, %v", line, err)
	}
	close(next)
	rest, err := io.ReadAll(rd)
	if err != nil || string(rest) != "\ndata: {\"n\":2}\n\ndata: [DONE]\n\n" {
		t.Fatalf("rest = %q, %v", rest, err)
	}
}

func TestClientCancelReachesEngine(t *testing.T) {
	started := make(chan struct{})
	cancelled := make(chan struct{})
	addr := engine(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {}\n\n")
		w.(http.Flusher).Flush()
		close(started)
		<-r.Context().Done()
		close(cancelled)
	})
	srv := newRouter(t, &table{models: map[string][]*endpoint.Endpoint{"demo": {ep("demo-0", addr)}}}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(`{"model":"demo","stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	<-started
	cancel()
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the engine never saw the client go away")
	}
}

func TestRetryBeforeFirstByte(t *testing.T) {
	var gotID string
	good := engine(t, func(w http.ResponseWriter, r *http.Request) {
		gotID = r.Header.Get("X-Request-ID")
		body, _ := io.ReadAll(r.Body)
		w.Write(body) // echo: the original bytes must arrive
	})
	failing := engine(t, func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "engine overloaded", http.StatusServiceUnavailable)
	})
	tests := []struct {
		name       string
		eps        []*endpoint.Endpoint
		status     int
		replica    string
		wantEchoed bool
	}{
		{"connect error, then good", []*endpoint.Endpoint{ep("dead", deadAddr(t)), ep("good", good)}, 200, "good", true},
		{"5xx, then good", []*endpoint.Endpoint{ep("bad", failing), ep("good", good)}, 200, "good", true},
		{"only 5xx: passed through", []*endpoint.Endpoint{ep("bad", failing)}, 503, "bad", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gotID = ""
			srv := newRouter(t, &table{models: map[string][]*endpoint.Endpoint{"demo": tt.eps}}, nil)
			body := `{"model":"demo",  "prompt":"hi"}`
			resp := post(t, srv.URL+"/v1/completions", body, map[string]string{"X-Request-ID": "req-1"})
			got, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.status || resp.Header.Get("X-Llmgw-Replica") != tt.replica {
				t.Fatalf("status %d replica %q, want %d %q", resp.StatusCode, resp.Header.Get("X-Llmgw-Replica"), tt.status, tt.replica)
			}
			if resp.Header.Get("X-Request-ID") != "req-1" {
				t.Fatalf("X-Request-ID = %q", resp.Header.Get("X-Request-ID"))
			}
			if tt.wantEchoed && (string(got) != body || gotID != "req-1") {
				t.Fatalf("engine got body %q id %q", got, gotID)
			}
		})
	}
}

func TestModelsAndProbes(t *testing.T) {
	ready := false
	srv := newRouter(t, &table{models: map[string][]*endpoint.Endpoint{"demo": nil, "empty": nil}},
		func(c *Config) { c.Ready = func() bool { return ready } })
	resp, err := http.Get(srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list modelList
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	if list.Object != "list" || len(list.Data) != 2 || list.Data[0].ID != "demo" || list.Data[0].Object != "model" || list.Data[0].OwnedBy != "llmgw" {
		t.Fatalf("models = %+v", list)
	}
	for _, tt := range []struct {
		path string
		want int
	}{{"/healthz", 200}, {"/readyz", 503}, {"/metrics", 404}, {"/debug/kvindex", 404}, {"/sd/replicas", 404}} {
		r, err := http.Get(srv.URL + tt.path)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != tt.want {
			t.Fatalf("%s = %d, want %d", tt.path, r.StatusCode, tt.want)
		}
	}
}
