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
// sent and keeps none, so the receiver's own work is only gRPC's.
func StartDiscarding(t testing.TB) *Receiver { return start(t, true) }

func start(t testing.TB, discard bool) *Receiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("tracingtest: listen: %v", err)
	}
	r := &Receiver{addr: ln.Addr().String(), srv: grpc.NewServer(), discard: discard}
	collectorpb.RegisterTraceServiceServer(r.srv, r)
	done := make(chan struct{})
	go func() { defer close(done); _ = r.srv.Serve(ln) }()
	t.Cleanup(func() { r.srv.Stop(); <-done })
	return r
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
