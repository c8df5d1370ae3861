package store

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/mtls/mtlstest"
)

const (
	clusterA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	clusterB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

// TestTLSTransportClusterID: a Raft dialer offering another cluster's id
// is refused in the handshake, and counted; one offering this cluster's
// id, or none (a fresh server, an older release), gets through; an
// acceptor that knows no id yet takes any (design §5.2 "Cluster
// identity").
func TestTLSTransportClusterID(t *testing.T) {
	p := mtlstest.New(t)
	var mu sync.Mutex
	var refusals []string
	c1 := clusterTransport(t, p.Source(mtls.RoleServer, "c1"), clusterA, func(rpc, _, why string) {
		mu.Lock()
		refusals = append(refusals, rpc+": "+why)
		mu.Unlock()
	})
	fresh := clusterTransport(t, p.Source(mtls.RoleServer, "c5"), "", nil)
	for _, acceptor := range []*raft.NetworkTransport{c1, fresh} {
		consume(t, acceptor.Consumer(), func(rpc raft.RPC) {
			rpc.Respond(&raft.AppendEntriesResponse{Success: true}, nil)
		})
	}
	send := func(from, to *raft.NetworkTransport) error {
		var resp raft.AppendEntriesResponse
		return from.AppendEntries("c1", to.LocalAddr(), &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("x"), Addr: []byte(from.LocalAddr())}, Term: 3}, &resp)
	}
	tests := []struct {
		name   string
		from   *raft.NetworkTransport
		to     *raft.NetworkTransport
		refuse bool
	}{
		{"same cluster", clusterTransport(t, p.Source(mtls.RoleServer, "c2"), clusterA, nil), c1, false},
		{"a dialer with no id yet", clusterTransport(t, p.Source(mtls.RoleServer, "c3"), "", nil), c1, false},
		{"another cluster", clusterTransport(t, p.Source(mtls.RoleServer, "c4"), clusterB, nil), c1, true},
		{"an acceptor with no id yet", clusterTransport(t, p.Source(mtls.RoleServer, "c6"), clusterB, nil), fresh, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := send(tt.from, tt.to)
			if tt.refuse != (err != nil) {
				t.Fatalf("AppendEntries: %v; want refused %v", err, tt.refuse)
			}
		})
	}
	mu.Lock()
	defer mu.Unlock()
	if len(refusals) == 0 || !strings.Contains(refusals[0], "handshake: ") || !strings.Contains(refusals[0], clusterB) {
		t.Fatalf("refusals %q: want the handshake's, naming the other cluster", refusals)
	}
}

// guarded is a guard over a loopback transport whose membership is
// conf, with or without state.
func guarded(t *testing.T, conf map[raft.ServerID]raft.ServerAddress, hasState bool) (*guard, *[]string) {
	t.Helper()
	var mu sync.Mutex
	refused := &[]string{}
	g := newGuard(transport(t, nil), func(rpc, from, _ string) {
		mu.Lock()
		*refused = append(*refused, rpc+"/"+from)
		mu.Unlock()
	})
	g.setMembers(func(raft.ServerID) (map[raft.ServerID]raft.ServerAddress, bool) { return conf, hasState })
	t.Cleanup(func() { g.Close() })
	return g, refused
}

// TestGuard: a server with state takes entries, snapshots, heartbeats and
// leadership hand-overs only from servers of its configuration; votes go
// to raft, which checks them itself; a server with no state takes all.
func TestGuard(t *testing.T) {
	conf := map[raft.ServerID]raft.ServerAddress{"c1": "127.0.0.1:1", "c2": "127.0.0.1:2"}
	tests := []struct {
		name     string
		hasState bool
		from     string
		rpc      func(from string) any
		admitted bool
	}{
		{"entries from a member", true, "c2", entries, true},
		{"entries from a stranger", true, "s4", entries, false},
		{"a heartbeat from a stranger", true, "s4", heartbeat, false},
		{"a heartbeat from a member", true, "c1", heartbeat, true},
		{"a snapshot from a stranger", true, "s4", snapshot, false},
		{"timeout-now from a stranger", true, "s4", timeoutNow, false},
		{"a vote request from a stranger: raft's to refuse", true, "s4", vote, true},
		{"entries from a stranger, no state: being joined", false, "s4", entries, true},
		{"an old peer naming its address only, a member", true, "", legacyEntries("127.0.0.1:2"), true},
		{"an old peer naming its address only, a stranger", true, "", legacyEntries("127.0.0.1:9"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, refused := guarded(t, conf, tt.hasState)
			respCh := make(chan raft.RPCResponse, 1)
			rpc := raft.RPC{Command: tt.rpc(tt.from), RespChan: respCh}
			if got := g.admit(rpc); got != tt.admitted {
				t.Fatalf("admit = %v, want %v", got, tt.admitted)
			}
			if tt.admitted {
				if len(*refused) != 0 || len(respCh) != 0 {
					t.Fatalf("admitted, yet refused %v / answered", *refused)
				}
				return
			}
			resp := <-respCh
			if resp.Error == nil || !strings.Contains(resp.Error.Error(), "not in this server's Raft configuration") {
				t.Fatalf("refusal answered %v", resp.Error)
			}
			if len(*refused) != 1 {
				t.Fatalf("refusals counted %v, want one", *refused)
			}
		})
	}
}

