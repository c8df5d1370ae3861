package watch

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/mtls/mtlstest"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestTLSWatchDemandsAServer: with TLS the client watches only a peer
// holding a server certificate of its CA. An impostor first in the list —
// this CA's agent certificate, another CA's server certificate — never
// receives the router's Watch request; the real server does.
func TestTLSWatchDemandsAServer(t *testing.T) {
	ca, other := mtlstest.New(t), mtlstest.New(t)
	// Cleanups run last first: the client stops, then the servers, then
	// their Serve goroutines are waited for.
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	serve := func(src *mtls.Source) (string, *fakeWatch) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		f := &fakeWatch{reqs: make(chan *llmgwv1.WatchRequest, 16), events: make(chan *llmgwv1.WatchEvent), hangup: make(chan struct{})}
		srv := grpc.NewServer(grpc.Creds(mtls.ServerCredentials(src)))
		llmgwv1.RegisterWatchServiceServer(srv, f)
		wg.Go(func() { _ = srv.Serve(ln) })
		t.Cleanup(srv.Stop)
		return ln.Addr().String(), f
	}
	agentAddr, agentFake := serve(ca.Source(mtls.RoleAgent, "c0"))
	otherAddr, otherFake := serve(other.Source(mtls.RoleServer, "c0"))
	realAddr, realFake := serve(ca.Source(mtls.RoleServer, "c1"))

	cfg := DefaultConfig()
	cfg.ClientID = "r1"
	cfg.Addrs = []string{agentAddr, otherAddr, realAddr}
	cfg.TLS = ca.Source(mtls.RoleRouter, "r1")
	cfg.BackoffMin, cfg.BackoffMax = time.Millisecond, 5*time.Millisecond
	c, err := New(cfg, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	select {
	case r := <-realFake.reqs:
		if r.GetClientId() != "r1" {
			t.Fatalf("watch request from %q, want r1", r.GetClientId())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server with a server certificate got no Watch request")
	}
	for name, f := range map[string]*fakeWatch{"agent certificate": agentFake, "another CA's server": otherFake} {
		select {
		case r := <-f.reqs:
			t.Errorf("the impostor with %s received a Watch request: %v", name, r)
		default:
		}
	}
}
