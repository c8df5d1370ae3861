//go:build !llmgw_upgrade_old

package cluster

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/controlplane/gossip"
	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestRemovedNow: the newer of the replicated record and the gossip
// tombstone decides, the replicated one on a tie; either alone decides;
// neither is not removed.
func TestRemovedNow(t *testing.T) {
	rec := func(removed bool, at int64) *llmgwv1.ServerRemoval {
		return &llmgwv1.ServerRemoval{ServerId: "c3", Removed: removed, AtUnixNano: at}
	}
	ts := func(removed bool, at int64) gossip.Tombstone { return gossip.Tombstone{Removed: removed, At: at} }
	tests := []struct {
		name  string
		rec   *llmgwv1.ServerRemoval
		t     gossip.Tombstone
		inGsp bool
		want  bool
	}{
		{"neither", nil, gossip.Tombstone{}, false, false},
		{"replicated alone: removed (a full restart forgot gossip)", rec(true, 10), gossip.Tombstone{}, false, true},
		{"replicated alone: cleared", rec(false, 10), gossip.Tombstone{}, false, false},
		{"gossip alone: removed (a mixed cluster)", nil, ts(true, 10), true, true},
		{"gossip alone: cleared", nil, ts(false, 10), true, false},
		{"a newer join in gossip wins", rec(true, 10), ts(false, 11), true, false},
		{"an older join in gossip loses", rec(true, 10), ts(false, 9), true, true},
		{"a newer removal in gossip wins", rec(false, 10), ts(true, 11), true, true},
		{"a tie goes to the replicated record", rec(true, 10), ts(false, 10), true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := removedNow(tt.rec, tt.t, tt.inGsp); got != tt.want {
				t.Fatalf("removedNow = %v, want %v", got, tt.want)
			}
		})
	}
}

// fakeGossip is the gossip tombstones alone; the rest of Gossip is unused
// here (calling it panics on the nil embedded interface).
type fakeGossip struct {
	Gossip
	ts  map[string]gossip.Tombstone
	now int64
}

func (g *fakeGossip) Tombstones() map[string]gossip.Tombstone { return maps.Clone(g.ts) }
func (g *fakeGossip) SetRemoved(id string, removed bool) int64 {
	g.now++
	g.ts[id] = gossip.Tombstone{Removed: removed, At: g.now}
	return g.now
}

// fsmProposer commits to a real FSM, refusing gated commands as the gate
// does while min_version is below them (refuse), and counts proposals.
type fsmProposer struct {
	f        *fsm.FSM
	index    uint64
	refuse   bool
	proposed []*llmgwv1.SetServerRemovedCommand
}

var errGateForTest = errors.New("minimum-version gate (test)")

func (p *fsmProposer) Propose(_ context.Context, t llmgwv1.CommandType, payload proto.Message) (any, uint64, error) {
	if p.refuse && fsm.Introduced(t) != "" {
		return nil, 0, errGateForTest
	}
	if c, ok := payload.(*llmgwv1.SetServerRemovedCommand); ok {
		p.proposed = append(p.proposed, c)
	}
	return p.apply(t, payload)
}

func (p *fsmProposer) apply(t llmgwv1.CommandType, payload proto.Message) (any, uint64, error) {
	b, err := fsm.NewCommand(t, payload)
	if err != nil {
		return nil, 0, err
	}
	p.index++
	res, err := p.f.Apply(p.index, b)
	return res, p.index, err
}

func newRemovalsCluster(t *testing.T, min string, refuse bool) (*Cluster, *fakeGossip, *fsmProposer) {
	t.Helper()
	p := &fsmProposer{f: fsm.New(fsm.Config{}), refuse: refuse}
	if min != "" {
		if _, _, err := p.apply(llmgwv1.CommandType_COMMAND_TYPE_SET_CLUSTER_CONFIG, &llmgwv1.SetClusterConfigCommand{Config: &llmgwv1.ClusterConfig{MinVersion: min}}); err != nil {
			t.Fatal(err)
		}
	}
	g := &fakeGossip{ts: map[string]gossip.Tombstone{}, now: 100}
	c := New(Config{NodeID: "c1"}, nil, nil, g, p.f, p, NewPool(nil), slog.New(slog.DiscardHandler), time.Now)
	return c, g, p
}

