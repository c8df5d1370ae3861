package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/controlplane/gossip"
	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/mtls/mtlstest"
)

// listen serves handshakes on loopback: TLS with src (as a server's Raft
// transport does), or plain TCP when src is nil. It returns the address.
func listen(t *testing.T, src *mtls.Source) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lis := net.Listener(l)
	if src != nil {
		lis = tls.NewListener(l, src.ServerConfig(mtls.RoleServer))
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				if tc, ok := c.(*tls.Conn); ok {
					_ = tc.Handshake()
				}
				_, _ = c.Read(make([]byte, 1)) // until the verifier closes
			})
		}
	})
	t.Cleanup(func() { lis.Close(); wg.Wait() })
	return l.Addr().String()
}

// TestVerifyByTLS: a member is verified only by a handshake with a server
// certificate of this CA that names it.
func TestVerifyByTLS(t *testing.T) {
	ca := mtlstest.New(t)
	verify := VerifyByTLS(ca.Source(mtls.RoleServer, "c1"))
	tests := []struct {
		name string
		addr string
		err  string // "" verified
	}{
		{"the server itself", listen(t, ca.Source(mtls.RoleServer, "c2")), ""},
		{"another server's certificate", listen(t, ca.Source(mtls.RoleServer, "c9")), "is server/c9; expected server/c2"},
		{"an agent's certificate", listen(t, ca.Source(mtls.RoleAgent, "c2")), "not a server"},
		{"a server of another CA", listen(t, mtlstest.New(t).Source(mtls.RoleServer, "c2")), "not a server"},
		{"plain TCP", listen(t, nil), "no mutual-TLS handshake"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := verify(ctx, "c2", tt.addr)
			if tt.err == "" {
				if err != nil {
					t.Fatalf("verify: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("verify = %v, want an error containing %q", err, tt.err)
			}
		})
	}
}

// TestCertified: without Verify every member passes; with it a member
// passes once verified at its Raft address (and is not dialed again until
// that address changes), a failure is counted, logged once and shown as
// the member's refusal.
func TestCertified(t *testing.T) {
	m := gossip.Member{Meta: gossip.Meta{ID: "c4", Raft: "127.0.0.1:1"}}
	if c := New(Config{NodeID: "c1"}, nil, nil, nil, nil, nil, NewPool(nil), slog.New(slog.DiscardHandler), time.Now); !c.certified(context.Background(), m, map[string]bool{}) {
		t.Fatal("without Verify a member was refused")
	}
	var calls int
	good := map[string]bool{}
	c := New(Config{NodeID: "c1", Verify: func(_ context.Context, id, addr string) error {
		calls++
		if good[id+"@"+addr] {
			return nil
		}
		return errors.New("the certificate at " + addr + " is agent/c4; expected server/c4")
	}}, nil, nil, nil, nil, nil, NewPool(nil), slog.New(slog.DiscardHandler), time.Now)
	reported := map[string]bool{}
	for range 2 {
		if c.certified(context.Background(), m, reported) {
			t.Fatal("an unverified member passed")
		}
	}
	if c.Unverified() != 2 || len(reported) != 1 {
		t.Fatalf("unverified %d (want 2), reported %v (want once)", c.Unverified(), reported)
	}
	if got := c.notCertifiedReason("c4"); !strings.Contains(got, "server certificate not verified: the certificate at") {
		t.Fatalf("reason %q", got)
	}
	good["c4@127.0.0.1:1"] = true
	for range 2 {
		if !c.certified(context.Background(), m, reported) {
			t.Fatal("a verified member was refused")
		}
	}
	if calls != 3 || c.notCertifiedReason("c4") != "" {
		t.Fatalf("%d verifications (want 3: a verified member is not dialed again), reason %q", calls, c.notCertifiedReason("c4"))
	}
	m.Meta.Raft = "127.0.0.1:2" // it moved: verified again
	if c.certified(context.Background(), m, reported) || calls != 4 {
		t.Fatalf("a member at a new address was not verified again (%d calls)", calls)
	}
}
