package controlplane

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestListenersBounded (issue 26, design §11 "Limits"): silent sockets
// from another address on each of a node's ports — gRPC, Raft, gossip and
// HTTP — are closed at the handshake deadline (HTTP's: ReadHeaderTimeout),
// or at once past the address's cap, counted by listener and reason, while
// gRPC calls and /healthz are served.
func TestListenersBounded(t *testing.T) {
	// Long enough for the connections past a cap to arrive while the first
	// are still in their handshake, on a slow machine too.
	const timeout = 2 * time.Second
	cfg := testConfig(t, t.TempDir(), freeAddr(t))
	cfg.GossipAddr = freeAddr(t)
	cfg.Limits.Listeners.HandshakeTimeout = timeout
	r := start(t, cfg)
	defer r.stop(t)
	ports := map[string]struct {
		addr     string
		cap      int
		deadline time.Duration
	}{
		"grpc":   {r.srv.GRPCAddr(), cfg.Limits.Listeners.GRPCMaxConnsPerAddress, timeout},
		"raft":   {r.srv.store.RaftAddr(), raftMaxConnsPerAddr, timeout},
		"gossip": {r.srv.gossip.Addr(), gossipMaxConnsPerAddr, timeout},
		"http":   {r.srv.HTTPAddr(), httpMaxConnsPerAddr, httpReadHeaderTimeout},
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for name, p := range ports {
		wg.Go(func() {
			// A few past the port's cap for one address.
			n := p.cap + 10
			var conns []net.Conn
			defer func() {
				for _, c := range conns {
					c.Close()
				}
			}()
			start := time.Now()
			for range n {
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Timeout: 5 * time.Second}
				c, err := d.Dial("tcp", p.addr)
				if err != nil {
					errs <- err
					return
				}
				conns = append(conns, c)
			}
			for _, c := range conns {
				// Until the server closes it (gRPC's server speaks first: its
				// SETTINGS).
				_ = c.SetReadDeadline(start.Add(p.deadline + 5*time.Second))
				_, err := io.Copy(io.Discard, c)
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					errs <- errors.New(name + ": a silent socket still open " + time.Since(start).String() + " after the first connected")
					return
				}
			}
		})
	}
	// Meanwhile the node serves.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 5 {
		if _, err := llmgwv1.NewAdminServiceClient(r.conn).ClusterStatus(ctx, &llmgwv1.ClusterStatusRequest{}); err != nil {
			t.Fatalf("ClusterStatus during the flood: %v", err)
		}
		resp, err := http.Get("http://" + r.srv.HTTPAddr() + "/healthz")
		if err != nil {
			t.Fatalf("/healthz during the flood: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("/healthz during the flood: %d", resp.StatusCode)
		}
		time.Sleep(50 * time.Millisecond) // pacing
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for name := range ports {
		testkit.Wait(t, name+"'s drops to be counted", func() bool {
			// The 10 past the cap evicted the oldest; the rest time out,
			// by the limiter or by the server's own deadline (gRPC's is
			// the same; HTTP's is ReadHeaderTimeout alone).
			evicted, _, _ := testkit.Gathered(r.srv.reg, "llmgw_control_connections_dropped_total", testkit.Labels{"listener": name, "reason": "evicted_handshake"})
			return evicted == 10
		})
	}
	if open := testkit.Metric(t, r.srv.reg, "llmgw_control_connections_open", testkit.Labels{"listener": "raft"}); open > 2 {
		t.Errorf("%v Raft connections open after the flood", open)
	}
	if n := strings.Count(r.logs.String(), "failed to decode incoming command"); n > 5 {
		t.Errorf("raft logged %d junk lines, more than its burst of 5", n)
	}
}
