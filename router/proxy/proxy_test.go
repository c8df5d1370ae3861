package proxy

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/router/breaker"
	"github.com/llmgw/llmgw/router/endpoint"
	"github.com/llmgw/llmgw/router/scheduler"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// route offers its endpoints in order and counts what it is told.
type route struct {
	eps      []*endpoint.Endpoint
	last     *endpoint.Endpoint
	accepted []string
}

func (r *route) Next(tried []*endpoint.Endpoint) (*endpoint.Endpoint, scheduler.Key) {
	for _, e := range r.eps {
		if !slices.Contains(tried, e) {
			r.last = e
			return e, key(e)
		}
	}
	return nil, scheduler.Key{}
}

func (r *route) Accepted() { r.accepted = append(r.accepted, r.last.ReplicaID) }

func key(e *endpoint.Endpoint) scheduler.Key { return scheduler.Key{ID: e.ReplicaID, UID: e.UID} }

// engine serves h and counts its requests.
func engine(t *testing.T, hits *atomic.Int32, h http.HandlerFunc) string {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits != nil {
			hits.Add(1)
		}
		h(w, r)
	}))
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

func ok(body string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, body) }
}

func status(code int) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(code) }
}

func newProxy(t *testing.T, attempts int) (*Proxy, *breaker.Set[scheduler.Key]) {
	t.Helper()
	bcfg := breaker.DefaultConfig()
	bcfg.Failures = 1 // one failure opens: each attempt's outcome shows
	brs, err := breaker.NewSet(bcfg, func(k scheduler.Key) string { return k.ID }, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := New(Config{ConnectTimeout: time.Second, FirstByteTimeout: 10 * time.Second, MaxAttempts: attempts}, brs, nil)
	t.Cleanup(p.Close)
	return p, brs
}

// serve runs one request through p and returns the result and what the
// client got.
func serve(t *testing.T, p *Proxy, req *Request) (Result, *httptest.ResponseRecorder) {
	t.Helper()
	if req.Log == nil {
		req.Log = slog.New(slog.DiscardHandler)
	}
	if req.Replicas == 0 {
		req.Replicas = len(req.Route.(*route).eps)
	}
	if req.Body == nil {
		req.Body = []byte(`{"model":"m"}`)
	}
	r := httptest.NewRequest(http.MethodPost, "/v1/completions", nil)
	r.Header.Set("X-Request-ID", "q-1")
	w := httptest.NewRecorder()
	return p.Serve(w, r, req), w
}

func ep(id, addr string) *endpoint.Endpoint {
	return &endpoint.Endpoint{ReplicaID: id, UID: 1, Model: "m", Address: addr}
}

func TestServe(t *testing.T) {
	type rep struct {
		id      string
		h       http.HandlerFunc // nil: nothing listens
		wantHit bool
		// wantBreaker is the replica's breaker afterwards (one failure opens it).
		wantBreaker breaker.State
	}
	tests := []struct {
		name        string
		attempts    int
		adapter     string
		reps        []rep
		wantCode    int
		wantReplica string // "": the proxy refused
		wantErrCode string
	}{
		{name: "connection refused, 5xx, then an answer", attempts: 3, reps: []rep{
			{"dead", nil, false, breaker.Open}, {"busy", status(503), true, breaker.Open}, {"good", ok(`{}`), true, breaker.Closed}},
			wantCode: 200, wantReplica: "good"},
		{name: "the last attempt's 5xx is the answer", attempts: 2, reps: []rep{
			{"a", status(500), true, breaker.Open}, {"b", status(502), true, breaker.Open}, {"c", ok(`{}`), false, breaker.Closed}},
			wantCode: 502, wantReplica: "b"},
		{name: "the only replica's 5xx is the answer", attempts: 3, reps: []rep{{"a", status(503), true, breaker.Open}},
			wantCode: 503, wantReplica: "a"},
		{name: "every replica unreachable", attempts: 3, reps: []rep{{"a", nil, false, breaker.Open}, {"b", nil, false, breaker.Open}},
			wantCode: 502, wantErrCode: "upstream_error"},
		{name: "no replica", attempts: 3, wantCode: 503, wantErrCode: "no_replica_available"},
		{name: "an adapter's 404 is retried and costs the replica nothing", attempts: 3, adapter: "sql", reps: []rep{
			{"a", status(404), true, breaker.Closed}, {"b", ok(`{}`), true, breaker.Closed}},
			wantCode: 200, wantReplica: "b"},
		{name: "a 404 without an adapter is the answer", attempts: 3, reps: []rep{
			{"a", status(404), true, breaker.Closed}, {"b", ok(`{}`), false, breaker.Closed}},
			wantCode: 404, wantReplica: "a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, brs := newProxy(t, tt.attempts)
			rt := &route{}
			hits := make([]*atomic.Int32, len(tt.reps))
			for i, r := range tt.reps {
				hits[i] = new(atomic.Int32)
				addr := deadAddr(t)
				if r.h != nil {
					addr = engine(t, hits[i], r.h)
				}
				rt.eps = append(rt.eps, ep(r.id, addr))
			}
			res, w := serve(t, p, &Request{Route: rt, Name: "m", Model: "m", Adapter: tt.adapter})
			if res.Code != tt.wantCode {
				t.Fatalf("code %d, want %d (err %v)", res.Code, tt.wantCode, res.Err)
			}
			if tt.wantReplica == "" {
				if res.Err == nil || res.Err.Code != tt.wantErrCode || res.Replica != nil || len(rt.accepted) != 0 {
					t.Fatalf("result %+v accepted %v, want the refusal %s", res, rt.accepted, tt.wantErrCode)
				}
				if w.Body.Len() != 0 {
					t.Fatalf("the proxy wrote %q; a refusal is the caller's to write", w.Body.String())
				}
			} else {
				if res.Err != nil || res.Replica == nil || res.Replica.ReplicaID != tt.wantReplica ||
					!slices.Equal(rt.accepted, []string{tt.wantReplica}) || w.Header().Get("X-Llmgw-Replica") != tt.wantReplica {
					t.Fatalf("result %+v accepted %v replica header %q, want %s", res, rt.accepted, w.Header().Get("X-Llmgw-Replica"), tt.wantReplica)
				}
			}
			for i, r := range tt.reps {
				if got := hits[i].Load() > 0; got != r.wantHit {
					t.Errorf("%s hit: %v, want %v", r.id, got, r.wantHit)
				}
				if b := brs.Peek(key(rt.eps[i])); b != nil {
					if st, _ := b.View(); st != r.wantBreaker {
						t.Errorf("%s breaker %s, want %s", r.id, st, r.wantBreaker)
					}
				} else if r.wantBreaker != breaker.Closed {
					t.Errorf("%s has no breaker, want %s", r.id, r.wantBreaker)
				}
			}
		})
	}
}

