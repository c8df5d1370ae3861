package ephemeral

import (
	"fmt"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func upd(epoch, seq uint64, full bool, replicas ...string) *llmgwv1.EphemeralUpdate {
	u := &llmgwv1.EphemeralUpdate{Node: "n1", Epoch: epoch, Seq: seq, Full: full}
	for _, r := range replicas {
		u.Statuses = append(u.Statuses, &llmgwv1.ReplicaStatus{ReplicaId: r, Uid: seq, Phase: llmgwv1.ReplicaPhase_REPLICA_PHASE_READY})
	}
	return u
}

func TestAcceptanceRule(t *testing.T) {
	tests := []struct {
		name    string
		held    *llmgwv1.EphemeralUpdate // applied first, when set
		update  *llmgwv1.EphemeralUpdate
		want    Verdict
		wantSeq uint64
	}{
		{"first full copy", nil, upd(5, 1, true), Accepted, 1},
		{"delta before any full copy", nil, upd(5, 2, false), Gap, 0},
		{"next delta", upd(5, 1, true), upd(5, 2, false), Accepted, 2},
		{"duplicate delta", upd(5, 2, true), upd(5, 2, false), Stale, 2},
		{"skipped delta", upd(5, 1, true), upd(5, 3, false), Gap, 1},
		{"late delta from an older session", upd(6, 1, true), upd(5, 2, false), Stale, 1},
		{"delta from a newer session without its copy", upd(5, 1, true), upd(6, 2, false), Gap, 1},
		{"newer session's full copy", upd(5, 9, true), upd(6, 1, true), Accepted, 1},
		{"full copy asked for within a session", upd(5, 3, true), upd(5, 4, true), Accepted, 4},
		{"older full copy", upd(6, 1, true), upd(5, 9, true), Stale, 1},
		{"same full copy again", upd(5, 1, true), upd(5, 1, true), Stale, 1},
		{"no node", nil, &llmgwv1.EphemeralUpdate{Full: true, Epoch: 1, Seq: 1}, Stale, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewStore()
			if tt.held != nil && s.Apply(tt.held) != Accepted {
				t.Fatal("setup update refused")
			}
			if got := s.Apply(tt.update); got != tt.want {
				t.Fatalf("Apply = %v, want %v", got, tt.want)
			}
			_, seq, _ := s.Held("n1")
			if seq != tt.wantSeq {
				t.Fatalf("held seq %d, want %d", seq, tt.wantSeq)
			}
		})
	}
}

func TestFullCopyReplacesAndDeltasMerge(t *testing.T) {
	s := NewStore()
	changed := s.Changed()
	s.Apply(upd(1, 1, true, "a", "b"))
	select {
	case <-changed:
	default:
		t.Fatal("Changed not closed by an accepted update")
	}
	changed = s.Changed()
	s.Apply(upd(1, 1, true, "a", "b")) // stale
	select {
	case <-changed:
		t.Fatal("Changed closed by a dropped update")
	default:
	}
	d := upd(1, 2, false, "c")
	d.RemovedReplicas = []string{"a"}
	s.Apply(d)
	has := func(id string) bool { _, ok := s.Status("n1", id); return ok }
	if has("a") || !has("b") || !has("c") {
		t.Fatal("after delta: want b and c only")
	}
	s.Apply(upd(2, 1, true, "z"))
	if has("b") || has("c") || !has("z") {
		t.Fatal("a full copy must replace everything")
	}
	if st := s.StatusOf(&llmgwv1.Replica{Id: "z", Node: "n1", Uid: 1}); st == nil {
		t.Fatal("StatusOf: no status for the same uid")
	}
	if st := s.StatusOf(&llmgwv1.Replica{Id: "z", Node: "n1", Uid: 7}); st != nil {
		t.Fatal("StatusOf: another placement's status returned")
	}
	if st := s.StatusOf(&llmgwv1.Replica{Id: "z", Node: "n2", Uid: 1}); st != nil {
		t.Fatal("StatusOf: another node's report returned")
	}
}

func TestSubscribeJoinsCopiesAndDeltas(t *testing.T) {
	s := NewStore()
	s.Apply(upd(1, 1, true, "a"))
	sub, copies := s.Subscribe(4)
	defer sub.Close()
	if len(copies) != 1 || copies[0].Seq != 1 || !copies[0].Full || len(copies[0].Statuses) != 1 {
		t.Fatalf("copies %v", copies)
	}
	s.Apply(upd(1, 2, false, "b"))
	s.Apply(upd(1, 9, false, "x")) // a gap: never reaches subscribers
	got := <-sub.Updates()
	if got.Seq != 2 || got.Epoch != 1 || got.Node != "n1" {
		t.Fatalf("delta %v", got)
	}
	select {
	case u := <-sub.Updates():
		t.Fatalf("a dropped update was delivered: %v", u)
	default:
	}
}

