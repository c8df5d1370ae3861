package store

import (
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/mtls/mtlstest"
	"github.com/llmgw/llmgw/internal/netlimit"
	"github.com/llmgw/llmgw/internal/testkit"
)

// TestTransportLimits (issue 26, design §11 "Limits"): silent sockets on
// the Raft port — plain and TLS — are closed at the handshake timeout, or
// at once past the per-address cap, while a server's RPCs go through, and
// its pooled connection, idle past the timeout, is kept: once a peer has
// sent an RPC its connection is never timed out.
func TestTransportLimits(t *testing.T) {
	const timeout = 300 * time.Millisecond
	p := mtlstest.New(t)
	for _, tt := range []struct {
		name      string
		src, peer *mtls.Source
	}{
		{"plain", nil, nil},
		{"tls", p.Source(mtls.RoleServer, "c1"), p.Source(mtls.RoleServer, "c2")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var mu sync.Mutex
			drops := map[netlimit.Reason]int{}
			lim := netlimit.New(netlimit.Config{MaxConns: 64, MaxConnsPerAddr: 8, HandshakeTimeout: timeout, OnDrop: func(r netlimit.Reason) {
				mu.Lock()
				drops[r]++
				mu.Unlock()
			}})
			c1, err := newTransport("127.0.0.1:0", tt.src, nil, func(string, string, string) {}, lim, hclog.NewNullLogger())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c1.Close(); c1.CloseStreams() })
			consume(t, c1.Consumer(), func(rpc raft.RPC) { rpc.Respond(&raft.AppendEntriesResponse{Success: true}, nil) })
			c2 := transport(t, tt.peer)
			send := func() error {
				var resp raft.AppendEntriesResponse
				return c2.AppendEntries("c1", c1.LocalAddr(), &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("x"), Addr: []byte(c2.LocalAddr())}, Term: 1}, &resp)
			}
			if err := send(); err != nil {
				t.Fatalf("first RPC: %v", err)
			}
			// 20 silent sockets from another address: 12 past its cap of 8.
			start := time.Now()
			var silent []net.Conn
			for range 20 {
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Timeout: 5 * time.Second}
				c, err := d.Dial("tcp", string(c1.LocalAddr()))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				silent = append(silent, c)
			}
			// Meanwhile RPCs go through, over the pooled connection; past the
			// timeout it is still there (a second RPC reuses it).
			if err := send(); err != nil {
				t.Fatalf("RPC during the flood: %v", err)
			}
			for i, c := range silent {
				_ = c.SetReadDeadline(time.Now().Add(timeout + 5*time.Second))
				_, err := c.Read(make([]byte, 1))
				var ne net.Error
				if err == nil || errors.As(err, &ne) && ne.Timeout() {
					t.Fatalf("silent socket %d still open %v after it connected: %v", i, time.Since(start), err)
				}
			}
			if err := send(); err != nil {
				t.Fatalf("RPC after the flood: %v", err)
			}
			if n := lim.Open(); n != 1 {
				t.Errorf("%d connections open after the flood, want 1: the peer's pooled one", n)
			}
			// A drop is counted just after its socket is closed. Those past
			// the cap were evicted, unless the first ones had timed out
			// before the last came (a slow machine); the last 8 time out.
			testkit.Wait(t, "20 drops: evicted in their handshake, or at least 8 timed out", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return drops[netlimit.EvictedHandshake]+drops[netlimit.HandshakeTimeout] == 20 && drops[netlimit.HandshakeTimeout] >= 8
			})
		})
	}
}
