package sim

import (
	"io"
	"net/http"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestTraceSpan: each generation is one llm_request span as vLLM's, the
// child of the traceparent it came with, with the token counts and no
// text; a traceparent that says "not sampled" is followed.
func TestTraceSpan(t *testing.T) {
	const secret = "my-private-question-9931"
	tests := []struct {
		name, traceparent string
		want              bool
	}{
		{"child of the router's attempt", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", true},
		{"no traceparent: a trace of its own", "", true},
		{"not sampled by the caller", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
			_, ts := newTestServer(t, testConfig(), WithTracerProvider(tp))
			req, _ := http.NewRequest(http.MethodPost, ts.URL+"/v1/chat/completions",
				strings.NewReader(`{"model":"llama","max_tokens":5,"messages":[{"role":"user","content":"`+secret+`"}]}`))
			if tt.traceparent != "" {
				req.Header.Set("Traceparent", tt.traceparent)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			spans := rec.Ended()
			if !tt.want {
				if len(spans) != 0 {
					t.Fatalf("%d spans for an unsampled request", len(spans))
				}
				return
			}
			if len(spans) != 1 {
				t.Fatalf("%d spans, want 1", len(spans))
			}
			s := spans[0]
			if s.Name() != "llm_request" || s.SpanKind() != trace.SpanKindServer {
				t.Fatalf("span %q kind %v", s.Name(), s.SpanKind())
			}
			if tt.traceparent != "" && (s.Parent().SpanID().String() != "00f067aa0ba902b7" ||
				s.SpanContext().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736") {
				t.Fatalf("parent %s trace %s; want the traceparent's", s.Parent().SpanID(), s.SpanContext().TraceID())
			}
			a := map[string]string{}
			for _, kv := range s.Attributes() {
				a[string(kv.Key)] = kv.Value.String()
				if strings.Contains(kv.Value.String(), secret) {
					t.Errorf("attribute %s carries the prompt", kv.Key)
				}
			}
			if a["gen_ai.usage.output_tokens"] != "5" || a["gen_ai.usage.completion_tokens"] != "5" ||
				a["gen_ai.usage.input_tokens"] == "" || a["gen_ai.response.model"] != "llama" || a["gen_ai.latency.time_to_first_token"] == "" {
				t.Fatalf("attributes %v", a)
			}
		})
	}
}

func TestTraceEndpoint(t *testing.T) {
	for _, tt := range []struct {
		in, endpoint string
		insecure, ok bool
	}{
		{"", "", false, true},
		{"http://127.0.0.1:4317", "127.0.0.1:4317", true, true},
		{"grpc://localhost:4317/", "localhost:4317", true, true},
		{"https://localhost:4317", "localhost:4317", false, true},
		{"127.0.0.1:4317", "127.0.0.1:4317", true, true},
		{"ftp://127.0.0.1:4317", "", false, false},
		{"http://127.0.0.1", "", false, false},
	} {
		c, err := TraceEndpoint(tt.in)
		if (err == nil) != tt.ok || (tt.ok && (c.OTLPEndpoint != tt.endpoint || c.Insecure != tt.insecure)) {
			t.Errorf("TraceEndpoint(%q) = %+v, %v", tt.in, c, err)
		}
	}
}