func TestOverflowEndsOnlyTheSlowSubscriber(t *testing.T) {
	s := NewStore()
	s.Apply(upd(1, 1, true))
	slow, _ := s.Subscribe(1)
	fast, _ := s.Subscribe(8)
	defer slow.Close()
	defer fast.Close()
	for seq := uint64(2); seq <= 4; seq++ {
		s.Apply(upd(1, seq, false, "a"))
	}
	select {
	case <-slow.Overflowed():
	default:
		t.Fatal("slow subscriber not ended")
	}
	select {
	case <-fast.Overflowed():
		t.Fatal("fast subscriber ended")
	default:
	}
	if n := len(fast.Updates()); n != 3 {
		t.Fatalf("fast subscriber has %d updates, want 3", n)
	}
}

// FuzzApply feeds agent updates decoded from arbitrary bytes (they come off
// the network): no panic, and the held (epoch, seq) never moves backwards.
func FuzzApply(f *testing.F) {
	for _, u := range []*llmgwv1.EphemeralUpdate{upd(1, 1, true, "a"), upd(1, 2, false, "b"), upd(2, 1, true)} {
		b, _ := proto.Marshal(u)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s := NewStore()
		s.Apply(upd(5, 5, true, "a"))
		sub, _ := s.Subscribe(1)
		defer sub.Close()
		var u llmgwv1.EphemeralUpdate
		if err := proto.Unmarshal(data, &u); err != nil {
			return
		}
		s.Apply(&u)
		e, q, _ := s.Held("n1")
		if e < 5 || (e == 5 && q < 5) {
			t.Fatalf("held went backwards to (%d, %d)", e, q)
		}
		_ = s.StatusOf(&llmgwv1.Replica{Id: "a", Node: "n1", Uid: 5})
	})
}

func TestKVBlocksAreHeldForCopies(t *testing.T) {
	s := NewStore()
	full := upd(1, 1, true, "a")
	full.Kv = []*llmgwv1.KVBlocks{{ReplicaId: "a", Uid: 1, Incarnation: 1, Stored: []uint64{3, 1, 2}, BlockSize: 16}}
	s.Apply(full)
	d := upd(1, 2, false)
	d.Kv = []*llmgwv1.KVBlocks{{ReplicaId: "a", Uid: 1, Incarnation: 1, Stored: []uint64{4}, Removed: []uint64{1}}}
	s.Apply(d)
	copyOf := func() *llmgwv1.KVBlocks {
		_, copies := s.Subscribe(1)
		if len(copies) != 1 || len(copies[0].Kv) != 1 {
			t.Fatalf("copies: %v", copies)
		}
		return copies[0].Kv[0]
	}
	if k := copyOf(); !k.Reset_ || fmt.Sprint(k.Stored) != "[2 3 4]" || k.BlockSize != 16 || k.Uid != 1 {
		t.Fatalf("after a delta: %v", k)
	}
	// A new incarnation replaces the set even without a reset.
	if got := s.KVOf(&llmgwv1.Replica{Id: "a", Node: "n1", Uid: 1}); got.GetBlocks() != 3 || got.GetUntrusted() {
		t.Fatalf("KVOf after a delta: %v", got)
	}
	d = upd(1, 3, false)
	d.Kv = []*llmgwv1.KVBlocks{{ReplicaId: "a", Uid: 1, Incarnation: 2, Stored: []uint64{9}, Untrusted: true, UntrustedReason: "replay failed"}}
	s.Apply(d)
	if k := copyOf(); fmt.Sprint(k.Stored) != "[9]" || !k.Untrusted || k.UntrustedReason != "replay failed" || k.Incarnation != 2 || k.BlockSize != 16 {
		t.Fatalf("after a restart: %v", k)
	}
	// What llmgwctl replica list shows: the summary, for this placement only.
	if got := s.KVOf(&llmgwv1.Replica{Id: "a", Node: "n1", Uid: 1}); !got.GetUntrusted() || got.GetUntrustedReason() != "replay failed" || got.GetIncarnation() != 2 {
		t.Fatalf("KVOf: %v", got)
	}
	if got := s.KVOf(&llmgwv1.Replica{Id: "a", Node: "n1", Uid: 2}); got != nil {
		t.Fatalf("KVOf of another placement: %v", got)
	}
	d = upd(1, 4, false)
	d.RemovedReplicas = []string{"a"}
	s.Apply(d)
	if _, copies := s.Subscribe(1); len(copies[0].Kv) != 0 {
		t.Fatalf("a removed replica's blocks are kept: %v", copies[0].Kv)
	}
}

