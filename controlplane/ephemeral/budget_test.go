package ephemeral

import (
	"errors"
	"fmt"
	"testing"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}

func withKV(u *llmgwv1.EphemeralUpdate, replica string, blocks int) *llmgwv1.EphemeralUpdate {
	b := &llmgwv1.KVBlocks{ReplicaId: replica, Uid: 1, Incarnation: 1}
	for i := range blocks {
		b.Stored = append(b.Stored, uint64(i))
	}
	u.Kv = append(u.Kv, b)
	return u
}

func withAdapters(u *llmgwv1.EphemeralUpdate, replica string, n int) *llmgwv1.EphemeralUpdate {
	for _, a := range names("a", n) {
		u.Adapters = append(u.Adapters, &llmgwv1.AdapterStatus{ReplicaId: replica, Adapter: a, State: llmgwv1.AdapterState_ADAPTER_STATE_LOADED})
	}
	return u
}

func TestApplyWithin(t *testing.T) {
	budget := Budget{Statuses: 4, Adapters: 3, KVBlocks: 10}
	tests := []struct {
		name     string
		updates  []*llmgwv1.EphemeralUpdate
		want     Verdict // of the last update
		wantWhat string
	}{
		{"full copy within", []*llmgwv1.EphemeralUpdate{upd(1, 1, true, names("r", 4)...)}, Accepted, ""},
		{"full copy over", []*llmgwv1.EphemeralUpdate{upd(1, 1, true, names("r", 5)...)}, OverBudget, "statuses"},
		{"deltas adding up over", []*llmgwv1.EphemeralUpdate{
			upd(1, 1, true, names("r", 3)...), upd(1, 2, false, "x"), upd(1, 3, false, "y"),
		}, OverBudget, "statuses"},
		{"upserts of held replicas do not add", []*llmgwv1.EphemeralUpdate{
			upd(1, 1, true, names("r", 4)...), upd(1, 2, false, names("r", 4)...), upd(1, 3, false, names("r", 4)...),
		}, Accepted, ""},
		{"removals make room", []*llmgwv1.EphemeralUpdate{
			upd(1, 1, true, names("r", 4)...),
			func() *llmgwv1.EphemeralUpdate {
				u := upd(1, 2, false, "x")
				u.RemovedReplicas = []string{"r0"}
				return u
			}(),
		}, Accepted, ""},
		{"kv blocks over", []*llmgwv1.EphemeralUpdate{withKV(upd(1, 1, true, "r0"), "r0", 11)}, OverBudget, "kv_blocks"},
		{"kv blocks re-stored do not add", []*llmgwv1.EphemeralUpdate{
			withKV(upd(1, 1, true, "r0"), "r0", 10), withKV(upd(1, 2, false), "r0", 10),
		}, Accepted, ""},
		{"adapters over", []*llmgwv1.EphemeralUpdate{withAdapters(upd(1, 1, true, "r0"), "r0", 4)}, OverBudget, "adapters"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewStore()
			sub, _ := s.Subscribe(16)
			defer sub.Close()
			var (
				v   Verdict
				err error
			)
			for i, u := range tt.updates {
				if v, err = s.ApplyWithin(u, budget); i < len(tt.updates)-1 && v != Accepted {
					t.Fatalf("update %d: %v (%v), want accepted", i, v, err)
				}
			}
			if v != tt.want {
				t.Fatalf("last update: %v (%v), want %v", v, err, tt.want)
			}
			var ob *OverBudgetError
			if tt.want != OverBudget {
				if err != nil {
					t.Fatalf("error %v with verdict %v", err, v)
				}
				return
			}
			if !errors.As(err, &ob) || ob.What != tt.wantWhat {
				t.Fatalf("error %v, want an OverBudgetError about %s", err, tt.wantWhat)
			}
			if _, _, ok := s.Held("n1"); ok {
				t.Error("node still held after an update over budget: its data must be dropped")
			}
			if got := len(sub.Updates()); got != len(tt.updates)-1 {
				t.Errorf("subscriber got %d updates, want %d: the one over budget must not reach it", got, len(tt.updates)-1)
			}
		})
	}
}

func TestDropKeepsANewerSession(t *testing.T) {
	s := NewStore()
	s.Apply(upd(2, 1, true, "r0"))
	if s.Drop("n1", 1) {
		t.Fatal("dropped epoch 2's data for an ended epoch-1 session")
	}
	if _, ok := s.Status("n1", "r0"); !ok {
		t.Fatal("newer session's status lost")
	}
	if !s.Drop("n1", 2) {
		t.Fatal("Drop of the held epoch reported nothing dropped")
	}
	if _, _, ok := s.Held("n1"); ok {
		t.Fatal("node held after Drop")
	}
}
