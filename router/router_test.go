package router

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// script is a WatchService that sends a fixed opening to every stream, then
// heartbeats until the stream ends.
type script struct {
	llmgwv1.UnimplementedWatchServiceServer
	events []*llmgwv1.WatchEvent
}

func (s *script) Watch(_ *llmgwv1.WatchRequest, st grpc.ServerStreamingServer[llmgwv1.WatchEvent]) error {
	for _, ev := range s.events {
		if err := st.Send(ev); err != nil {
			return err
		}
	}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-st.Context().Done():
			return nil
		case <-t.C:
			if err := st.Send(&llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Heartbeat{Heartbeat: &llmgwv1.Heartbeat{}}}); err != nil {
				return err
			}
		}
	}
}

func control(t *testing.T, engineAddr string) string {
	t.Helper()
	change := func(c *llmgwv1.Change) *llmgwv1.WatchEvent {
		c.Revision, c.Op = 7, llmgwv1.ChangeOp_CHANGE_OP_PUT
		return &llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Change{Change: c}}
	}
	s := &script{events: []*llmgwv1.WatchEvent{
		{Event: &llmgwv1.WatchEvent_SnapshotBegin{SnapshotBegin: &llmgwv1.SnapshotBegin{Revision: 7}}},
		change(&llmgwv1.Change{Object: &llmgwv1.Change_Model{Model: &llmgwv1.Model{Name: "demo", Engine: "sim"}}}),
		change(&llmgwv1.Change{Object: &llmgwv1.Change_Replica{Replica: &llmgwv1.Replica{Id: "demo-0", Uid: 5, Model: "demo", Node: "n1"}}}),
		{Event: &llmgwv1.WatchEvent_SnapshotEnd{SnapshotEnd: &llmgwv1.SnapshotEnd{Revision: 7}}},
		{Event: &llmgwv1.WatchEvent_Ephemeral{Ephemeral: &llmgwv1.EphemeralUpdate{Node: "n1", Epoch: 1, Seq: 1, Full: true,
			Statuses: []*llmgwv1.ReplicaStatus{{ReplicaId: "demo-0", Uid: 5, Incarnation: 1,
				Phase: llmgwv1.ReplicaPhase_REPLICA_PHASE_READY, Address: engineAddr}}}}},
	}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	llmgwv1.RegisterWatchServiceServer(srv, s)
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ln) })
	t.Cleanup(func() { srv.Stop(); wg.Wait() })
	return ln.Addr().String()
}

// waitStatus waits for url to answer GET with want.
func waitStatus(t *testing.T, url string, want int) {
	t.Helper()
	testkit.Wait(t, fmt.Sprintf("%s to answer %d", url, want), func() bool {
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == want
	})
}

