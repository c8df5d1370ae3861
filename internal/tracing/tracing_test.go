package tracing_test

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/internal/tracing"
	"github.com/llmgw/llmgw/internal/tracing/tracingtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  tracing.Config
		want []string // the flags named, in order
	}{
		{"off", tracing.DefaultConfig(), nil},
		{"loopback", tracing.Config{OTLPEndpoint: "127.0.0.1:4317", SamplingRatio: 1}, nil},
		{"a name", tracing.Config{OTLPEndpoint: "localhost:4317", SamplingRatio: 0}, nil},
		{"ipv6 loopback", tracing.Config{OTLPEndpoint: "[::1]:4317", SamplingRatio: 0.5}, nil},
		{"no port", tracing.Config{OTLPEndpoint: "127.0.0.1", SamplingRatio: 1}, []string{"otlp-traces-endpoint"}},
		{"port 0", tracing.Config{OTLPEndpoint: "127.0.0.1:0", SamplingRatio: 1}, []string{"otlp-traces-endpoint"}},
		{"port not a number", tracing.Config{OTLPEndpoint: "localhost:otlp", SamplingRatio: 1}, []string{"otlp-traces-endpoint"}},
		{"no host", tracing.Config{OTLPEndpoint: ":4317", SamplingRatio: 1}, []string{"otlp-traces-endpoint"}},
		{"ratio above 1", tracing.Config{SamplingRatio: 1.01}, []string{"trace-sampling-ratio"}},
		{"ratio below 0", tracing.Config{SamplingRatio: -1}, []string{"trace-sampling-ratio"}},
		{"ca without endpoint", tracing.Config{SamplingRatio: 1, CA: "ca.pem"}, []string{"trace-ca"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, p := range tt.cfg.Validate() {
				got = append(got, p.Flag)
			}
			if strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Fatalf("Validate named %v, want %v", got, tt.want)
			}
		})
	}
}

// TestOffIsNoop: without an endpoint the provider records nothing and
// starts nothing (goleak checks no exporter runs).
func TestOffIsNoop(t *testing.T) {
	p, err := tracing.New(context.Background(), tracing.DefaultConfig(), "test")
	if err != nil {
		t.Fatal(err)
	}
	if p.Enabled() {
		t.Fatal("enabled without an endpoint")
	}
	_, sp := p.TracerProvider().Tracer("t").Start(context.Background(), "x")
	if sp.IsRecording() || sp.SpanContext().IsValid() {
		t.Fatal("the off provider's span records or has a context")
	}
	sp.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	var nilP *tracing.Provider
	if nilP.Enabled() || nilP.TracerProvider() == nil {
		t.Fatal("a nil provider must be off and usable")
	}
}

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

func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{"127.0.0.1:1": true, "[::1]:1": true, "localhost:1": true, "127.0.0.1": false, "collector.invalid:1": false} {
		if got := tracing.IsLoopback(addr); got != want {
			t.Errorf("IsLoopback(%q) = %v, want %v", addr, got, want)
		}
	}
}
