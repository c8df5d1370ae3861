package main

import (
	"slices"
	"strings"
	"testing"
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
