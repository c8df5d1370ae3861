package api

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmgw/llmgw/router/endpoint"
)

// secretPrompt is the prompt's text, which no span may carry.
const secretPrompt = "the-launch-code-is-owl-4471"

// tracedEngine answers a chat with usage and keeps the traceparent of
// each request it was sent.
type tracedEngine struct {
	mu   sync.Mutex
	seen []string
}

func (e *tracedEngine) serve(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	e.mu.Lock()
	e.seen = append(e.seen, r.Header.Get("Traceparent"))
	e.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","model":"demo","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":11,"completion_tokens":3,"total_tokens":14}}`)
}

func (e *tracedEngine) last() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.seen) == 0 {
		return ""
	}
	return e.seen[len(e.seen)-1]
}

func attrsOf(kvs []attribute.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.String()
	}
	return m
}

// TestTracing: the request's server span, its stages and its attempts
// (design §9 "Tracing"), the traceparent the engine gets, and sampling.
func TestTracing(t *testing.T) {
	chat := `{"model":"demo","messages":[{"role":"user","content":"` + secretPrompt + `"}]}`
	tests := []struct {
		name        string
		ratio       float64
		traceparent string // the client's
		deadFirst   bool   // the first replica refuses connections
		wantSpans   bool
	}{
		{name: "new trace", ratio: 1, wantSpans: true},
		{name: "client's trace continued", ratio: 0, traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", wantSpans: true},
		{name: "client's unsampled trace", ratio: 1, traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"},
		{name: "sampled out", ratio: 0},
		{name: "a retry: two attempts", ratio: 1, deadFirst: true, wantSpans: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eng := &tracedEngine{}
			live := ep("demo-1", engine(t, eng.serve))
			eps := []*endpoint.Endpoint{live}
			if tt.deadFirst {
				eps = []*endpoint.Endpoint{ep("demo-0", deadAddr(t)), live}
			}
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec),
				sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(tt.ratio))))
			t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
			srv := newRouter(t, &table{models: map[string][]*endpoint.Endpoint{"demo": eps}}, func(c *Config) { c.Tracer = tp })
			hdr := map[string]string{"X-Request-Id": "req-1"}
			if tt.traceparent != "" {
				hdr["Traceparent"] = tt.traceparent
			}
			resp := post(t, srv.URL+"/v1/chat/completions", chat, hdr)
			_, _ = io.Copy(io.Discard, resp.Body)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			sent := eng.last()
			parts := strings.Split(sent, "-")
			if len(parts) != 4 {
				t.Fatalf("the engine got traceparent %q; want one", sent)
			}
			if tt.traceparent != "" && parts[1] != strings.Split(tt.traceparent, "-")[1] {
				t.Errorf("the engine's trace %s; want the client's continued", parts[1])
			}
			ended := rec.Ended()
			if !tt.wantSpans {
				if len(ended) != 0 || parts[3] != "00" {
					t.Fatalf("not sampled: %d spans recorded, engine flags %s; want none and 00", len(ended), parts[3])
				}
				return
			}
			if parts[3] != "01" {
				t.Errorf("engine flags %s, want 01 (sampled)", parts[3])
			}
			byName := map[string][]sdktrace.ReadOnlySpan{}
			for _, s := range ended {
				byName[s.Name()] = append(byName[s.Name()], s)
				for _, kv := range s.Attributes() {
					if strings.Contains(kv.Value.String(), secretPrompt) {
						t.Errorf("span %s attribute %s carries the prompt", s.Name(), kv.Key)
					}
				}
				for _, e := range s.Events() {
					for _, kv := range e.Attributes {
						if strings.Contains(kv.Value.String(), secretPrompt) {
							t.Errorf("span %s event %s carries the prompt", s.Name(), e.Name)
						}
					}
				}
			}
			reqs := byName["chat demo"]
			if len(reqs) != 1 {
				t.Fatalf("spans %v; want one request span named \"chat demo\"", names(ended))
			}
			req := reqs[0]
			if req.SpanKind() != trace.SpanKindServer {
				t.Errorf("request span kind %v", req.SpanKind())
			}
			if tt.traceparent != "" && req.Parent().SpanID().String() != "00f067aa0ba902b7" {
				t.Errorf("request span's parent %s; want the client's span", req.Parent().SpanID())
			}
			a := attrsOf(req.Attributes())
			for k, want := range map[string]string{"gen_ai.operation.name": "chat", "gen_ai.request.model": "demo",
				"gen_ai.usage.input_tokens": "11", "gen_ai.usage.output_tokens": "3", "http.response.status_code": "200",
				"llmgw.request_id": "req-1", "llmgw.replica": "demo-1"} {
				if a[k] != want {
					t.Errorf("request span %s = %q, want %q", k, a[k], want)
				}
			}
			// Quick stages are events of the request's span (stageSpanMin).
			reqEvents := map[string]map[string]string{}
			for _, e := range req.Events() {
				reqEvents[e.Name] = attrsOf(e.Attributes)
			}
			for _, stage := range []string{"llmgw.resolve", "llmgw.prepare"} {
				if reqEvents[stage] == nil || reqEvents[stage]["llmgw.duration_us"] == "" {
					t.Errorf("stage %s: no event with its duration on the request's span (events %v)", stage, reqEvents)
				}
			}
			attempts := byName["llmgw.attempt"]
			want := 1
			if tt.deadFirst {
				want = 2
			}
			if len(attempts) != want {
				t.Fatalf("%d attempt spans, want %d", len(attempts), want)
			}
			last := attempts[len(attempts)-1]
			if last.SpanKind() != trace.SpanKindClient || last.Parent().SpanID() != req.SpanContext().SpanID() {
				t.Errorf("attempt span kind %v parent %s", last.SpanKind(), last.Parent().SpanID())
			}
			if parts[2] != last.SpanContext().SpanID().String() {
				t.Errorf("engine's parent span %s; want the attempt's %s", parts[2], last.SpanContext().SpanID())
			}
			la := attrsOf(last.Attributes())
			if la["server.address"] != "127.0.0.1" || la["server.port"] == "" || la["llmgw.replica"] != "demo-1" {
				t.Errorf("attempt attributes %v", la)
			}
			if tt.deadFirst && attempts[0].Status().Code != codes.Error {
				t.Errorf("the failed attempt's status %v, want Error", attempts[0].Status())
			}
			events := map[string]bool{}
			for _, e := range last.Events() {
				events[e.Name] = true
			}
			if !events["llmgw.connected"] || !events["llmgw.response_head"] {
				t.Errorf("attempt events %v; want llmgw.connected and llmgw.response_head", events)
			}
		})
	}
}

// TestTracingOffPassesTraceparent: without a tracer the router is
// transparent to the client's trace context.
func TestTracingOffPassesTraceparent(t *testing.T) {
	eng := &tracedEngine{}
	srv := newRouter(t, &table{models: map[string][]*endpoint.Endpoint{"demo": {ep("demo-0", engine(t, eng.serve))}}}, nil)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	resp := post(t, srv.URL+"/v1/chat/completions", `{"model":"demo","messages":[]}`, map[string]string{"Traceparent": tp})
	_, _ = io.Copy(io.Discard, resp.Body)
	if got := eng.last(); got != tp {
		t.Fatalf("engine got traceparent %q, want the client's %q", got, tp)
	}
}

func names(spans []sdktrace.ReadOnlySpan) string {
	var b strings.Builder
	for _, s := range spans {
		fmt.Fprintf(&b, "%s; ", s.Name())
	}
	return b.String()
}
