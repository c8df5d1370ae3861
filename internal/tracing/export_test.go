package tracing

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/internal/tracing/tracingtest"
)

// TestWireExporterMatchesSDK: the wire exporter sends the very spans the
// SDK's OTLP/gRPC exporter sends — every attribute type, events, links,
// status, a remote parent, a trace state, two scopes — as a collector
// decodes them.
func TestWireExporterMatchesSDK(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "svc"), attribute.Int("n", 3))))
	ts, err := trace.ParseTraceState("vendor=x")
	if err != nil {
		t.Fatal(err)
	}
	remote := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5},
		TraceFlags: trace.FlagsSampled, TraceState: ts, Remote: true})
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), remote)
	all := []attribute.KeyValue{attribute.Bool("b", true), attribute.Bool("f", false), attribute.Int("i", -7), attribute.Int("zero", 0),
		attribute.Float64("d", 2.5), attribute.String("s", "x"), attribute.String("long", strings.Repeat("x", 300)),
		attribute.BoolSlice("bs", []bool{true, false}), attribute.IntSlice("is", []int{1, -2}),
		attribute.Float64Slice("ds", []float64{0.5}), attribute.StringSlice("ss", []string{"a", "b"})}
	// The SDK's exporter drops a link's trace state; the wire exporter
	// sends it.
	link := trace.Link{SpanContext: remote.WithTraceState(trace.TraceState{}), Attributes: []attribute.KeyValue{attribute.String("l", "1")}}
	ctx, root := tp.Tracer("scope-a", trace.WithInstrumentationVersion("v1")).Start(ctx, "root", trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(all...), trace.WithLinks(link))
	root.AddEvent("ev", trace.WithAttributes(all...))
	root.AddEvent("bare")
	_, child := tp.Tracer("scope-b").Start(ctx, "child", trace.WithSpanKind(trace.SpanKindClient))
	child.SetStatus(codes.Error, "broke")
	child.End()
	root.SetStatus(codes.Ok, "")
	root.End()
	spans := rec.Ended()

	sdkRecv, wireRecv := tracingtest.Start(t), tracingtest.Start(t)
	sdkExp, err := otlptracegrpc.New(context.Background(), otlptracegrpc.WithEndpoint(sdkRecv.Addr()), otlptracegrpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	wireExp, err := newWireExporter(wireRecv.Addr(), insecure.NewCredentials())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []sdktrace.SpanExporter{sdkExp, wireExp} {
		if err := e.ExportSpans(context.Background(), spans); err != nil {
			t.Fatal(err)
		}
		if err := e.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	want, got := sdkRecv.Spans(), wireRecv.Spans()
	if len(got) != 2 || len(want) != 2 {
		t.Fatalf("the wire exporter sent %d spans, the SDK's %d; want 2", len(got), len(want))
	}
	byName := map[string]tracingtest.Span{}
	for _, s := range want {
		byName[s.Name] = s
	}
	for _, g := range got {
		w := byName[g.Name]
		if g.Service != w.Service || !proto.Equal(g.Raw, w.Raw) {
			t.Errorf("span %s:\n got %s %v\nwant %s %v", g.Name, g.Service, g.Raw, w.Service, w.Raw)
		}
	}
}

// TestEndMsgLongLengths: a field longer than 127 bytes (a two-byte length)
// and one longer than 16 KiB (three bytes) are framed right.
func TestEndMsgLongLengths(t *testing.T) {
	for _, n := range []int{0, 1, 127, 128, 300, 16383, 16384, 70000} {
		b, m := beginMsg([]byte{0xAA}, 5)
		b = append(b, make([]byte, n)...)
		b = endMsg(b, m)
		want := []byte{0xAA, 5<<3 | 2}
		want = appendVarintForTest(want, uint64(n))
		want = append(want, make([]byte, n)...)
		if string(b) != string(want) {
			t.Errorf("length %d: framed wrong", n)
		}
	}
}

func appendVarintForTest(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}