// TestGuardOverTheWire: a stranger's AppendEntries over the network gets
// the refusal as its error and never reaches raft's consumer; a member's
// does.
func TestGuardOverTheWire(t *testing.T) {
	conf := map[raft.ServerID]raft.ServerAddress{"c1": "127.0.0.1:1", "c2": "127.0.0.1:2"}
	g, _ := guarded(t, conf, true)
	got := make(chan string, 4)
	consume(t, g.Consumer(), func(rpc raft.RPC) {
		got <- string(rpc.Command.(*raft.AppendEntriesRequest).RPCHeader.ID)
		rpc.Respond(&raft.AppendEntriesResponse{Success: true}, nil)
	})
	peer := transport(t, nil)
	send := func(id string) error {
		var resp raft.AppendEntriesResponse
		return peer.AppendEntries("c1", g.LocalAddr(), &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte(id), Addr: []byte(peer.LocalAddr())}, Term: 9, Entries: []*raft.Log{{Index: 1}}}, &resp)
	}
	if err := send("s4"); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("a stranger's entries: %v, want refused", err)
	}
	if err := send("c2"); err != nil {
		t.Fatalf("a member's entries: %v", err)
	}
	select {
	case id := <-got:
		if id != "c2" {
			t.Fatalf("raft received entries from %q first: the stranger's got through", id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a member's entries did not reach raft")
	}
}

func TestConfigCacheRereadsForAnUnknownSender(t *testing.T) {
	now := time.Unix(0, 0)
	reads := 0
	conf := map[raft.ServerID]raft.ServerAddress{"c1": "a"}
	c := &configCache{now: func() time.Time { return now }, ttl: guardConfigTTL, read: func() (map[raft.ServerID]raft.ServerAddress, bool, error) {
		reads++
		if reads == 3 {
			return nil, false, errors.New("raft shut down")
		}
		return conf, true, nil
	}}
	c.get("c1")
	c.get("c1")
	if reads != 1 {
		t.Fatalf("%d reads for a known sender within the TTL, want 1", reads)
	}
	conf = map[raft.ServerID]raft.ServerAddress{"c1": "a", "c2": "b"}
	now = now.Add(time.Second)
	if got, _ := c.get("c2"); got["c2"] == "" || reads != 2 {
		t.Fatalf("an unknown sender: %v after %d reads, want the configuration re-read", got, reads)
	}
	now = now.Add(guardConfigTTL + time.Millisecond)
	if got, has := c.get("c1"); got["c2"] == "" || !has {
		t.Fatalf("a failed read dropped the cached configuration: %v %v", got, has)
	}
}

func entries(from string) any {
	return &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte(from)}, Term: 9, Entries: []*raft.Log{{Index: 1}}}
}
func heartbeat(from string) any {
	return &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte(from)}, Term: 9}
}
func snapshot(from string) any {
	return &raft.InstallSnapshotRequest{RPCHeader: raft.RPCHeader{ID: []byte(from)}, Term: 9}
}
func timeoutNow(from string) any {
	return &raft.TimeoutNowRequest{RPCHeader: raft.RPCHeader{ID: []byte(from)}}
}
func vote(from string) any {
	return &raft.RequestVoteRequest{RPCHeader: raft.RPCHeader{ID: []byte(from)}, Term: 9}
}
func legacyEntries(addr string) func(string) any {
	return func(string) any {
		return &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{Addr: []byte(addr)}, Term: 9, Entries: []*raft.Log{{Index: 1}}}
	}
}

// consume answers the RPCs of a transport's consumer with handle until the
// test ends: the channel is never closed, so the loop stops on cleanup
// and is waited for.
func consume(t *testing.T, rpcs <-chan raft.RPC, handle func(raft.RPC)) {
	t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case rpc := <-rpcs:
				handle(rpc)
			}
		}
	})
	t.Cleanup(func() { close(done); wg.Wait() })
}
