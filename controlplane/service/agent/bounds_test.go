package agent

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/controlplane/ephemeral"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// desiredOf is a Desired with n replicas on node n1 at revision rev; the
// calls count NodeDesired reads.
type desiredOf struct {
	Desired
	n, rev, calls int
}

func (d *desiredOf) Applied() (uint64, <-chan struct{}) { return uint64(d.rev), nil }

func (d *desiredOf) NodeDesired(string) *llmgwv1.DesiredReplicas {
	d.calls++
	out := &llmgwv1.DesiredReplicas{}
	for range d.n {
		out.Replicas = append(out.Replicas, &llmgwv1.Replica{Node: "n1"})
	}
	return out
}

func TestSessionBudget(t *testing.T) {
	bounds := Bounds{ReplicaSlack: 2, AdaptersPerReplica: 3, KVBlocksPerReplica: 100, MaxStatusBytes: 1024}
	for _, tc := range []struct {
		name    string
		bounds  Bounds
		desired int
		want    ephemeral.Budget
	}{
		{"desired plus slack; KV for the desired", bounds, 4, ephemeral.Budget{Statuses: 6, Adapters: 18, KVBlocks: 400}},
		{"no desired replicas: the slack; KV for one", bounds, 0, ephemeral.Budget{Statuses: 2, Adapters: 6, KVBlocks: 100}},
		{"never zero, which would not bound", Bounds{AdaptersPerReplica: 1, KVBlocksPerReplica: 1, MaxStatusBytes: 1}, 0, ephemeral.Budget{Statuses: 1, Adapters: 1, KVBlocks: 1}},
		{"zero bounds: unbounded", Bounds{}, 4, ephemeral.Budget{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &desiredOf{n: tc.desired, rev: 1}
			b := &sessionBudget{state: d, node: "n1", bounds: tc.bounds, now: time.Now}
			if got := b.get(); got != tc.want {
				t.Fatalf("budget %+v, want %+v", got, tc.want)
			}
		})
	}
	// Recomputed only when the state moved.
	d := &desiredOf{n: 1, rev: 1}
	b := &sessionBudget{state: d, node: "n1", bounds: bounds, now: time.Now}
	b.get()
	b.get()
	if d.calls != 1 {
		t.Fatalf("NodeDesired read %d times at one revision, want 1", d.calls)
	}
	d.rev, d.n = 2, 5
	if got := b.get(); got.Statuses != 7 || d.calls != 2 {
		t.Fatalf("after the state moved: %+v with %d reads, want 7 statuses from a second read", got, d.calls)
	}
}

// TestSessionBudgetShrinkGrace: when the node's desired set shrinks, the
// larger budget holds for shrinkGrace, so an agent that has not yet
// reported the removed replicas is not cut for them.
func TestSessionBudgetShrinkGrace(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	now := t0
	d := &desiredOf{n: 10, rev: 1}
	b := &sessionBudget{state: d, node: "n1", bounds: Bounds{ReplicaSlack: 2, AdaptersPerReplica: 1, KVBlocksPerReplica: 1, MaxStatusBytes: 1}, now: func() time.Time { return now }}
	steps := []struct {
		at       time.Duration
		desired  int
		statuses int
	}{
		{0, 10, 12},
		{time.Second, 0, 12},                  // shrank: the old budget holds
		{shrinkGrace, 0, 12},                  // still within the grace
		{shrinkGrace + 2*time.Second, 0, 2},   // the grace is over
		{shrinkGrace + 3*time.Second, 4, 6},   // growing applies at once
		{shrinkGrace + 4*time.Second, 3, 6},   // a new shrink, a new grace
		{2*shrinkGrace + 5*time.Second, 3, 5}, // over
	}
	for i, st := range steps {
		now = t0.Add(st.at)
		if st.desired != d.n {
			d.n, d.rev = st.desired, d.rev+1
		}
		if got := b.get().Statuses; got != st.statuses {
			t.Fatalf("step %d (at %v, %d desired): budget of %d statuses, want %d", i, st.at, st.desired, got, st.statuses)
		}
	}
}

func TestCheckSizes(t *testing.T) {
	b := Bounds{MaxStatusBytes: 256}
	big := strings.Repeat("x", 300)
	for _, tc := range []struct {
		name string
		u    *llmgwv1.EphemeralUpdate
		want bool
	}{
		{"small", &llmgwv1.EphemeralUpdate{Statuses: []*llmgwv1.ReplicaStatus{{ReplicaId: "r", Message: "ok"}}}, false},
		{"huge status", &llmgwv1.EphemeralUpdate{Statuses: []*llmgwv1.ReplicaStatus{{ReplicaId: "r", Message: big}}}, true},
		{"huge adapter status", &llmgwv1.EphemeralUpdate{Adapters: []*llmgwv1.AdapterStatus{{ReplicaId: "r", Adapter: big}}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := b.checkSizes(tc.u)
			var fl *errFlood
			if got := errors.As(err, &fl); got != tc.want || (got && fl.reason != "status_bytes") {
				t.Fatalf("checkSizes = %v, want refused %v", err, tc.want)
			}
		})
	}
}

// The chunks a session may hold aside follow its budget: room for every
// hash and status the node may hold, and no bound without bounds.
func TestChunkBytesFollowBudget(t *testing.T) {
	d := &desiredOf{n: 8, rev: 1}
	b := &sessionBudget{state: d, node: "n1", bounds: Bounds{ReplicaSlack: 8, AdaptersPerReplica: 4, KVBlocksPerReplica: 1000, MaxStatusBytes: 2048}, now: time.Now}
	if got, min := b.chunkBytes(), 8*8*1000+2048*(16+64); got < min {
		t.Fatalf("chunk bound %d, below the %d bytes the budget lets the node hold", got, min)
	}
	none := &sessionBudget{state: d, node: "n1", now: time.Now}
	if got := none.chunkBytes(); got != 0 {
		t.Fatalf("chunk bound %d without bounds, want 0 (none)", got)
	}
}
