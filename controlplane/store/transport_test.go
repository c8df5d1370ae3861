package store

import (
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/mtls/mtlstest"
)

func transport(t *testing.T, src *mtls.Source) *raft.NetworkTransport {
	t.Helper()
	return clusterTransport(t, src, "", nil)
}

// clusterTransport is a transport of cluster id (none: ""), calling
// refused on each handshake it refuses.
func clusterTransport(t *testing.T, src *mtls.Source, id string, refused func(rpc, from, why string)) *raft.NetworkTransport {
	t.Helper()
	if refused == nil {
		refused = func(string, string, string) {}
	}
	tr, err := newTransport("127.0.0.1:0", src, func() string { return id }, refused, nil, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close(); tr.CloseStreams() })
	return tr
}

// TestTLSTransport: two servers of one CA exchange Raft RPCs over mutual
// TLS; a peer with an agent's certificate, a server of another CA and a
// plain-TCP peer get nothing through, and the receiver's raft sees none of
// their RPCs (design §11: only servers speak Raft).
func TestTLSTransport(t *testing.T) {
	p := mtlstest.New(t)
	c1 := transport(t, p.Source(mtls.RoleServer, "c1"))
	got := make(chan *raft.AppendEntriesRequest, 10)
	// The consumer channel is never closed: the loop ends with the test.
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case rpc := <-c1.Consumer():
				got <- rpc.Command.(*raft.AppendEntriesRequest)
				rpc.Respond(&raft.AppendEntriesResponse{Success: true}, nil)
			}
		}
	})
	t.Cleanup(func() { close(done); wg.Wait() })
	send := func(from *raft.NetworkTransport, term uint64) error {
		var resp raft.AppendEntriesResponse
		return from.AppendEntries("c1", c1.LocalAddr(), &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("x"), Addr: []byte(from.LocalAddr())}, Term: term}, &resp)
	}

	c2 := transport(t, p.Source(mtls.RoleServer, "c2"))
	if err := send(c2, 7); err != nil {
		t.Fatalf("server to server: %v", err)
	}
	select {
	case r := <-got:
		if r.Term != 7 {
			t.Fatalf("received term %d, want 7", r.Term)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the server's RPC did not arrive")
	}

	for _, rogue := range []struct {
		name string
		tr   *raft.NetworkTransport
	}{
		{"an agent's certificate", transport(t, p.Source(mtls.RoleAgent, "n1"))},
		{"a server of another CA", transport(t, mtlstest.New(t).Source(mtls.RoleServer, "c9"))},
		{"plain TCP", transport(t, nil)},
	} {
		if err := send(rogue.tr, 666); err == nil {
			t.Errorf("%s: AppendEntries succeeded", rogue.name)
		}
	}
	// A barrier: the consumer is served in order, so had any rogue RPC
	// reached raft it would come before this one.
	if err := send(c2, 8); err != nil {
		t.Fatalf("server to server after the rogues: %v", err)
	}
	if r := <-got; r.Term != 8 {
		t.Fatalf("a rogue peer's RPC reached raft: term %d", r.Term)
	}
}
