package controlplane

import (
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc"

	"github.com/llmgw/llmgw/internal/tracing"
)

// The control plane's gRPC tracing (design §9 "Tracing"): with
// --otlp-traces-endpoint the server's calls, and those it makes to its
// peers (forwarding to the leader, bootstrap, autopilot), are spans by
// otelgrpc's stats handlers, with the node's provider and the W3C
// propagator as values — never otel's globals — and no metrics (the
// node's metrics are its Prometheus registry's). Off, no handler is
// installed: not a call pays for it.

// otelOptions are otelgrpc's options over the node's provider.
func (s *Server) otelOptions() []otelgrpc.Option {
	return []otelgrpc.Option{
		otelgrpc.WithTracerProvider(s.tracing.TracerProvider()),
		otelgrpc.WithPropagators(tracing.Propagator),
		otelgrpc.WithMeterProvider(metricnoop.NewMeterProvider()),
	}
}

// serverTracing is the gRPC server's stats handler; none when off.
func (s *Server) serverTracing() []grpc.ServerOption {
	if !s.tracing.Enabled() {
		return nil
	}
	return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(s.otelOptions()...))}
}

// clientTracing is the peers' connections' stats handler; none when off.
func (s *Server) clientTracing() []grpc.DialOption {
	if !s.tracing.Enabled() {
		return nil
	}
	return []grpc.DialOption{grpc.WithStatsHandler(otelgrpc.NewClientHandler(s.otelOptions()...))}
}
