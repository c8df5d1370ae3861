package sim

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmgw/llmgw/internal/tracing"
)

// Tracing as vLLM's (design §8, §9 "Tracing"): with --otlp-traces-endpoint
// each generation request is one span named "llm_request", of kind
// server, the child of the request's W3C traceparent when it carries one
// (vllm/tracing.py extract_trace_context; its OutputProcessor makes the
// span at the request's end, from its arrival), with vLLM's gen_ai.*
// attributes and the OTel GenAI conventions' token counts. Like vLLM's
// sampler (otel's default, parent-based, always on) a request whose
// traceparent says "not sampled" is not traced; one without traceparent
// is. No prompt or output text is put on a span.

// simTracerName is the instrumentation scope: vLLM's.
const simTracerName = "vllm.llm_engine"

// TraceEndpoint reads --otlp-traces-endpoint as vLLM's exporter does: a
// URL whose scheme says plain text (http, grpc) or TLS (https), or a bare
// host:port (plain text here: the simulator is a test engine). It returns
// the tracing configuration of the simulator.
func TraceEndpoint(v string) (tracing.Config, error) {
	c := tracing.Config{SamplingRatio: 1}
	if v == "" {
		return c, nil
	}
	hostport, tls := v, false
	if scheme, rest, ok := strings.Cut(v, "://"); ok {
		switch scheme {
		case "http", "grpc":
		case "https":
			tls = true
		default:
			return c, fmt.Errorf("--otlp-traces-endpoint %q: scheme must be http, https or grpc", v)
		}
		hostport = strings.TrimSuffix(rest, "/")
	}
	if err := tracing.CheckEndpoint(hostport); err != nil {
		return c, fmt.Errorf("--otlp-traces-endpoint: %w", err)
	}
	c.OTLPEndpoint, c.Insecure = hostport, !tls
	return c, nil
}

// WithTracerProvider traces requests with tp instead of the provider
// --otlp-traces-endpoint would build (tests).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(s *Server) { s.tracer = tp.Tracer(simTracerName) }
}

// startTracing builds the provider --otlp-traces-endpoint names; nil
// when none is given or WithTracerProvider set one.
func (s *Server) startTracing() (*tracing.Provider, error) {
	if s.cfg.OTLPTracesEndpoint == "" || s.tracer != nil {
		return nil, nil
	}
	tc, err := TraceEndpoint(s.cfg.OTLPTracesEndpoint)
	if err != nil {
		return nil, err
	}
	p, err := tracing.New(context.Background(), tc, "vllm-sim")
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	s.tracer = p.TracerProvider().Tracer(simTracerName)
	return p, nil
}

// reqSpan is one request's llm_request span; nil when not traced.
type reqSpan struct {
	sp      trace.Span
	arrival time.Time
	first   time.Time
}

// startSpan starts the request's span at its arrival, under the
// traceparent it came with.
func (s *Server) startSpan(r *http.Request, g genRequest, arrival time.Time) *reqSpan {
	if s.tracer == nil {
		return nil
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.HeaderCarrier(r.Header))
	_, sp := s.tracer.Start(ctx, "llm_request", trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(arrival))
	if !sp.IsRecording() {
		sp.End()
		return nil
	}
	sp.SetAttributes(attribute.String("gen_ai.response.model", g.model), attribute.String("gen_ai.request.model", g.model),
		attribute.String("gen_ai.request.id", g.id), attribute.Int("gen_ai.request.max_tokens", g.maxTokens),
		attribute.Int("gen_ai.request.n", 1), attribute.String("server.address", s.cfg.Host))
	return &reqSpan{sp: sp, arrival: arrival}
}

// firstToken marks the first output token.
func (t *reqSpan) firstToken(now time.Time) {
	if t != nil && t.first.IsZero() {
		t.first = now
	}
}

// end ends the span with the request's usage; err set when its client
// went away.
func (t *reqSpan) end(now time.Time, u usage, finish string, err error) {
	if t == nil {
		return
	}
	kv := []attribute.KeyValue{
		attribute.Int("gen_ai.usage.prompt_tokens", u.prompt), attribute.Int("gen_ai.usage.completion_tokens", u.completion),
		attribute.Int("gen_ai.usage.input_tokens", u.prompt), attribute.Int("gen_ai.usage.output_tokens", u.completion),
		attribute.Int("gen_ai.usage.num_sequences", 1), attribute.Int("llmgw.sim.cached_tokens", u.cached),
		attribute.Float64("gen_ai.latency.e2e", now.Sub(t.arrival).Seconds()),
	}
	if !t.first.IsZero() {
		kv = append(kv, attribute.Float64("gen_ai.latency.time_to_first_token", t.first.Sub(t.arrival).Seconds()))
	}
	if finish != "" {
		kv = append(kv, attribute.StringSlice("gen_ai.response.finish_reasons", []string{finish}))
	}
	t.sp.SetAttributes(kv...)
	if err != nil {
		t.sp.SetStatus(codes.Error, "client went away")
	}
	t.sp.End(trace.WithTimestamp(now))
}
