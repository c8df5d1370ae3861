package main

import (
	"github.com/spf13/pflag"

	"github.com/llmgw/llmgw/internal/tracing"
)

// traceFlags binds --otlp-traces-endpoint and --trace-sampling-ratio to
// c, with c's values as defaults: the flags of every command that starts
// traces (router, control, dev). spans says what is sent, starter who
// starts the traces the ratio samples, and carrier what arrives with a
// traceparent of its own.
func traceFlags(f *pflag.FlagSet, c *tracing.Config, spans, starter, carrier string) {
	f.StringVar(&c.OTLPEndpoint, "otlp-traces-endpoint", c.OTLPEndpoint, "host:port of an OTLP/gRPC trace receiver: "+spans+" (off when empty; plain text to loopback, else TLS)")
	f.Float64Var(&c.SamplingRatio, "trace-sampling-ratio", c.SamplingRatio, "share of the traces "+starter+" that are sampled, 0 to 1; "+carrier+" own traceparent keeps its decision")
}

// traceTLSFlags binds --trace-insecure and --trace-ca to c: how spans
// reach an endpoint beyond loopback.
func traceTLSFlags(f *pflag.FlagSet, c *tracing.Config) {
	f.BoolVar(&c.Insecure, "trace-insecure", c.Insecure, "send spans in plain text to an --otlp-traces-endpoint beyond loopback")
	f.StringVar(&c.CA, "trace-ca", c.CA, "CA certificate (PEM) the --otlp-traces-endpoint's certificate is checked against (default: the system's)")
}
