package tracing_test

import (
	"context"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/internal/tracing"
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

func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{"127.0.0.1:1": true, "[::1]:1": true, "localhost:1": true, "127.0.0.1": false, "collector.invalid:1": false} {
		if got := tracing.IsLoopback(addr); got != want {
			t.Errorf("IsLoopback(%q) = %v, want %v", addr, got, want)
		}
	}
}
