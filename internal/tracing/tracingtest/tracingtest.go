// Package tracingtest is an in-process OTLP/gRPC trace receiver for tests:
// the collector's TraceService on 127.0.0.1:0, keeping every span it is
// sent, so a test reads back what real processes exported.
package tracingtest

import (
	"context"
	"encoding/hex"
	"net"
	"strconv"
	"sync"
	"testing"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// Span is one exported span, flattened: its service (resource
// service.name), ids in hex, and its attributes and events' names as
// strings (every value formatted as text).
type Span struct {
	Service  string
	Name     string
	TraceID  string
	SpanID   string
	ParentID string
	Kind     tracepb.Span_SpanKind
	Attrs    map[string]string
	Events   []Event
	// Raw is the span as received, for what the flattening drops.
	Raw *tracepb.Span
}

// Event is one span event.
type Event struct {
	Name  string
	Attrs map[string]string
}

// Receiver is the TraceService of an OpenTelemetry Collector. Safe for
// concurrent use.
type Receiver struct {
	collectorpb.UnimplementedTraceServiceServer
	addr string
	srv  *grpc.Server

	// discard counts spans without keeping them (StartDiscarding).
	discard bool

	mu    sync.Mutex
	spans []Span
	count int
}

// Start serves a receiver on 127.0.0.1:0 until the test ends.
func Start(t testing.TB) *Receiver { return start(t, false) }

// StartDiscarding is Start for a benchmark: it counts the spans it is
// sent and keeps none, so the receiver's own work is only gRPC's. It does
// not decode the batches into messages: it counts their spans off the
// wire, because a benchmark of the exporting process should not pay the
// decoding a real collector does in its own process.
func StartDiscarding(t testing.TB) *Receiver { return start(t, true) }

func start(t testing.TB, discard bool) *Receiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("tracingtest: listen: %v", err)
	}
	r, stop := Serve(ln, discard)
	t.Cleanup(stop)
	return r
}

// Serve serves a receiver on ln until stop is called, which waits for it:
// for a benchmark script's collector (scripts/otlpsink), where no test
// owns it. discard is StartDiscarding's.
func Serve(ln net.Listener, discard bool) (r *Receiver, stop func()) {
	r = &Receiver{addr: ln.Addr().String(), discard: discard}
	if discard {
		// No service registered: every call is the unknown-service
		// handler's, whose messages are the raw bytes.
		r.srv = grpc.NewServer(grpc.ForceServerCodecV2(rawCodec{}), grpc.UnknownServiceHandler(r.exportRaw))
	} else {
		r.srv = grpc.NewServer()
		collectorpb.RegisterTraceServiceServer(r.srv, r)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = r.srv.Serve(ln) }()
	return r, func() { r.srv.Stop(); <-done }
}

// Addr is the receiver's host:port, for an otlp_endpoint.
func (r *Receiver) Addr() string { return r.addr }

// Export keeps the spans of a batch.
func (r *Receiver) Export(_ context.Context, req *collectorpb.ExportTraceServiceRequest) (*collectorpb.ExportTraceServiceResponse, error) {
	if r.discard {
		n := 0
		for _, rs := range req.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				n += len(ss.GetSpans())
			}
		}
		r.mu.Lock()
		r.count += n
		r.mu.Unlock()
		return &collectorpb.ExportTraceServiceResponse{}, nil
	}
	var got []Span
	for _, rs := range req.GetResourceSpans() {
		svc := attrs(rs.GetResource().GetAttributes())["service.name"]
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{Service: svc, Name: s.GetName(), TraceID: hex.EncodeToString(s.GetTraceId()),
					SpanID: hex.EncodeToString(s.GetSpanId()), ParentID: hex.EncodeToString(s.GetParentSpanId()),
					Kind: s.GetKind(), Attrs: attrs(s.GetAttributes()), Raw: s}
				for _, e := range s.GetEvents() {
					sp.Events = append(sp.Events, Event{Name: e.GetName(), Attrs: attrs(e.GetAttributes())})
				}
				got = append(got, sp)
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	r.count += len(got)
	r.mu.Unlock()
	return &collectorpb.ExportTraceServiceResponse{}, nil
}

// exportRaw is Export for StartDiscarding: it counts the spans of the
// batch on the wire and answers an empty ExportTraceServiceResponse.
func (r *Receiver) exportRaw(_ any, stream grpc.ServerStream) error {
	var msg rawMsg
	if err := stream.RecvMsg(&msg); err != nil {
		return err
	}
	n := countSpans(msg.b)
	r.mu.Lock()
	r.count += n
	r.mu.Unlock()
	return stream.SendMsg(&rawMsg{})
}

// countSpans counts the spans of an ExportTraceServiceRequest's bytes:
// resource_spans (1) → scope_spans (2) → spans (2), without decoding.
func countSpans(b []byte) int {
	n := 0
	forEach(b, 1, func(rs []byte) {
		forEach(rs, 2, func(ss []byte) {
			forEach(ss, 2, func([]byte) { n++ })
		})
	})
	return n
}

// forEach calls f with each length-delimited field numbered num of the
// message b; it stops at the first malformed field.
func forEach(b []byte, num protowire.Number, f func([]byte)) {
	for len(b) > 0 {
		n, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return
		}
		b = b[l:]
		if typ == protowire.BytesType && n == num {
			v, l := protowire.ConsumeBytes(b)
			if l < 0 {
				return
			}
			f(v)
			b = b[l:]
			continue
		}
		l = protowire.ConsumeFieldValue(n, typ, b)
		if l < 0 {
			return
		}
		b = b[l:]
	}
}

// rawMsg is a message as its bytes (rawCodec).
type rawMsg struct{ b []byte }

// rawCodec passes messages through as bytes, for StartDiscarding.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.(*rawMsg).b)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	v.(*rawMsg).b = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// Count is how many spans were received so far.
func (r *Receiver) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.count
}

// Spans returns a copy of every span received so far (none when
// discarding).
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

func attrs(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		m[kv.GetKey()] = text(kv.GetValue())
	}
	return m
}

// text formats an attribute value.
func text(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return itoa(x.IntValue)
	case *commonpb.AnyValue_BoolValue:
		if x.BoolValue {
			return "true"
		}
		return "false"
	case *commonpb.AnyValue_DoubleValue:
		return ftoa(x.DoubleValue)
	}
	return v.String()
}

func itoa(n int64) string   { return strconv.FormatInt(n, 10) }
func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
