package proxy

import (
	"errors"
	"net"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmgw/llmgw/router/endpoint"
)

// tracerName is the instrumentation scope of the attempts' spans.
const tracerName = "github.com/llmgw/llmgw/router/proxy"

// startAttempt starts an attempt's client span under the request's span
// (design §9 "Tracing") and writes its W3C traceparent on the request the
// engine gets, replacing the client's: the engine's span is then the
// attempt's child. A request the router does not trace (no span in its
// context) is returned as it is, with its headers as they came — one
// sampled out still carries its trace id, flagged unsampled, so the
// engine does not sample it either. The attempt's request shares r's
// header: r is the request's alone, and attempts run one at a time.
func startAttempt(r *http.Request, ep *endpoint.Endpoint, n int) (*http.Request, trace.Span) {
	parent := trace.SpanFromContext(r.Context())
	if !parent.SpanContext().IsValid() {
		return r, nil
	}
	ctx, sp := parent.TracerProvider().Tracer(tracerName).Start(r.Context(), "llmgw.attempt",
		trace.WithSpanKind(trace.SpanKindClient))
	if sp.IsRecording() {
		kv := []attribute.KeyValue{attribute.String("llmgw.replica", ep.ReplicaID), attribute.Int("llmgw.attempt", n),
			attribute.String("llmgw.model", ep.Model)}
		if host, port, err := net.SplitHostPort(ep.Address); err == nil {
			kv = append(kv, attribute.String("server.address", host))
			if p, err := strconv.Atoi(port); err == nil {
				kv = append(kv, attribute.Int("server.port", p))
			}
		}
		sp.SetAttributes(kv...)
	}
	delete(r.Header, "Tracestate") // the client's, for a span that is not the engine's parent
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(r.Header))
	return r.WithContext(ctx), sp
}

// endAttempt ends an attempt's span: the status the engine answered, when
// the first byte reached the client, or why the attempt failed.
func endAttempt(sp trace.Span, code int, first time.Time, err error) {
	if sp == nil {
		return
	}
	if sp.IsRecording() {
		if !first.IsZero() {
			sp.AddEvent("llmgw.first_byte", trace.WithTimestamp(first))
		}
		var dv *divertedError
		switch {
		case errors.As(err, &dv):
			sp.SetAttributes(attribute.Int("http.response.status_code", dv.code), attribute.Bool("llmgw.diverted", true))
		case err != nil:
			sp.SetStatus(codes.Error, err.Error())
			sp.SetAttributes(attribute.String("error.type", "attempt_failed"))
		default:
			sp.SetAttributes(attribute.Int("http.response.status_code", code))
			if code >= 500 {
				sp.SetStatus(codes.Error, http.StatusText(code))
			}
		}
	}
	sp.End()
}
