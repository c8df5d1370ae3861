package proxy

import (
	"net/http"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// TestTraceparent: the attempt's traceparent is what otel's propagator
// writes, sampled or not.
func TestTraceparent(t *testing.T) {
	for _, flags := range []trace.TraceFlags{0, trace.FlagsSampled} {
		sc := trace.NewSpanContext(trace.SpanContextConfig{
			TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
			SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
			TraceFlags: flags,
		})
		h := http.Header{}
		propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(t.Context(), sc), propagation.HeaderCarrier(h))
		if got, want := Traceparent(sc), h.Get("Traceparent"); got != want {
			t.Errorf("traceparent = %q, want %q", got, want)
		}
	}
}
