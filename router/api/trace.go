package api

import (
	"context"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmgw/llmgw/router/director"
	"github.com/llmgw/llmgw/router/openai"
	"github.com/llmgw/llmgw/router/proxy"
	"github.com/llmgw/llmgw/router/scheduler"
)

// Tracing (design §9 "Tracing"). With Config.Tracer set, every inference
// request has a server span, continued from the client's W3C traceparent
// or started here (the provider's sampler decides, parent-based); each
// stage that can take time is a child span (waiting room, resolve,
// prepare with tier 2's tokenize and index lookup as events, the tenant's
// admission, flow control's queue), the scheduler's filters, scorers and
// picker are events, and each attempt is router/proxy's client span whose
// context goes to the engine. Attributes are the OTel GenAI semantic
// conventions' (gen_ai.operation.name, gen_ai.request.model,
// gen_ai.usage.input_tokens, gen_ai.usage.output_tokens) and llmgw's own
// counts and names; no span ever carries prompt or answer text.
//
// Without a tracer nothing here runs: each hook is behind h.tracer != nil
// or a span that records, so tracing off costs a nil check.

// tracerName is the instrumentation scope of the router's spans.
const tracerName = "github.com/llmgw/llmgw/router"

// opName is gen_ai.operation.name for requests of api.
func opName(api openai.API) string {
	switch api {
	case openai.Completions:
		return "text_completion"
	case openai.Embeddings:
		return "embeddings"
	case openai.CountTokens:
		return "count_tokens"
	}
	return "chat"
}

// serverKind is the request span's start option, made once.
var serverKind = trace.WithSpanKind(trace.SpanKindServer)

// startRequestSpan starts the request's server span, continuing the
// client's traceparent, and returns the request carrying it when it is
// recorded (r itself, with the engine's traceparent set, when not).
func (h *Handler) startRequestSpan(r *http.Request, api openai.API, id string) (*http.Request, trace.Span) {
	ctx := r.Context()
	if _, ok := r.Header["Traceparent"]; ok { // Extract's lookup would canonicalize the key, allocating
		ctx = propagation.TraceContext{}.Extract(ctx, propagation.HeaderCarrier(r.Header))
	}
	op := opName(api)
	ctx, sp := h.tracer.Start(ctx, op, serverKind)
	if !sp.IsRecording() {
		// Not sampled: nothing records the request, so it keeps the
		// context it came with — the request's copy would be the dearest
		// part of an unsampled request — and the engine is told the
		// decision here, in the traceparent the proxy passes on as it
		// came (router/proxy startAttempt, which writes the same for a
		// span that does not record): the engine samples it out too.
		if sc := sp.SpanContext(); sc.IsValid() {
			delete(r.Header, "Tracestate") // the client's, for a span that is not the engine's parent
			r.Header["Traceparent"] = []string{proxy.Traceparent(sc)}
		}
		return r, sp
	}
	sp.SetAttributes(attribute.String("gen_ai.operation.name", op),
		attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path),
		attribute.String("llmgw.request_id", id))
	return r.WithContext(ctx), sp
}

// endRequestSpan records on the request's span the status the client got;
// ServeHTTP ends it.
func endRequestSpan(sp trace.Span, code int) {
	sp.SetAttributes(attribute.Int("http.response.status_code", code))
	if code >= 500 {
		sp.SetStatus(codes.Error, http.StatusText(code))
	}
}

// recording is the request's span when it is recorded, nil otherwise (no
// tracer, or not sampled): the hooks of run are behind it.
func (h *Handler) recording(r *http.Request) trace.Span {
	if h.tracer == nil {
		return nil
	}
	if sp := trace.SpanFromContext(r.Context()); sp.IsRecording() {
		return sp
	}
	return nil
}

// stageSpanMin is how long a stage must take to be a span of its own: a
// quicker one is an event of the request's span with its duration, which
// costs a tenth of a span to record and export, and says as much (most
// stages take microseconds; the ones that wait — the waiting room, a cold
// adapter, tokenizing, flow control's queue — are the ones worth a span).
const stageSpanMin = time.Millisecond

// stage is one stage of a traced request, begun; nil when the request is
// not recorded.
type stage struct {
	req   trace.Span
	tr    trace.Tracer
	name  string
	start time.Time
}

// stage begins a stage of the request whose span is req (nil: not
// recorded, and so is the stage).
func (h *Handler) stage(req trace.Span, name string) *stage {
	if req == nil {
		return nil
	}
	return &stage{req: req, tr: h.tracer, name: name, start: time.Now()}
}

