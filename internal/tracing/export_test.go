package tracing

import (
	"context"
	"net"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
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

	sdkRecv, wireRecv := startReceiver(t), startReceiver(t)
	sdkExp, err := otlptracegrpc.New(context.Background(), otlptracegrpc.WithEndpoint(sdkRecv.addr), otlptracegrpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	wireExp, err := newWireExporter(wireRecv.addr, insecure.NewCredentials())
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
	if len(sdkRecv.got) != 1 || len(wireRecv.got) != 1 {
		t.Fatalf("the wire exporter sent %d requests, the SDK's %d; want 1", len(wireRecv.got), len(sdkRecv.got))
	}
	if got, want := wireRecv.got[0], sdkRecv.got[0]; !proto.Equal(got, want) {
		t.Errorf("sent\n%v\nwant the SDK's\n%v", got, want)
	}
}

// receiver is a collector's trace service keeping each request.
type receiver struct {
	collectorpb.UnimplementedTraceServiceServer
	addr string
	got  []*collectorpb.ExportTraceServiceRequest
}

func (r *receiver) Export(_ context.Context, req *collectorpb.ExportTraceServiceRequest) (*collectorpb.ExportTraceServiceResponse, error) {
	r.got = append(r.got, req) // one exporter, one call at a time
	return &collectorpb.ExportTraceServiceResponse{}, nil
}

func startReceiver(t *testing.T) *receiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &receiver{addr: ln.Addr().String()}
	srv := grpc.NewServer()
	collectorpb.RegisterTraceServiceServer(srv, r)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return r
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
