package proxy

import (
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmgw/llmgw/router/endpoint"
)

// startAttempt starts an attempt's client span under the request's span
// (design §9 "Tracing") and writes its W3C traceparent on the request the
// engine gets, replacing the client's: the engine's span is then the
// attempt's child. A request the router does not trace (req.Tracer nil, or
// no span in its context) is returned as it is, with its headers as they
// came. One sampled out has no attempt span — nothing would record it —
// and the engine is sent the request's own context, flagged unsampled, so
// it does not sample the request either. The attempt's request shares r's
// header: r is the request's alone, and attempts run one at a time.
func startAttempt(r *http.Request, req *Request, ep *endpoint.Endpoint, n int) (*http.Request, trace.Span) {
	if req.Tracer == nil {
		return r, nil
	}
	parent := trace.SpanFromContext(r.Context())
	if !parent.SpanContext().IsValid() {
		return r, nil
	}
	delete(r.Header, "Tracestate") // the client's, for a span that is not the engine's parent
	if !parent.IsRecording() {
		r.Header["Traceparent"] = []string{Traceparent(parent.SpanContext())}
		return r, nil
	}
	ctx, sp := req.Tracer.Start(r.Context(), "llmgw.attempt", clientKind)
	kv := []attribute.KeyValue{attribute.String("llmgw.replica", ep.ReplicaID), attribute.Int("llmgw.attempt", n),
		attribute.String("llmgw.model", ep.Model)}
	if host, port, err := net.SplitHostPort(ep.Address); err == nil {
		kv = append(kv, attribute.String("server.address", host))
		if p, err := strconv.Atoi(port); err == nil {
			kv = append(kv, attribute.Int("server.port", p))
		}
	}
	sp.SetAttributes(kv...)
	r.Header["Traceparent"] = []string{Traceparent(sp.SpanContext())}
	return r.WithContext(ctx), sp
}

// clientKind is the attempt span's start option, made once.
var clientKind = trace.WithSpanKind(trace.SpanKindClient)

// Traceparent is sc as W3C Trace Context's traceparent, version 00 (what
// propagation.TraceContext writes, without its header canonicalization
// and formatting: one string per attempt). router/api writes an unsampled
// request's with it too.
func Traceparent(sc trace.SpanContext) string {
	var b [55]byte // 00-<32 hex>-<16 hex>-<2 hex>
	tid, sid := sc.TraceID(), sc.SpanID()
	copy(b[:3], "00-")
	hex.Encode(b[3:35], tid[:])
	b[35] = '-'
	hex.Encode(b[36:52], sid[:])
	b[52] = '-'
	flags := [1]byte{byte(sc.TraceFlags() & trace.FlagsSampled)}
	hex.Encode(b[53:55], flags[:])
	return string(b[:])
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
