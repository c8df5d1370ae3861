// Package tracing builds a component's OpenTelemetry tracer provider from
// its configuration (design §9 "Tracing"): off by default — a no-op
// provider whose spans cost a context lookup — and on with an OTLP/gRPC
// endpoint and a sampling ratio of its own. The sampler is parent-based:
// a request that arrives with a W3C traceparent keeps its caller's
// decision, one without is sampled at the ratio, so one trace is whole or
// absent across the router and its engines.
//
// Nothing here is global: the provider is handed to whoever starts spans,
// and the W3C propagator is a value (Propagator), never installed as
// otel's global one.
//
// It is a leaf under internal/ (design §3): it imports nothing of the
// repository.
package tracing

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc/credentials"
)

// Config is a component's tracing settings. Its keys are flat, each the
// name of its flag with underscores (--otlp-traces-endpoint, vLLM's name),
// so a component inlines it in its own configuration.
type Config struct {
	// OTLPEndpoint is the host:port of an OTLP/gRPC trace receiver (an
	// OpenTelemetry Collector, Jaeger, Tempo); empty turns tracing off.
	OTLPEndpoint string `yaml:"otlp_traces_endpoint"`
	// SamplingRatio is the share of traces this component starts that are
	// sampled, in [0, 1]; a request that arrives with a traceparent keeps
	// its caller's decision whatever the ratio.
	SamplingRatio float64 `yaml:"trace_sampling_ratio"`
	// Insecure sends spans in plain text to an endpoint beyond loopback.
	// A loopback endpoint (a collector beside the process) is always
	// plain text; any other is TLS unless this is set.
	Insecure bool `yaml:"trace_insecure"`
	// CA is a PEM file of the CAs the endpoint's certificate is checked
	// against (TLS only); empty: the system's roots.
	CA string `yaml:"trace_ca"`
}

// DefaultSamplingRatio is the share of traces sampled when the endpoint
// is given and the ratio is not: one in ten, whose cost the router's
// benchmark measures (docs/benchmarks.md).
const DefaultSamplingRatio = 0.1

// DefaultConfig is tracing off, with DefaultSamplingRatio ready for the
// day an endpoint is given.
func DefaultConfig() Config { return Config{SamplingRatio: DefaultSamplingRatio} }

// Enabled reports whether an endpoint is configured.
func (c Config) Enabled() bool { return c.OTLPEndpoint != "" }

// Problem is one bad field of a Config: Flag is its flag's name
// (otlp-traces-endpoint, trace-sampling-ratio, trace-ca), which with
// underscores is its key.
type Problem struct {
	Flag string
	Err  error
}

// Validate returns the config's problems; none when it is good.
func (c Config) Validate() []Problem {
	var ps []Problem
	if !(c.SamplingRatio >= 0 && c.SamplingRatio <= 1) { // NaN too
		ps = append(ps, Problem{"trace-sampling-ratio", fmt.Errorf("must be between 0 and 1, got %v", c.SamplingRatio)})
	}
	if c.OTLPEndpoint != "" {
		if err := CheckEndpoint(c.OTLPEndpoint); err != nil {
			ps = append(ps, Problem{"otlp-traces-endpoint", err})
		}
	}
	if c.CA != "" && c.OTLPEndpoint == "" {
		ps = append(ps, Problem{"trace-ca", errors.New("given without --otlp-traces-endpoint")})
	}
	return ps
}

// CheckEndpoint reports whether addr is an address spans may be sent to:
// host:port with a port, and not an address no collector has — the
// unspecified address, multicast, or link-local ones (cloud metadata
// services live there, and a span sent there would hand them request
// metadata).
func CheckEndpoint(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port: %w", addr, err)
	}
	if host == "" {
		return fmt.Errorf("%q has no host", addr)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("%q: port must be a number between 1 and 65535", addr)
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		ip = ip.Unmap()
		switch {
		case ip.IsUnspecified():
			return fmt.Errorf("%q: the unspecified address names no collector", addr)
		case ip.IsMulticast(), ip.IsLinkLocalUnicast(), ip.IsLinkLocalMulticast():
			return fmt.Errorf("%q: a multicast or link-local address (cloud metadata) is refused", addr)
		}
	}
	return nil
}

// IsLoopback reports whether addr's host is a loopback address or
// "localhost".
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// Propagator is the W3C Trace Context propagator (traceparent,
// tracestate): a value, so no component touches otel's global one.
var Propagator propagation.TraceContext

// Provider is one component's tracer provider. The zero value and a nil
// *Provider are off.
type Provider struct {
	tp  trace.TracerProvider
	sdk *sdktrace.TracerProvider // nil when off
}

// Off returns a provider that records nothing.
func Off() *Provider { return &Provider{tp: noop.NewTracerProvider()} }

// batchTimeout is how long a span waits in the batch before it is sent:
// shorter than the SDK's 5 s, so a trace shows while its request is still
// in mind, at the same batch size.
const batchTimeout = 2 * time.Second

// New builds the provider cfg describes for the component service
// (service.name, e.g. "llmgw-router"); off when cfg has no endpoint. Its
// exporter connects lazily: an endpoint that is down loses spans, never
// requests.
func New(ctx context.Context, cfg Config, service string) (*Provider, error) {
	if !cfg.Enabled() {
		return Off(), nil
	}
	if ps := cfg.Validate(); len(ps) > 0 {
		return nil, fmt.Errorf("tracing: --%s: %w", ps[0].Flag, ps[0].Err)
	}
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(cfg.OTLPEndpoint)}
	if IsLoopback(cfg.OTLPEndpoint) || cfg.Insecure {
		opts = append(opts, otlptracegrpc.WithInsecure())
	} else {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if cfg.CA != "" {
			pem, err := os.ReadFile(cfg.CA)
			if err != nil {
				return nil, fmt.Errorf("tracing: --trace-ca: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("tracing: --trace-ca: %s holds no PEM certificate", cfg.CA)
			}
			tc.RootCAs = pool
		}
		opts = append(opts, otlptracegrpc.WithTLSCredentials(credentials.NewTLS(tc)))
	}
	exp, err := otlptracegrpc.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter for %s: %w", cfg.OTLPEndpoint, err)
	}
	res := resource.NewSchemaless(attribute.String("service.name", service))
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(batchTimeout)),
		sdktrace.WithSampler(Sampler(cfg.SamplingRatio)),
		sdktrace.WithResource(res),
	)
	return &Provider{tp: tp, sdk: tp}, nil
}

// Sampler is the sampler of every component: the parent's decision when
// there is one (remote or local), else ratio of the traces started here.
func Sampler(ratio float64) sdktrace.Sampler {
	return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))
}

// TracerProvider is the provider to start spans with: a no-op one when
// tracing is off.
func (p *Provider) TracerProvider() trace.TracerProvider {
	if p == nil || p.tp == nil {
		return noop.NewTracerProvider()
	}
	return p.tp
}

// Enabled reports whether spans are exported.
func (p *Provider) Enabled() bool { return p != nil && p.sdk != nil }

// Shutdown sends the spans still batched and stops the exporter, within
// ctx; a no-op when off.
func (p *Provider) Shutdown(ctx context.Context) error {
	if !p.Enabled() {
		return nil
	}
	if err := p.sdk.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: shutdown: %w", err)
	}
	return nil
}