func TestAdapterStatusesAreHeldForCopies(t *testing.T) {
	ad := func(replica string, uid uint64, name string, st llmgwv1.AdapterState) *llmgwv1.AdapterStatus {
		return &llmgwv1.AdapterStatus{ReplicaId: replica, Uid: uid, Incarnation: 1, Adapter: name, State: st}
	}
	s := NewStore()
	full := upd(1, 1, true, "a")
	full.Adapters = []*llmgwv1.AdapterStatus{ad("a", 1, "sql", llmgwv1.AdapterState_ADAPTER_STATE_LOADING), ad("a", 1, "legal", llmgwv1.AdapterState_ADAPTER_STATE_LOADED)}
	s.Apply(full)
	d := upd(1, 2, false)
	d.Adapters = []*llmgwv1.AdapterStatus{ad("a", 1, "sql", llmgwv1.AdapterState_ADAPTER_STATE_LOADED), ad("", 1, "x", 0), ad("a", 1, "", 0)}
	s.Apply(d)
	tests := []struct {
		name    string
		replica *llmgwv1.Replica
		want    string
	}{
		{"same placement", &llmgwv1.Replica{Id: "a", Uid: 1, Node: "n1"}, "legal=ADAPTER_STATE_LOADED sql=ADAPTER_STATE_LOADED"},
		{"another uid", &llmgwv1.Replica{Id: "a", Uid: 2, Node: "n1"}, ""},
		{"another node", &llmgwv1.Replica{Id: "a", Uid: 1, Node: "n2"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := s.AdaptersOf(tt.replica)
			var parts []string
			for _, n := range []string{"legal", "sql"} {
				if a, ok := got[n]; ok {
					parts = append(parts, n+"="+a.State.String())
				}
			}
			if fmt.Sprint(len(got)) != fmt.Sprint(len(parts)) || joinSpace(parts) != tt.want {
				t.Fatalf("AdaptersOf = %v, want %q", got, tt.want)
			}
		})
	}
	fc, _ := s.FullCopy("n1")
	if len(fc.Adapters) != 2 || fc.Adapters[0].Adapter != "legal" || fc.Adapters[1].State != llmgwv1.AdapterState_ADAPTER_STATE_LOADED {
		t.Fatalf("full copy adapters: %v", fc.Adapters)
	}
	d = upd(1, 3, false)
	d.Adapters = []*llmgwv1.AdapterStatus{ad("a", 1, "legal", llmgwv1.AdapterState_ADAPTER_STATE_UNSPECIFIED)}
	s.Apply(d)
	if fc, _ := s.FullCopy("n1"); len(fc.Adapters) != 1 || fc.Adapters[0].Adapter != "sql" {
		t.Fatalf("an unloaded adapter is kept: %v", fc.Adapters)
	}
	d = upd(1, 4, false)
	d.RemovedReplicas = []string{"a"}
	s.Apply(d)
	if fc, _ := s.FullCopy("n1"); len(fc.Adapters) != 0 {
		t.Fatalf("a removed replica's adapters are kept: %v", fc.Adapters)
	}
}

func joinSpace(parts []string) string {
	out := ""
	for i, p := range parts {
		if i > 0 {
			out += " "
		}
		out += p
	}
	return out
}

// TestKVTiersAreHeldForCopies: the offload tiers' sets are kept beside the
// GPU tier's, a reset replaces every tier, and the budget counts them all.
func TestKVTiersAreHeldForCopies(t *testing.T) {
	s := NewStore()
	full := upd(1, 1, true, "a")
	full.Kv = []*llmgwv1.KVBlocks{{ReplicaId: "a", Uid: 1, Incarnation: 1, Stored: []uint64{1}, StoredCpu: []uint64{3, 1, 2}, StoredStorage: []uint64{5}}}
	s.Apply(full)
	d := upd(1, 2, false)
	d.Kv = []*llmgwv1.KVBlocks{{ReplicaId: "a", Uid: 1, Incarnation: 1, StoredCpu: []uint64{4}, RemovedCpu: []uint64{1}, RemovedStorage: []uint64{5}}}
	s.Apply(d)
	copyOf := func() *llmgwv1.KVBlocks {
		_, copies := s.Subscribe(1)
		if len(copies) != 1 || len(copies[0].Kv) != 1 {
			t.Fatalf("copies: %v", copies)
		}
		return copies[0].Kv[0]
	}
	if k := copyOf(); !k.Reset_ || fmt.Sprint(k.Stored, k.StoredCpu, k.StoredStorage) != "[1] [2 3 4] []" {
		t.Fatalf("after a delta: %v", k)
	}
	d = upd(1, 3, false)
	d.Kv = []*llmgwv1.KVBlocks{{ReplicaId: "a", Uid: 1, Incarnation: 1, Reset_: true, Stored: []uint64{9}}}
	s.Apply(d)
	if k := copyOf(); fmt.Sprint(k.Stored, k.StoredCpu, k.StoredStorage) != "[9] [] []" {
		t.Fatalf("a reset keeps an offload tier: %v", k)
	}
	// The budget counts every tier: 1 GPU and 3 CPU hashes are 4.
	u := upd(2, 1, true, "b")
	u.Node = "n2"
	u.Kv = []*llmgwv1.KVBlocks{{ReplicaId: "b", Uid: 1, Incarnation: 1, Stored: []uint64{1}, StoredCpu: []uint64{1, 2, 3}}}
	if v, err := s.ApplyWithin(u, Budget{KVBlocks: 3}); err == nil {
		t.Fatalf("4 hashes over tiers within a budget of 3: %v", v)
	}
}
