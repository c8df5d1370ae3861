package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
	"github.com/llmgw/llmgw/internal/tracing"
)

// TestDevListensOnLoopbackOnly: each of dev's listeners is refused beyond
// loopback, naming its flag (design §11: dev has no TLS and no
// authentication).
func TestDevListensOnLoopbackOnly(t *testing.T) {
	base := devOptions{httpAddr: "127.0.0.1:8080", opsAddr: "127.0.0.1:7406", grpcAddr: "127.0.0.1:7400", raftAddr: "127.0.0.1:7401",
		controlHTTPAddr: "127.0.0.1:7403", agentHTTPAddr: "localhost:7404", agentGRPCAddr: "[::1]:7405"}
	if err := base.checkLoopback(); err != nil {
		t.Fatalf("loopback addresses refused: %v", err)
	}
	tests := []struct {
		flag string
		edit func(*devOptions, string)
	}{
		{"--http-addr", func(o *devOptions, a string) { o.httpAddr = a }},
		{"--ops-addr", func(o *devOptions, a string) { o.opsAddr = a }},
		{"--grpc-addr", func(o *devOptions, a string) { o.grpcAddr = a }},
		{"--raft-addr", func(o *devOptions, a string) { o.raftAddr = a }},
		{"--control-http-addr", func(o *devOptions, a string) { o.controlHTTPAddr = a }},
		{"--agent-http-addr", func(o *devOptions, a string) { o.agentHTTPAddr = a }},
		{"--agent-grpc-addr", func(o *devOptions, a string) { o.agentGRPCAddr = a }},
	}
	for _, tt := range tests {
		for _, addr := range []string{":8080", "0.0.0.0:8080", "10.0.0.7:8080", "example.com:8080"} {
			t.Run(tt.flag+" "+addr, func(t *testing.T) {
				o := base
				tt.edit(&o, addr)
				err := o.checkLoopback()
				if err == nil || !strings.HasPrefix(err.Error(), tt.flag+" "+addr+": ") || !strings.Contains(err.Error(), "loopback only") {
					t.Fatalf("checkLoopback = %v, want a refusal naming %s %s", err, tt.flag, addr)
				}
			})
		}
	}
}

func TestDemoEngineArgs(t *testing.T) {
	o := devOptions{decodeMS: 20, simGPU: "a100-40gb"}
	if got, want := o.demoEngineArgs(false), []string{"--sim-gpu", "a100-40gb", "--sim-load-scale", "0"}; !slices.Equal(got, want) {
		t.Errorf("default: %q, want %q", got, want)
	}
	o.simLoadScale = 0.25
	if got, want := o.demoEngineArgs(false), []string{"--sim-gpu", "a100-40gb", "--sim-load-scale", "0.25"}; !slices.Equal(got, want) {
		t.Errorf("with a load scale: %q, want %q", got, want)
	}
	o.decodeMS = 2.5
	if got, want := o.demoEngineArgs(true), []string{"--sim-timing", "simple", "--sim-decode-ms-per-token", "2.5"}; !slices.Equal(got, want) {
		t.Errorf("with a decode time: %q, want %q", got, want)
	}
}