// TestBreakerRefusalIsNotAnAttempt: a replica whose breaker refuses is
// skipped without using up one of MaxAttempts.
func TestBreakerRefusalIsNotAnAttempt(t *testing.T) {
	p, brs := newProxy(t, 1)
	var hits atomic.Int32
	open := ep("open", engine(t, nil, ok(`{}`)))
	good := ep("good", engine(t, &hits, ok(`{}`)))
	brs.Get(key(open)).Failure() // open, cooling down for 5 s
	res, _ := serve(t, p, &Request{Route: &route{eps: []*endpoint.Endpoint{open, good}}, Name: "m", Model: "m"})
	if res.Code != 200 || res.Replica != good || hits.Load() != 1 {
		t.Fatalf("result %+v, %d hits on good; want good to answer within one attempt", res, hits.Load())
	}
}

// TestStripAndTail: the usage chunk the router asked for is dropped from
// the client's stream, while the tail gets the engine's bytes as sent.
func TestStripAndTail(t *testing.T) {
	stream := "data: {\"choices\":[{}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\ndata: [DONE]\n\n"
	p, _ := newProxy(t, 3)
	rt := &route{eps: []*endpoint.Endpoint{ep("a", engine(t, nil, ok(stream)))}}
	var tail strings.Builder
	res, w := serve(t, p, &Request{Route: rt, Name: "m", Model: "m", Stream: true, StripUsage: true, Tail: &tail, Start: time.Now()})
	if res.Code != 200 {
		t.Fatalf("code %d", res.Code)
	}
	if got, want := w.Body.String(), "data: {\"choices\":[{}]}\n\ndata: [DONE]\n\n"; got != want {
		t.Fatalf("client got %q, want %q", got, want)
	}
	if tail.String() != stream {
		t.Fatalf("tail %q, want the engine's bytes %q", tail.String(), stream)
	}
	if w.Header().Get("X-Request-ID") != "q-1" {
		t.Fatalf("X-Request-ID %q", w.Header().Get("X-Request-ID"))
	}
}

// TestForwardHeader: the engine never gets the client's credentials
// (Anthropic's x-api-key included), hop-by-hop fields, Expect or its Content-Length; everything else
// passes, with the body's own length and the engine's address as Host.
func TestForwardHeader(t *testing.T) {
	got := make(chan *http.Request, 1)
	addr := engine(t, nil, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got <- r
		io.WriteString(w, `{}`)
	})
	p, _ := newProxy(t, 1)
	r := httptest.NewRequest(http.MethodPost, "/v1/completions?x=1", nil)
	for _, k := range []string{"Authorization", "Cookie", "Proxy-Authorization", "X-Api-Key", "Connection", "Keep-Alive", "Te", "Trailer",
		"Transfer-Encoding", "Upgrade", "Proxy-Connection", "Content-Length", "Expect", "Content-Type", "X-Request-Id", "X-Session-Id",
		"Anthropic-Version"} {
		r.Header.Set(k, "v")
	}
	r.Header.Add("X-Session-Id", " two\r\nInjected: yes ")
	body := []byte(`{"model":"m"}`)
	res := p.Serve(httptest.NewRecorder(), r, &Request{Route: &route{eps: []*endpoint.Endpoint{ep("a", addr)}}, Replicas: 1,
		Name: "m", Model: "m", Body: body, Log: slog.New(slog.DiscardHandler)})
	if res.Code != 200 {
		t.Fatalf("code %d (%v)", res.Code, res.Err)
	}
	er := <-got
	var keys []string
	for k := range er.Header {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if want := []string{"Anthropic-Version", "Content-Length", "Content-Type", "User-Agent", "X-Request-Id", "X-Session-Id"}; !slices.Equal(keys, want) {
		t.Fatalf("engine got %v, want %v", keys, want)
	}
	if er.ContentLength != int64(len(body)) || er.Host != addr || er.URL.RequestURI() != "/v1/completions?x=1" {
		t.Fatalf("engine got length %d host %q uri %q", er.ContentLength, er.Host, er.URL.RequestURI())
	}
	if v := er.Header.Values("X-Session-Id"); !slices.Equal(v, []string{"v", "two  Injected: yes"}) {
		t.Fatalf("X-Session-Id %q: a value's CR LF must not start a field", v)
	}
	if len(r.Header) != 17 {
		t.Fatalf("the client's header was changed: %v", r.Header)
	}
}
