package cluster

import (
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"
)

// TestPeerFigures: list-peers' last contact and stable time are true for a
// server that died (autopilot keeps its last stats), one never heard from,
// and one restarted within autopilot's health check (stable since before
// it started).
func TestPeerFigures(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	now := t0.Add(time.Hour)
	c := &Cluster{cfg: Config{NodeID: "c1", AutopilotInterval: time.Second, Started: t0.Add(-time.Hour)}}
	c.now = func() time.Time { return now.Add(-30 * time.Second) }
	c.recordHeard("dead", 7*time.Millisecond, proto.Int64(t0.UnixMilli()))
	c.now = func() time.Time { return now.Add(-500 * time.Millisecond) }
	c.recordHeard("live", 12*time.Millisecond, proto.Int64(t0.UnixMilli()))
	c.recordHeard("restarted", 3*time.Millisecond, proto.Int64(now.Add(-10*time.Second).UnixMilli()))
	c.recordHeard("old", 3*time.Millisecond, nil)

	tests := []struct {
		id          raft.ServerID
		wantContact int64
		stableSince time.Time
		wantStable  time.Duration
	}{
		{"c1", 0, t0.Add(-2 * time.Hour), 2 * time.Hour},          // itself: bounded by its own uptime
		{"live", 12, t0.Add(30 * time.Minute), 30 * time.Minute},  // its own figure; stable per autopilot
		{"dead", 30007, time.Time{}, 0},                           // silent for 30 s: 30 s plus what it said
		{"never", -1, t0, time.Hour},                              // never heard from; no start time known
		{"restarted", 3, t0, 10 * time.Second},                    // stable since before it started: its uptime
		{"old", 3, t0.Add(-time.Minute), time.Hour + time.Minute}, // an older server that sends no start time
	}
	for _, tt := range tests {
		t.Run(string(tt.id), func(t *testing.T) {
			if got := c.lastContact(tt.id, now); got != tt.wantContact {
				t.Errorf("last contact %d ms, want %d", got, tt.wantContact)
			}
			if tt.stableSince.IsZero() {
				return
			}
			if got := c.stable(tt.id, tt.stableSince, now); got != tt.wantStable {
				t.Errorf("stable %v, want %v", got, tt.wantStable)
			}
		})
	}

	c.forgetHeard()
	if got := c.lastContact("live", now); got != -1 {
		t.Errorf("after a new term: last contact %d, want -1 (not heard from this term)", got)
	}
}

// soloRaft is the Raft of a one-server cluster whose only server leads.
type soloRaft struct{ Raft }

func (soloRaft) Servers() []raft.Server {
	return []raft.Server{{ID: "solo", Address: "127.0.0.1:7401", Suffrage: raft.Voter}}
}
func (soloRaft) LeaderID() string                            { return "solo" }
func (soloRaft) IsLeader() bool                              { return true }
func (soloRaft) LocalStats() (uint64, uint64, time.Duration) { return 41, 2, 0 }

// TestPeersAlone: a one-server cluster without gossip (llmgw dev), so
// without autopilot, shows its leader stable for its uptime, not 0s
// (issue 34).
func TestPeersAlone(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	c := &Cluster{cfg: Config{NodeID: "solo", Started: t0}, raft: soloRaft{}}
	c.now = func() time.Time { return t0.Add(90 * time.Minute) }
	peers, err := c.Peers()
	if err != nil {
		t.Fatal(err)
	}
	if len(peers) != 1 {
		t.Fatalf("peers %v, want one", peers)
	}
	p := peers[0]
	if !p.Leader || !p.Healthy || p.LastIndex != 41 || p.StableSeconds != 90*60 {
		t.Fatalf("peer %v: want the leader, healthy, last index 41, stable 5400 s", p)
	}
}