// TestDevPortOffset: --port-offset moves every listener and the engines'
// port range, given or default, and the default data directory, so a
// second dev runs beside the first with one flag (issue 34).
func TestDevPortOffset(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want devPorts
	}{
		{"defaults", nil, devPorts{httpAddr: "127.0.0.1:8080", opsAddr: "127.0.0.1:7406", grpcAddr: "127.0.0.1:7400", raftAddr: "127.0.0.1:7401",
			controlHTTPAddr: "127.0.0.1:7403", agentHTTPAddr: "127.0.0.1:7404", agentGRPCAddr: "127.0.0.1:7405", portRange: "20000-20999", dataDir: ".data/dev"}},
		{"offset 100", []string{"--port-offset", "100"}, devPorts{httpAddr: "127.0.0.1:8180", opsAddr: "127.0.0.1:7506", grpcAddr: "127.0.0.1:7500", raftAddr: "127.0.0.1:7501",
			controlHTTPAddr: "127.0.0.1:7503", agentHTTPAddr: "127.0.0.1:7504", agentGRPCAddr: "127.0.0.1:7505", portRange: "20100-21099", dataDir: ".data/dev-100"}},
		{"an address given moves too; a data dir given stays", []string{"--port-offset", "100", "--http-addr", "127.0.0.1:9000", "--data-dir", "/tmp/d", "--port-range", "30000-30009"},
			devPorts{httpAddr: "127.0.0.1:9100", opsAddr: "127.0.0.1:7506", grpcAddr: "127.0.0.1:7500", raftAddr: "127.0.0.1:7501",
				controlHTTPAddr: "127.0.0.1:7503", agentHTTPAddr: "127.0.0.1:7504", agentGRPCAddr: "127.0.0.1:7505", portRange: "30100-30109", dataDir: "/tmp/d"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var o devOptions
			cmd := devCmd(&o)
			if err := cmd.ParseFlags(tt.args); err != nil {
				t.Fatalf("flags %q: %v", tt.args, err)
			}
			if err := o.offsetPorts(cmd.Flags().Changed); err != nil {
				t.Fatalf("offsetPorts: %v", err)
			}
			got := devPorts{httpAddr: o.httpAddr, opsAddr: o.opsAddr, grpcAddr: o.grpcAddr, raftAddr: o.raftAddr, controlHTTPAddr: o.controlHTTPAddr,
				agentHTTPAddr: o.agentHTTPAddr, agentGRPCAddr: o.agentGRPCAddr, portRange: o.portRange, dataDir: o.dataDir}
			if got != tt.want {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
	o := devOptions{portOffset: 60000, httpAddr: "127.0.0.1:8080"}
	if err := o.offsetPorts(func(string) bool { return false }); err == nil || !strings.Contains(err.Error(), "--port-offset") {
		t.Errorf("an offset past port 65535: %v, want a refusal naming --port-offset", err)
	}
}

// devPorts are the options --port-offset moves.
type devPorts struct {
	httpAddr, opsAddr, grpcAddr, raftAddr         string
	controlHTTPAddr, agentHTTPAddr, agentGRPCAddr string
	portRange, dataDir                            string
}

// TestDevPortClash: a port dev wants that is taken is refused before
// anything starts, naming its flag and --port-offset (issue 34).
func TestDevPortClash(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	free := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().String()
	}
	o := devOptions{httpAddr: free(), opsAddr: free(), grpcAddr: ln.Addr().String(), raftAddr: free(),
		controlHTTPAddr: free(), agentHTTPAddr: free(), agentGRPCAddr: free(),
		replicas: 1, gpus: 1, portRange: "20000-20009", dataDir: t.TempDir()}
	err = runDev(context.Background(), o, slog.New(slog.DiscardHandler))
	if err == nil || !strings.HasPrefix(err.Error(), "--grpc-addr "+ln.Addr().String()+": the port is in use") || !strings.Contains(err.Error(), "--port-offset") {
		t.Fatalf("runDev = %v, want a refusal naming --grpc-addr and --port-offset", err)
	}
}

// TestDevPortHint: a port taken after the check (a component's bind)
// names --port-offset too.
func TestDevPortHint(t *testing.T) {
	if err := portHint(fmt.Errorf("router: %w", &net.OpError{Op: "listen", Err: os.NewSyscallError("bind", syscall.EADDRINUSE)})); !strings.Contains(err.Error(), "--port-offset") {
		t.Errorf("portHint = %v, want --port-offset named", err)
	}
}

// TestDevTracing: dev's --otlp-traces-endpoint and --trace-sampling-ratio
// reach its router and control node as theirs, and its agent, which hands
// the endpoint to the engines; off by default; a bad ratio names its flag.
func TestDevTracing(t *testing.T) {
	tests := []struct {
		name      string
		args      []string
		endpoint  string
		ratio     float64
		wantError string
	}{
		{name: "off", ratio: 0.1},
		{name: "on at the default ratio", args: []string{"--otlp-traces-endpoint", "127.0.0.1:4317"}, endpoint: "127.0.0.1:4317", ratio: 0.1},
		{name: "on at 1", args: []string{"--otlp-traces-endpoint", "127.0.0.1:4317", "--trace-sampling-ratio", "1"}, endpoint: "127.0.0.1:4317", ratio: 1},
		{name: "bad ratio", args: []string{"--trace-sampling-ratio", "2"}, wantError: "--trace-sampling-ratio: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := &devOptions{tracing: tracing.DefaultConfig()}
			cmd := devCmd(o)
			if err := cmd.Flags().Parse(append([]string{"--data-dir", t.TempDir()}, tt.args...)); err != nil {
				t.Fatal(err)
			}
			c, a, r, err := o.configs()
			if tt.wantError != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tt.wantError) {
					t.Fatalf("configs = %v, want an error starting %q", err, tt.wantError)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for who, got := range map[string]tracingOf{"router": {r.Tracing.OTLPEndpoint, r.Tracing.SamplingRatio}, "control": {c.Tracing.OTLPEndpoint, c.Tracing.SamplingRatio}} {
				if got != (tracingOf{tt.endpoint, tt.ratio}) {
					t.Errorf("%s's tracing %+v, want %s at %v", who, got, tt.endpoint, tt.ratio)
				}
			}
			if a.Tracing.OTLPEndpoint != tt.endpoint {
				t.Errorf("agent's endpoint %q, want %q", a.Tracing.OTLPEndpoint, tt.endpoint)
			}
		})
	}
}

type tracingOf struct {
	endpoint string
	ratio    float64
}

// routableAt is a router whose demo replicas become routable when ready
// is set.
type routableAt struct{ ready atomic.Int32 }

func (r *routableAt) Routable(model string) int {
	if model != "demo" {
		return 0
	}
	return int(r.ready.Load())
}

// TestDevNotesReady: dev says when demo's replicas can serve, and, when
// they take too long, how many can and where to look; either way it
// waits for its context, as a run group member must.
func TestDevNotesReady(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ready int32
		want  string
	}{
		{"ready", 2, "demo is ready to serve"},
		{"one of two, past the hint", 1, "demo is not ready yet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out testkit.SyncBuffer
			rt := &routableAt{}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- noteReady(ctx, rt, 2, 50*time.Millisecond, slog.New(slog.NewTextHandler(&out, nil))) }()
			rt.ready.Store(tc.ready)
			testkit.Wait(t, fmt.Sprintf("dev to log %q", tc.want), func() bool { return strings.Contains(out.String(), tc.want) })
			if tc.ready < 2 && strings.Contains(out.String(), "ready to serve") {
				t.Fatalf("logged ready with %d of 2 routable:\n%s", tc.ready, out.String())
			}
			select {
			case err := <-done:
				t.Fatalf("noteReady returned %v before its context ended", err)
			default:
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("noteReady = %v, want nil once cancelled", err)
			}
		})
	}
}
