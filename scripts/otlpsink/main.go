// Command otlpsink is an OpenTelemetry Collector's trace receiver that
// keeps nothing: it counts the spans it is sent over OTLP/gRPC and prints
// the count when stopped (SIGINT or SIGTERM). A benchmark script points a
// component's --otlp-traces-endpoint at it to measure what exporting costs
// the component, without a collector's own work on the same machine
// (scripts/bench-tracing.sh).
//
// Usage: go run ./scripts/otlpsink -addr 127.0.0.1:22020
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/llmgw/llmgw/internal/tracing"
	"github.com/llmgw/llmgw/internal/tracing/tracingtest"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:4317", "loopback host:port to receive OTLP/gRPC spans on")
	flag.Parse()
	if err := run(*addr); err != nil {
		fmt.Fprintln(os.Stderr, "otlpsink:", err)
		os.Exit(1)
	}
}

func run(addr string) error {
	if !tracing.IsLoopback(addr) {
		return fmt.Errorf("-addr %q: a loopback address only (it serves without authentication)", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	r, stop := tracingtest.Serve(ln, true)
	fmt.Fprintf(os.Stderr, "otlpsink: receiving on %s\n", r.Addr())
	<-ctx.Done()
	stop()
	fmt.Printf("spans %d\n", r.Count())
	return nil
}
