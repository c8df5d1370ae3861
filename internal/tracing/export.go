package tracing

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// exportMethod is the OTLP/gRPC trace service's one method.
const exportMethod = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"

// exportTimeout bounds one batch's call, as the SDK's OTLP exporter's
// default does.
const exportTimeout = 10 * time.Second

// wireExporter sends the batch processor's spans to an OTLP/gRPC trace
// receiver, writing the ExportTraceServiceRequest's protobuf wire bytes
// straight from the SDK's spans into one buffer it reuses. The SDK's own
// OTLP exporter builds a message tree first — three allocations per
// attribute, two per event — and marshals it by reflection, which is most
// of the CPU a sampled request costs the router (docs/benchmarks.md,
// "Tracing cost"). What is sent is the same message. A batch that fails
// is dropped, not retried: spans are best effort, and a collector that is
// down must not hold the batch processor (whose queue drops spans past
// its size, never blocks a request).
type wireExporter struct {
	cc *grpc.ClientConn

	mu     sync.Mutex // one batch at a time: buf is reused
	buf    []byte
	closed bool
}

// newWireExporter returns an exporter to endpoint (host:port) with creds;
// it connects on its first batch.
func newWireExporter(endpoint string, creds credentials.TransportCredentials) (*wireExporter, error) {
	cc, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, fmt.Errorf("gRPC client for %s: %w", endpoint, err)
	}
	return &wireExporter{cc: cc}, nil
}

// ExportSpans sends spans as one ExportTraceServiceRequest.
func (e *wireExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if len(spans) == 0 {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return errors.New("tracing: exporter shut down")
	}
	e.buf = appendRequest(e.buf[:0], spans)
	ctx, cancel := context.WithTimeout(ctx, exportTimeout)
	defer cancel()
	var resp rawMsg
	if err := e.cc.Invoke(ctx, exportMethod, &rawMsg{b: e.buf}, &resp, grpc.ForceCodecV2(rawCodec{})); err != nil {
		return fmt.Errorf("tracing: export %d spans: %w", len(spans), err)
	}
	if cap(e.buf) > maxKeptBuf {
		e.buf = nil // a rare huge batch's buffer is not kept
	}
	return nil
}

// maxKeptBuf is the largest batch buffer kept for the next batch.
const maxKeptBuf = 4 << 20

// Shutdown closes the connection.
func (e *wireExporter) Shutdown(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	if err := e.cc.Close(); err != nil {
		return fmt.Errorf("tracing: close exporter: %w", err)
	}
	return nil
}

// rawMsg is a gRPC message as its wire bytes (rawCodec).
type rawMsg struct{ b []byte }

