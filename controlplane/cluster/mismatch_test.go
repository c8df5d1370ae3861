package cluster

import (
	"log/slog"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/llmgw/llmgw/controlplane/gossip"
)

// configRaft is a Raft whose configuration is servers; the rest of Raft
// is unused here.
type configRaft struct {
	Raft
	servers []raft.Server
}

func (r configRaft) Servers() []raft.Server { return r.servers }

// memberGossip is gossip's member table alone.
type memberGossip struct {
	Gossip
	ms map[string]gossip.Member
}

func (g memberGossip) Member(id string) (gossip.Member, bool) { m, ok := g.ms[id]; return m, ok }

// TestGossipRaftMismatch: servers of the configuration gossip does not see
// live are counted, this server never; suspect still counts as live.
func TestGossipRaftMismatch(t *testing.T) {
	conf := []raft.Server{{ID: "c1"}, {ID: "c2"}, {ID: "c3"}, {ID: "c4"}}
	m := func(st gossip.Status) gossip.Member { return gossip.Member{Status: st} }
	tests := []struct {
		name string
		ms   map[string]gossip.Member
		want int
	}{
		{"all alive", map[string]gossip.Member{"c2": m(gossip.StatusAlive), "c3": m(gossip.StatusAlive), "c4": m(gossip.StatusSuspect)}, 0},
		{"dead, left and unseen", map[string]gossip.Member{"c2": m(gossip.StatusDead), "c3": m(gossip.StatusLeft)}, 3},
		{"a member outside raft does not count", map[string]gossip.Member{"c2": m(gossip.StatusAlive), "c3": m(gossip.StatusAlive), "c4": m(gossip.StatusAlive), "c9": m(gossip.StatusDead)}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := New(Config{NodeID: "c1"}, configRaft{servers: conf}, nil, memberGossip{ms: tt.ms}, nil, nil, nil, slog.New(slog.DiscardHandler), time.Now)
			if got := c.GossipRaftMismatch(); got != tt.want {
				t.Fatalf("GossipRaftMismatch = %d, want %d", got, tt.want)
			}
		})
	}
	if got := New(Config{NodeID: "c1"}, configRaft{servers: conf}, nil, nil, nil, nil, nil, slog.New(slog.DiscardHandler), time.Now).GossipRaftMismatch(); got != 0 {
		t.Fatalf("without gossip: %d, want 0", got)
	}
}