// end ends the stage, with the refusal that ended the request there, if
// any: a child span of the request's from the stage's start when it took
// stageSpanMin or more or refused the request, else an event.
func (st *stage) end(refusal *openai.Error, kv ...attribute.KeyValue) {
	now := time.Now()
	d := now.Sub(st.start)
	if d < stageSpanMin && refusal == nil {
		st.req.AddEvent(st.name, trace.WithTimestamp(now),
			trace.WithAttributes(append(kv, attribute.Int64("llmgw.duration_us", d.Microseconds()))...))
		return
	}
	_, sp := st.tr.Start(trace.ContextWithSpan(context.Background(), st.req), st.name, trace.WithTimestamp(st.start))
	sp.SetAttributes(kv...)
	if refusal != nil {
		sp.SetAttributes(attribute.Int("http.response.status_code", refusal.Status),
			attribute.String("error.type", refusal.Type))
		sp.SetStatus(codes.Error, refusal.Type)
	}
	sp.End(trace.WithTimestamp(now))
}

// resolved records what the name resolved to on the request's span, and
// names it as the GenAI conventions do: "{operation} {model}".
func resolved(sp trace.Span, api openai.API, tgt director.Target) {
	sp.SetName(opName(api) + " " + tgt.Base)
	sp.SetAttributes(attribute.String("llmgw.model", tgt.Base), attribute.String("llmgw.adapter", tgt.Adapter),
		attribute.String("llmgw.alias", tgt.Alias), attribute.Int("llmgw.replicas", len(tgt.Endpoints)))
}

// prepared is what stage 3 worked out, as the prepare span's attributes.
func prepared(plan *director.Plan) []attribute.KeyValue {
	t := plan.Traced()
	kv := []attribute.KeyValue{attribute.Int("llmgw.prefix_chunks", t.PrefixChunks), attribute.Bool("llmgw.kv.asked", t.Tier2)}
	if t.Tier2 {
		kv = append(kv, attribute.String("llmgw.kv.fallback", t.Fallback), attribute.Int("llmgw.prompt_tokens", t.Tokens),
			attribute.Int("llmgw.kv.blocks", t.Blocks), attribute.Int("llmgw.kv.best_match", t.BestMatch))
	}
	return kv
}

// schedTrace writes the scheduler's steps as events of the request's span
// (scheduler.Tracer): one per filter, scorer and picker of each attempt.
type schedTrace struct{ sp trace.Span }

func (s schedTrace) Filtered(filter string, left int) {
	s.sp.AddEvent("llmgw.scheduler.filter", trace.WithAttributes(attribute.String("llmgw.filter", filter),
		attribute.Int("llmgw.candidates_left", left)))
}

func (s schedTrace) Scored(scorer string, weight float64, scores []float64) {
	lo, hi := 0.0, 0.0
	for i, v := range scores {
		if i == 0 || v < lo {
			lo = v
		}
		if i == 0 || v > hi {
			hi = v
		}
	}
	s.sp.AddEvent("llmgw.scheduler.score", trace.WithAttributes(attribute.String("llmgw.scorer", scorer),
		attribute.Float64("llmgw.weight", weight), attribute.Float64("llmgw.score_min", lo), attribute.Float64("llmgw.score_max", hi)))
}

func (s schedTrace) Picked(picker string, chosen scheduler.Key, score float64, candidates int) {
	s.sp.AddEvent("llmgw.scheduler.pick", trace.WithAttributes(attribute.String("llmgw.picker", picker),
		attribute.String("llmgw.replica", chosen.ID), attribute.Float64("llmgw.score", score),
		attribute.Int("llmgw.candidates", candidates)))
}

// usageAttrs are the answer's token counts as the GenAI conventions name
// them.
func usageAttrs(sp trace.Span, plan *director.Plan) {
	if u, ok := plan.Usage(); ok {
		kv := []attribute.KeyValue{attribute.Int("gen_ai.usage.input_tokens", u.PromptTokens),
			attribute.Int("gen_ai.usage.output_tokens", u.CompletionTokens)}
		if u.PromptTokensDetails != nil {
			kv = append(kv, attribute.Int("llmgw.usage.cached_tokens", u.PromptTokensDetails.CachedTokens))
		}
		sp.SetAttributes(kv...)
	}
}