// TestRemovalsSurviveGossipLoss: with the gate committed, a removal is
// recorded in the replicated state and still keeps the server out once
// gossip forgot it (every server restarted); in a mixed cluster (the gate
// refuses) it lives in gossip alone, as before the command existed.
func TestRemovalsSurviveGossipLoss(t *testing.T) {
	tests := []struct {
		name       string
		min        string
		refuse     bool
		replicated bool // recorded in the FSM, so it survives gossip's loss
	}{
		{"gate committed", fsm.ServerRemovedVersion, false, true},
		{"mixed cluster: the gate refuses", "", true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, g, p := newRemovalsCluster(t, tt.min, tt.refuse)
			c.recordRemoval(context.Background(), "c3", true, g.SetRemoved("c3", true))
			if !c.removedServers()["c3"] {
				t.Fatal("c3 not removed right after its removal")
			}
			rec, ok := p.f.ServerRemoved("c3")
			if ok != tt.replicated || (ok && (!rec.Removed || rec.AtUnixNano != g.ts["c3"].At)) {
				t.Fatalf("replicated record %v (%v), want one: %v, at gossip's time %d", rec, ok, tt.replicated, g.ts["c3"].At)
			}
			if c.reconnectable("c3") || !c.reconnectable("c2") {
				t.Fatalf("reconnectable: c3 (removed) %v, c2 %v; want false, true", c.reconnectable("c3"), c.reconnectable("c2"))
			}
			g.ts = map[string]gossip.Tombstone{} // every server restarted
			if got := c.reconnectable("c3"); got == tt.replicated {
				t.Fatalf("after gossip forgot it: reconnectable %v, want %v (the replicated record alone keeps it out)", got, !tt.replicated)
			}
			if got := c.removedServers()["c3"]; got != tt.replicated {
				t.Fatalf("after gossip forgot it: removed %v, want %v", got, tt.replicated)
			}
		})
	}
}

// TestSyncRemovals: once the gate is committed the leader copies gossip
// tombstones newer than the replicated records (a join on another server,
// a removal from before the gate) and leaves older or equal ones; before
// the gate is committed it proposes nothing, so it never commits a minimum
// version by itself.
func TestSyncRemovals(t *testing.T) {
	t.Run("gate committed", func(t *testing.T) {
		c, g, p := newRemovalsCluster(t, fsm.ServerRemovedVersion, false)
		c.recordRemoval(context.Background(), "c3", true, g.SetRemoved("c3", true)) // at 101, both
		g.ts["c4"] = gossip.Tombstone{Removed: true, At: 50}                        // from before the gate
		g.ts["c3"] = gossip.Tombstone{Removed: false, At: 200}                      // a join elsewhere
		p.proposed = nil
		c.syncRemovals(context.Background(), map[string]bool{})
		for id, want := range map[string]bool{"c3": false, "c4": true} {
			rec, ok := p.f.ServerRemoved(id)
			if !ok || rec.Removed != want || rec.AtUnixNano != g.ts[id].At {
				t.Errorf("%s: replicated record %v (%v), want removed %v at %d", id, rec, ok, want, g.ts[id].At)
			}
		}
		if len(p.proposed) != 2 {
			t.Fatalf("proposed %v, want c3 and c4", p.proposed)
		}
		// In step: nothing more to copy.
		p.proposed = nil
		c.syncRemovals(context.Background(), map[string]bool{})
		if len(p.proposed) != 0 {
			t.Fatalf("a second round proposed %v", p.proposed)
		}
		// A replicated record newer than gossip's stays.
		g.ts["c3"] = gossip.Tombstone{Removed: true, At: 150}
		c.syncRemovals(context.Background(), map[string]bool{})
		if rec, _ := p.f.ServerRemoved("c3"); rec.Removed || len(p.proposed) != 0 {
			t.Fatalf("an older gossip tombstone overwrote the record: %v, proposed %v", rec, p.proposed)
		}
	})
	t.Run("gate not committed", func(t *testing.T) {
		for _, min := range []string{"", "v0.1.0"} {
			c, g, p := newRemovalsCluster(t, min, false)
			g.ts["c4"] = gossip.Tombstone{Removed: true, At: 50}
			c.syncRemovals(context.Background(), map[string]bool{})
			if len(p.proposed) != 0 || p.f.Config().MinVersion != min {
				t.Fatalf("min %q: proposed %v, min_version now %q", min, p.proposed, p.f.Config().MinVersion)
			}
			if !c.removedServers()["c4"] {
				t.Fatalf("min %q: the gossip tombstone is not honoured", min)
			}
		}
	})
}