// TestEndToEnd runs a router against an in-test control server and engine:
// it becomes ready from the watch stream, routes a stream, and on shutdown
// lets the in-flight stream finish before Serve returns.
func TestEndToEnd(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			io.WriteString(w, "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		started <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer eng.Close()

	cfg := DefaultConfig()
	cfg.ID = "r-test"
	cfg.Control = []string{control(t, strings.TrimPrefix(eng.URL, "http://"))}
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.OpsAddr = "127.0.0.1:0"
	cfg.DataDir = t.TempDir()
	cfg.ScrapeInterval = 20 * time.Millisecond
	r, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx, ln) }()

	waitStatus(t, base+"/readyz", 200)
	// Ready means the desired state is whole; the replica's status comes in
	// the ephemeral copy right after it, on its own event.
	testkit.Wait(t, "demo-0 to become routable after the router was ready", func() bool {
		eps, _ := r.eps.Lookup("demo")
		return len(eps) > 0
	})
	// Prometheus's HTTP service discovery lists the engine, labelled, on
	// the operations port.
	sd, err := http.Get("http://" + r.OpsAddr() + "/sd/replicas")
	if err != nil {
		t.Fatal(err)
	}
	var groups []struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}
	err = json.NewDecoder(sd.Body).Decode(&groups)
	sd.Body.Close()
	want := map[string]string{"llmgw_replica": "demo-0", "llmgw_model": "demo", "llmgw_node": "n1", "llmgw_engine": "sim"}
	if err != nil || len(groups) != 1 || !slices.Equal(groups[0].Targets, []string{strings.TrimPrefix(eng.URL, "http://")}) || !maps.Equal(groups[0].Labels, want) {
		t.Fatalf("/sd/replicas = %+v (%v), want the engine %s labelled %v", groups, err, eng.URL, want)
	}

	resp, err := http.Post(base+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"demo","stream":true,"messages":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Llmgw-Replica") != "demo-0" {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d replica %q: %s", resp.StatusCode, resp.Header.Get("X-Llmgw-Replica"), b)
	}
	<-started

	cancel() // shutdown begins with a stream in flight
	select {
	case err := <-done:
		t.Fatalf("Serve returned (%v) while a stream was in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	body, err := io.ReadAll(resp.Body)
	if err != nil || string(body) != "data: one\n\ndata: [DONE]\n\n" {
		t.Fatalf("stream = %q, %v", body, err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after the stream ended")
	}
	// The watch client saved the state on the way out, for the next start.
	if fi, err := os.Stat(filepath.Join(cfg.DataDir, "router-state.bin")); err != nil || fi.Size() == 0 {
		t.Fatalf("no saved state: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"default", func(*Config) {}, ""},
		{"no control", func(c *Config) { c.Control = nil }, "--control"},
		{"control without port", func(c *Config) { c.Control = []string{"host"} }, "--control"},
		{"bad http addr", func(c *Config) { c.HTTPAddr = "8080" }, "--http-addr"},
		{"body limit", func(c *Config) { c.MaxBodyBytes = 0 }, "--max-body-bytes"},
		{"gc min heap", func(c *Config) { c.GCMinHeap = -1 }, "--gc-min-heap"},
		{"scrape", func(c *Config) { c.ScrapeInterval = 0 }, "--scrape-interval"},
		{"connect", func(c *Config) { c.ConnectTimeout = -1 }, "--connect-timeout"},
		{"first byte", func(c *Config) { c.FirstByteTimeout = 0 }, "--first-byte-timeout"},
		{"grace", func(c *Config) { c.ShutdownGrace = -time.Second }, "--shutdown-grace"},
		{"no key bound", func(c *Config) { c.MaxKeyInflight = 0 }, ""},
		{"negative key bound", func(c *Config) { c.MaxKeyInflight = -1 }, "--max-key-inflight"},
		// The operations port: beyond loopback only with TLS, --insecure
		// or not; --pprof serves on it.
		{"no operations port", func(c *Config) { c.OpsAddr = "" }, ""},
		{"pprof", func(c *Config) { c.Pprof = true }, ""},
		{"pprof without the operations port", func(c *Config) { c.OpsAddr, c.Pprof = "", true }, "--pprof (pprof): the profiles are served on the operations port"},
		{"operations port without a port", func(c *Config) { c.OpsAddr = "127.0.0.1" }, "--ops-addr (ops_addr): "},
		{"operations port on every interface", func(c *Config) { c.OpsAddr = ":7406" }, "--ops-addr (ops_addr): :7406: the operations port"},
		{"operations port beyond loopback, --insecure", func(c *Config) { c.OpsAddr, c.Insecure = "0.0.0.0:7406", true }, "--ops-addr (ops_addr): 0.0.0.0:7406: the operations port"},
		// Tracing (design §9 "Tracing"): an endpoint with a port, a ratio in [0, 1].
		{"tracing on", func(c *Config) { c.Tracing.OTLPEndpoint, c.Tracing.SamplingRatio = "127.0.0.1:4317", 1 }, ""},
		{"tracing endpoint without port", func(c *Config) { c.Tracing.OTLPEndpoint = "127.0.0.1" }, "--otlp-traces-endpoint (otlp_traces_endpoint): "},
		{"tracing endpoint port 0", func(c *Config) { c.Tracing.OTLPEndpoint = "localhost:0" }, "--otlp-traces-endpoint (otlp_traces_endpoint): "},
		{"sampling ratio over 1", func(c *Config) { c.Tracing.SamplingRatio = 1.5 }, "--trace-sampling-ratio (trace_sampling_ratio): "},
		{"sampling ratio negative", func(c *Config) { c.Tracing.SamplingRatio = -0.1 }, "--trace-sampling-ratio (trace_sampling_ratio): "},
		{"trace CA without endpoint", func(c *Config) { c.Tracing.CA = "ca.pem" }, "--trace-ca (trace_ca): "},
		{"operations port beyond loopback with TLS", func(c *Config) {
			c.OpsAddr, c.TLS = "0.0.0.0:7406", mtls.Files{CA: "ca.pem", Cert: "r.pem", Key: "r-key.pem"}
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.mutate(&c)
			err := c.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one naming %s", err, tt.want)
			}
		})
	}
}