// rawCodec sends and receives rawMsg as they are. Its name is "proto",
// so the receiver sees an ordinary protobuf call.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(*rawMsg)
	if !ok {
		return nil, fmt.Errorf("tracing: raw codec cannot marshal %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(m.b)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*rawMsg)
	if !ok {
		return fmt.Errorf("tracing: raw codec cannot unmarshal into %T", v)
	}
	m.b = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// The OTLP field numbers written below (opentelemetry/proto/trace/v1,
// common/v1, resource/v1).
const (
	fReqResourceSpans = 1 // ExportTraceServiceRequest.resource_spans

	fRSResource   = 1 // ResourceSpans
	fRSScopeSpans = 2
	fRSSchemaURL  = 3

	fResAttributes = 1 // Resource

	fSSScope     = 1 // ScopeSpans
	fSSSpans     = 2
	fSSSchemaURL = 3

	fScopeName    = 1 // InstrumentationScope
	fScopeVersion = 2
	fScopeAttrs   = 3

	fSpanTraceID      = 1 // Span
	fSpanSpanID       = 2
	fSpanTraceState   = 3
	fSpanParentSpanID = 4
	fSpanName         = 5
	fSpanKind         = 6
	fSpanStart        = 7
	fSpanEnd          = 8
	fSpanAttributes   = 9
	fSpanDroppedAttrs = 10
	fSpanEvents       = 11
	fSpanDroppedEvts  = 12
	fSpanLinks        = 13
	fSpanDroppedLinks = 14
	fSpanStatus       = 15
	fSpanFlags        = 16

	fEventTime    = 1 // Span.Event
	fEventName    = 2
	fEventAttrs   = 3
	fEventDropped = 4

	fLinkTraceID    = 1 // Span.Link
	fLinkSpanID     = 2
	fLinkTraceState = 3
	fLinkAttrs      = 4
	fLinkDropped    = 5
	fLinkFlags      = 6

	fStatusMessage = 2 // Status
	fStatusCode    = 3

	fKVKey   = 1 // KeyValue
	fKVValue = 2

	fAnyString = 1 // AnyValue
	fAnyBool   = 2
	fAnyInt    = 3
	fAnyDouble = 4
	fAnyArray  = 5
	fAnyKVList = 6
	fAnyBytes  = 7

	fListValues = 1 // ArrayValue.values, KeyValueList.values
)

// OTLP's span flags: the W3C flags, and whether the parent was remote.
const (
	flagHasIsRemote = 0x100
	flagIsRemote    = 0x200
)

// appendRequest appends spans as an ExportTraceServiceRequest: one
// ResourceSpans per run of spans with the same resource, one ScopeSpans
// per run with the same instrumentation scope within it (a provider's
// spans share its resource, and a component's mostly one scope).
func appendRequest(b []byte, spans []sdktrace.ReadOnlySpan) []byte {
	for i := 0; i < len(spans); {
		res := spans[i].Resource()
		var rs int
		b, rs = beginMsg(b, fReqResourceSpans)
		b = appendResource(b, res)
		for i < len(spans) && sameResource(spans[i].Resource(), res) {
			scope := spans[i].InstrumentationScope()
			var ss int
			b, ss = beginMsg(b, fRSScopeSpans)
			b = appendScope(b, scope)
			for i < len(spans) && sameResource(spans[i].Resource(), res) && spans[i].InstrumentationScope() == scope {
				var sp int
				b, sp = beginMsg(b, fSSSpans)
				b = appendSpan(b, spans[i])
				b = endMsg(b, sp)
				i++
			}
			b = appendString(b, fSSSchemaURL, scope.SchemaURL)
			b = endMsg(b, ss)
		}
		if res != nil {
			b = appendString(b, fRSSchemaURL, res.SchemaURL())
		}
		b = endMsg(b, rs)
	}
	return b
}

// sameResource reports whether a and b are one resource: the same pointer,
// as a provider's spans share, or equal attributes.
func sameResource(a, b *resource.Resource) bool {
	return a == b || (a != nil && b != nil && a.Equal(b))
}

func appendResource(b []byte, res *resource.Resource) []byte {
	if res == nil {
		return b
	}
	var m int
	b, m = beginMsg(b, fRSResource)
	for it := res.Iter(); it.Next(); {
		b = appendKeyValue(b, fResAttributes, it.Attribute())
	}
	return endMsg(b, m)
}

func appendScope(b []byte, s instrumentation.Scope) []byte {
	var m int
	b, m = beginMsg(b, fSSScope)
	b = appendString(b, fScopeName, s.Name)
	b = appendString(b, fScopeVersion, s.Version)
	for it := s.Attributes.Iter(); it.Next(); {
		b = appendKeyValue(b, fScopeAttrs, it.Attribute())
	}
	return endMsg(b, m)
}

func appendSpan(b []byte, s sdktrace.ReadOnlySpan) []byte {
	sc := s.SpanContext()
	tid, sid := sc.TraceID(), sc.SpanID()
	b = appendBytes(b, fSpanTraceID, tid[:])
	b = appendBytes(b, fSpanSpanID, sid[:])
	if ts := sc.TraceState(); ts.Len() > 0 {
		b = appendString(b, fSpanTraceState, ts.String())
	}
	parent := s.Parent()
	if psid := parent.SpanID(); psid.IsValid() {
		b = appendBytes(b, fSpanParentSpanID, psid[:])
	}
	b = appendString(b, fSpanName, s.Name())
	if k := otlpKind(s.SpanKind()); k != 0 {
		b = protowire.AppendTag(b, fSpanKind, protowire.VarintType)
		b = protowire.AppendVarint(b, k)
	}
	b = appendFixed64(b, fSpanStart, unixNano(s.StartTime()))
	b = appendFixed64(b, fSpanEnd, unixNano(s.EndTime()))
	for _, kv := range s.Attributes() {
		b = appendKeyValue(b, fSpanAttributes, kv)
	}
	b = appendUint(b, fSpanDroppedAttrs, s.DroppedAttributes())
	for _, ev := range s.Events() {
		var m int
		b, m = beginMsg(b, fSpanEvents)
		b = appendFixed64(b, fEventTime, unixNano(ev.Time))
		b = appendString(b, fEventName, ev.Name)
		for _, kv := range ev.Attributes {
			b = appendKeyValue(b, fEventAttrs, kv)
		}
		b = appendUint(b, fEventDropped, ev.DroppedAttributeCount)
		b = endMsg(b, m)
	}
	b = appendUint(b, fSpanDroppedEvts, s.DroppedEvents())
	for _, l := range s.Links() {
		var m int
		b, m = beginMsg(b, fSpanLinks)
		ltid, lsid := l.SpanContext.TraceID(), l.SpanContext.SpanID()
		b = appendBytes(b, fLinkTraceID, ltid[:])
		b = appendBytes(b, fLinkSpanID, lsid[:])
		if ts := l.SpanContext.TraceState(); ts.Len() > 0 {
			b = appendString(b, fLinkTraceState, ts.String())
		}
		for _, kv := range l.Attributes {
			b = appendKeyValue(b, fLinkAttrs, kv)
		}
		b = appendUint(b, fLinkDropped, l.DroppedAttributeCount)
		b = appendFixed32(b, fLinkFlags, spanFlags(l.SpanContext.TraceFlags(), l.SpanContext))
		b = endMsg(b, m)
	}
	b = appendUint(b, fSpanDroppedLinks, s.DroppedLinks())
	var m int
	b, m = beginMsg(b, fSpanStatus)
	st := s.Status()
	b = appendString(b, fStatusMessage, st.Description)
	if c := otlpStatus(st.Code); c != 0 {
		b = protowire.AppendTag(b, fStatusCode, protowire.VarintType)
		b = protowire.AppendVarint(b, c)
	}
	b = endMsg(b, m)
	return appendFixed32(b, fSpanFlags, spanFlags(sc.TraceFlags(), parent))
}

// spanFlags are OTLP's flags of a span (or link) with W3C flags tf whose
// parent is parent, as the SDK's exporter writes them.
func spanFlags(tf trace.TraceFlags, parent trace.SpanContext) uint32 {
	f := uint32(tf) | flagHasIsRemote
	if parent.IsRemote() {
		f |= flagIsRemote
	}
	return f
}

// otlpKind is Span.SpanKind's number: the API's kinds are numbered as
// OTLP's are, and anything else is unspecified (0).
func otlpKind(k trace.SpanKind) uint64 {
	if k >= trace.SpanKindInternal && k <= trace.SpanKindConsumer {
		return uint64(k)
	}
	return 0
}

// otlpStatus is Status.StatusCode's number: OTLP numbers OK 1 and ERROR
// 2, the API the other way round.
func otlpStatus(c codes.Code) uint64 {
	switch c {
	case codes.Ok:
		return 1
	case codes.Error:
		return 2
	}
	return 0
}

func unixNano(t time.Time) uint64 { return uint64(max(0, t.UnixNano())) } //nolint:gosec // not negative

func appendKeyValue(b []byte, num protowire.Number, kv attribute.KeyValue) []byte {
	var m int
	b, m = beginMsg(b, num)
	b = appendString(b, fKVKey, string(kv.Key))
	b = appendValue(b, fKVValue, kv.Value)
	return endMsg(b, m)
}

// appendValue appends v as an AnyValue field num, as the SDK's exporter
// converts it: an empty value is an empty AnyValue, an unknown type the
// string "INVALID".
func appendValue(b []byte, num protowire.Number, v attribute.Value) []byte {
	var m int
	b, m = beginMsg(b, num)
	switch v.Type() {
	case attribute.BOOL:
		b = protowire.AppendTag(b, fAnyBool, protowire.VarintType)
		b = protowire.AppendVarint(b, protowire.EncodeBool(v.AsBool()))
	case attribute.INT64:
		b = protowire.AppendTag(b, fAnyInt, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(v.AsInt64())) //nolint:gosec // int64's two's complement, as protobuf's int64
	case attribute.FLOAT64:
		b = protowire.AppendTag(b, fAnyDouble, protowire.Fixed64Type)
		b = protowire.AppendFixed64(b, math.Float64bits(v.AsFloat64()))
	case attribute.STRING:
		b = protowire.AppendTag(b, fAnyString, protowire.BytesType)
		b = protowire.AppendString(b, v.AsString())
	case attribute.BYTESLICE:
		b = protowire.AppendTag(b, fAnyBytes, protowire.BytesType)
		b = protowire.AppendBytes(b, v.AsByteSlice())
	case attribute.BOOLSLICE:
		b = appendArray(b, v.AsBoolSlice(), attribute.BoolValue)
	case attribute.INT64SLICE:
		b = appendArray(b, v.AsInt64Slice(), attribute.Int64Value)
	case attribute.FLOAT64SLICE:
		b = appendArray(b, v.AsFloat64Slice(), attribute.Float64Value)
	case attribute.STRINGSLICE:
		b = appendArray(b, v.AsStringSlice(), attribute.StringValue)
	case attribute.SLICE:
		b = appendArray(b, v.AsSlice(), func(v attribute.Value) attribute.Value { return v })
	case attribute.MAP:
		var l int
		b, l = beginMsg(b, fAnyKVList)
		for _, kv := range v.AsMap() {
			b = appendKeyValue(b, fListValues, kv)
		}
		b = endMsg(b, l)
	case attribute.EMPTY:
	default:
		b = protowire.AppendTag(b, fAnyString, protowire.BytesType)
		b = protowire.AppendString(b, "INVALID")
	}
	return endMsg(b, m)
}

// appendArray appends vs as AnyValue.array_value.
func appendArray[T any](b []byte, vs []T, val func(T) attribute.Value) []byte {
	var l int
	b, l = beginMsg(b, fAnyArray)
	for _, v := range vs {
		b = appendValue(b, fListValues, val(v))
	}
	return endMsg(b, l)
}

// beginMsg appends the tag of a length-delimited field num and one byte
// for its length, and returns where its content starts; endMsg writes the
// length once the content is appended.
func beginMsg(b []byte, num protowire.Number) ([]byte, int) {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = append(b, 0)
	return b, len(b)
}

// endMsg writes the length of the field begun at start (beginMsg's), moving
// its content along when the length takes more than the one byte kept.
func endMsg(b []byte, start int) []byte {
	n := len(b) - start
	if n < 0x80 {
		b[start-1] = byte(n)
		return b
	}
	extra := protowire.SizeVarint(uint64(n)) - 1
	for range extra {
		b = append(b, 0)
	}
	copy(b[start+extra:], b[start:start+n])
	protowire.AppendVarint(b[:start-1], uint64(n))
	return b
}

// appendString appends a string field, omitted when empty (proto3's
// default).
func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendBytes(b []byte, num protowire.Number, v []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

func appendFixed64(b []byte, num protowire.Number, v uint64) []byte {
	b = protowire.AppendTag(b, num, protowire.Fixed64Type)
	return protowire.AppendFixed64(b, v)
}

func appendFixed32(b []byte, num protowire.Number, v uint32) []byte {
	b = protowire.AppendTag(b, num, protowire.Fixed32Type)
	return protowire.AppendFixed32(b, v)
}

// appendUint appends a count (a uint32 field), omitted when 0.
func appendUint(b []byte, num protowire.Number, n int) []byte {
	if n <= 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, uint64(min(n, math.MaxUint32)))
}
