package kvindex

import (
	"math"
	"slices"
	"testing"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// tiered is a replica's update with each tier's lists.
func tiered(id string, reset bool, gpu, cpu, storage []uint64) *llmgwv1.KVBlocks {
	return &llmgwv1.KVBlocks{ReplicaId: id, Uid: 1, Incarnation: 1, Reset_: reset, Stored: gpu, StoredCpu: cpu, StoredStorage: storage, BlockSize: 16}
}

type tierAnswer struct {
	blocks, gpu int
	credit      float64
}

func TestLookupTiers(t *testing.T) {
	w := Weights{CPU: 0.8, Storage: 0.25}
	tests := []struct {
		name    string
		updates []*llmgwv1.KVBlocks
		prompt  []uint64
		want    map[string]tierAnswer
	}{
		{"gpu only: Lookup's answer, credit one a block", []*llmgwv1.KVBlocks{tiered("a", true, []uint64{1, 2}, nil, nil)},
			[]uint64{1, 2, 3}, map[string]tierAnswer{"a": {2, 2, 2}}},
		{"cpu carries on the gpu's prefix", []*llmgwv1.KVBlocks{tiered("a", true, []uint64{1}, []uint64{2, 3}, nil)},
			[]uint64{1, 2, 3, 4}, map[string]tierAnswer{"a": {3, 1, 2.6}}},
		{"offloaded only: no gpu blocks", []*llmgwv1.KVBlocks{tiered("a", true, nil, []uint64{1, 2}, []uint64{3})},
			[]uint64{1, 2, 3}, map[string]tierAnswer{"a": {3, 0, 1.85}}},
		{"best tier counts", []*llmgwv1.KVBlocks{tiered("a", true, []uint64{1, 2}, []uint64{1, 2}, []uint64{1, 2})},
			[]uint64{1, 2}, map[string]tierAnswer{"a": {2, 2, 2}}},
		{"gpu after an offloaded block still credits one, but is not leading on the gpu",
			[]*llmgwv1.KVBlocks{tiered("a", true, []uint64{2}, []uint64{1}, nil)},
			[]uint64{1, 2}, map[string]tierAnswer{"a": {2, 0, 1.8}}},
		{"a gap in every tier ends it", []*llmgwv1.KVBlocks{tiered("a", true, []uint64{1}, []uint64{3}, nil)},
			[]uint64{1, 2, 3}, map[string]tierAnswer{"a": {1, 1, 1}}},
		{"replicas ranked by credit", []*llmgwv1.KVBlocks{
			tiered("gpu", true, []uint64{1, 2}, nil, nil), tiered("cpu", true, nil, []uint64{1, 2, 3, 4}, nil)},
			[]uint64{1, 2, 3, 4}, map[string]tierAnswer{"gpu": {2, 2, 2}, "cpu": {4, 0, 3.2}}},
		{"removal from one tier keeps the other", []*llmgwv1.KVBlocks{
			tiered("a", true, []uint64{1, 2}, []uint64{1, 2}, nil),
			{ReplicaId: "a", Uid: 1, Incarnation: 1, Removed: []uint64{2}, RemovedCpu: []uint64{1}}},
			[]uint64{1, 2}, map[string]tierAnswer{"a": {2, 1, 1.8}}},
		{"a reset resets every tier", []*llmgwv1.KVBlocks{
			tiered("a", true, nil, []uint64{1, 2}, []uint64{1}), tiered("a", true, []uint64{1}, nil, nil)},
			[]uint64{1, 2}, map[string]tierAnswer{"a": {1, 1, 1}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x := newIndex(t, 1000)
			for _, u := range tc.updates {
				if err := x.Apply("n1", u); err != nil {
					t.Fatal(err)
				}
			}
			checkInvariants(t, x)
			got := map[string]tierAnswer{}
			for _, m := range x.LookupTiers(tc.prompt, w, false, nil) {
				got[m.ID] = tierAnswer{m.Blocks, m.GPU, m.Credit}
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for id, g := range got {
				wt := tc.want[id]
				if g.blocks != wt.blocks || g.gpu != wt.gpu || math.Abs(g.credit-wt.credit) > 1e-9 {
					t.Errorf("%s: got %+v, want %+v", id, g, wt)
				}
			}
			// The GPU part is Lookup's answer exactly.
			for _, m := range x.Lookup(tc.prompt, nil) {
				if got[m.ID].gpu != m.Blocks {
					t.Errorf("%s: LookupTiers GPU %d, Lookup %d", m.ID, got[m.ID].gpu, m.Blocks)
				}
			}
		})
	}
}

func TestTierEntriesAndBounds(t *testing.T) {
	x := newIndex(t, 4)
	// 2 GPU + 3 offloaded (one in both offload tiers counts once) = 5 > 4.
	if err := x.Apply("n1", tiered("a", true, []uint64{1, 2}, []uint64{3, 4}, []uint64{3, 5})); err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, x)
	if sz := x.Size(); sz.Entries != 4 || sz.Dropped != 1 {
		t.Fatalf("size %+v: want 4 entries, 1 dropped", sz)
	}
	cpu, _ := x.TierBlocks("a", TierCPU)
	st, _ := x.Status("a")
	if !slices.Equal(cpu, []uint64{3, 4}) || st.Offloaded != 2 || st.Blocks != 2 {
		t.Fatalf("cpu %v, status %+v", cpu, st)
	}
	x.Retain(func(Replica) bool { return false })
	checkInvariants(t, x)
	if sz := x.Size(); sz.Entries != 0 || len(x.offHolders) != 0 {
		t.Fatalf("after dropping the replica: %+v, %d offload holders", sz, len(x.offHolders))
	}
}

func TestWeightsValidate(t *testing.T) {
	for _, tc := range []struct {
		w    Weights
		want string
	}{
		{DefaultWeights(), ""},
		{Weights{CPU: 1.2}, "kv_credit_cpu: must be between 0 and 1, got 1.2"},
		{Weights{CPU: math.NaN()}, "kv_credit_cpu: must be between 0 and 1, got NaN"},
		{Weights{CPU: 0.5, Storage: -1}, "kv_credit_storage: must be between 0 and 1, got -1"},
		{Weights{CPU: 0.5, Storage: 0.6}, "kv_credit_storage: must not exceed kv_credit_cpu (0.5), got 0.6"},
	} {
		err := tc.w.Validate()
		if (err == nil) != (tc.want == "") || (err != nil && err.Error() != tc.want) {
			t.Errorf("%+v: got %v, want %q", tc.w, err, tc.want)
		}
	}
}
