package tracingtest_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/internal/tracing"
	"github.com/llmgw/llmgw/internal/tracing/tracingtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestExportAndSampling: spans reach an OTLP receiver; a parent's decision
// is kept whatever the ratio, and a ratio of 0 samples no new trace.
func TestExportAndSampling(t *testing.T) {
	recv := tracingtest.Start(t)
	p, err := tracing.New(context.Background(), tracing.Config{OTLPEndpoint: recv.Addr(), SamplingRatio: 0}, "svc")
	if err != nil {
		t.Fatal(err)
	}
	tr := p.TracerProvider().Tracer("t")
	// A new trace at ratio 0: not sampled, yet a valid context to pass on.
	_, root := tr.Start(context.Background(), "root")
	if root.IsRecording() || !root.SpanContext().IsValid() || root.SpanContext().IsSampled() {
		t.Fatalf("ratio 0: recording %v, context %v", root.IsRecording(), root.SpanContext())
	}
	root.End()
	// A sampled remote parent: kept.
	hdr := propagation.MapCarrier{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	ctx := tracing.Propagator.Extract(context.Background(), hdr)
	_, child := tr.Start(ctx, "child", trace.WithSpanKind(trace.SpanKindServer))
	if !child.IsRecording() {
		t.Fatal("a sampled parent's child is not recorded")
	}
	child.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Shutdown sent what was batched: the receiver holds it now.
	if n := len(recv.Spans()); n != 1 {
		t.Fatalf("the receiver holds %d spans after Shutdown, want the child's alone", n)
	}
	s := recv.Spans()[0]
	if s.Name != "child" || s.Service != "svc" || s.TraceID != "0af7651916cd43dd8448eb211c80319c" || s.ParentID != "b7ad6b7169203331" {
		t.Fatalf("got %+v", s)
	}
}

// TestDiscardingCounts: a discarding receiver counts the spans it is sent
// off the wire, and keeps none.
func TestDiscardingCounts(t *testing.T) {
	recv := tracingtest.StartDiscarding(t)
	p, err := tracing.New(context.Background(), tracing.Config{OTLPEndpoint: recv.Addr(), SamplingRatio: 1}, "svc")
	if err != nil {
		t.Fatal(err)
	}
	tr := p.TracerProvider().Tracer("t")
	for range 3 {
		ctx, root := tr.Start(context.Background(), "root")
		_, child := tr.Start(ctx, "child")
		child.AddEvent("e")
		child.End()
		root.End()
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n, kept := recv.Count(), len(recv.Spans()); n != 6 || kept != 0 {
		t.Fatalf("counted %d spans, kept %d; want 6 and none", n, kept)
	}
}
