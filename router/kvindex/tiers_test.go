package kvindex

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/llmgw/llmgw/chunking"
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
	if sz := x.Size(); sz.Entries != 0 || sz.Blocks != 0 || x.offEntries != 0 {
		t.Fatalf("after dropping the replica: %+v, %d offload entries", sz, x.offEntries)
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

// TestTiersExactThroughChunks: a replica's tiers, changed at random and
// reported as the agent's mirror reports them (deltas, then a full copy
// for a router that starts anew), travel in chunks of a small budget and
// leave the index equal to the engine's sets in every tier.
func TestTiersExactThroughChunks(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const budget = chunking.MinChunkBytes
	truth := [3]map[uint64]bool{{}, {}, {}} // gpu, cpu, storage
	apply := func(x *Index, u *llmgwv1.EphemeralUpdate) {
		t.Helper()
		a := chunking.NewAssembler(0)
		var whole *llmgwv1.EphemeralUpdate
		for _, c := range chunking.Split(u, budget) {
			out, err := a.Add(c)
			if err != nil {
				t.Fatal(err)
			}
			whole = out
		}
		if whole == nil {
			t.Fatal("no update assembled")
		}
		for _, err := range x.ApplyNode(whole.Node, whole.Full, whole.Kv, nil) {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	check := func(x *Index, when string) {
		t.Helper()
		checkInvariants(t, x)
		for i, tier := range []Tier{TierGPU, TierCPU, TierStorage} {
			want := []uint64{}
			for h := range truth[i] {
				want = append(want, h)
			}
			slices.Sort(want)
			got, _ := x.TierBlocks("a", tier)
			if !slices.Equal(got, want) && (len(got) > 0 || len(want) > 0) {
				t.Fatalf("%s: tier %d holds %d blocks, the engine %d", when, tier, len(got), len(want))
			}
		}
	}
	sorted := func(m map[uint64]bool) []uint64 {
		out := make([]uint64, 0, len(m))
		for h := range m {
			out = append(out, h)
		}
		slices.Sort(out)
		return out
	}
	full := func(seq uint64) *llmgwv1.EphemeralUpdate {
		return &llmgwv1.EphemeralUpdate{Node: "n1", Epoch: 1, Seq: seq, Full: true, Kv: []*llmgwv1.KVBlocks{{ReplicaId: "a", Uid: 1,
			Incarnation: 1, Reset_: true, Stored: sorted(truth[0]), StoredCpu: sorted(truth[1]), StoredStorage: sorted(truth[2])}}}
	}
	x := newIndex(t, 1<<20)
	apply(x, full(1))
	for seq := uint64(2); seq < 40; seq++ {
		// A step: blocks stored, evicted to CPU, offloaded on to storage,
		// dropped; the delta is each tier's net change.
		d := &llmgwv1.KVBlocks{ReplicaId: "a", Uid: 1, Incarnation: 1}
		lists := [3][2]*[]uint64{{&d.Stored, &d.Removed}, {&d.StoredCpu, &d.RemovedCpu}, {&d.StoredStorage, &d.RemovedStorage}}
		for tier := range 3 {
			for range rng.IntN(400) {
				h := rng.Uint64N(3000)
				if truth[tier][h] {
					delete(truth[tier], h)
					*lists[tier][1] = append(*lists[tier][1], h)
				} else {
					truth[tier][h] = true
					*lists[tier][0] = append(*lists[tier][0], h)
				}
			}
			// Net changes: a hash toggled twice in a step is reported once
			// by its final state, as the mirror's pending map does.
			*lists[tier][0] = netOf(*lists[tier][0], truth[tier], true)
			*lists[tier][1] = netOf(*lists[tier][1], truth[tier], false)
		}
		apply(x, &llmgwv1.EphemeralUpdate{Node: "n1", Epoch: 1, Seq: seq, Kv: []*llmgwv1.KVBlocks{d}})
		check(x, fmt.Sprintf("delta %d", seq))
	}
	// A router started anew: its index comes from the full copy alone.
	fresh := newIndex(t, 1<<20)
	apply(fresh, full(41))
	check(fresh, "a new router's full copy")
}

// netOf keeps the hashes of hs whose final state is held (or not held),
// once each.
func netOf(hs []uint64, held map[uint64]bool, want bool) []uint64 {
	seen := map[uint64]bool{}
	out := hs[:0]
	for _, h := range hs {
		if held[h] == want && !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	return out
}

// TestLookupTiersPending: with pending, this router's speculative entries
// count as GPU blocks, as LookupPending counts them, and an offloaded
// block after them carries the match on at its tier's credit.
func TestLookupTiersPending(t *testing.T) {
	x := specIndex(t, newClock(), Config{})
	if err := x.Apply("n1", tiered("a", true, []uint64{1}, []uint64{3}, nil)); err != nil {
		t.Fatal(err)
	}
	if n := x.Speculate(rep("a", 1), []uint64{1, 2}); n != 1 {
		t.Fatalf("speculated %d, want 1", n)
	}
	w := Weights{CPU: 0.5}
	for _, tc := range []struct {
		pending bool
		want    TierMatch
	}{
		{false, TierMatch{Replica: rep("a", 1), Blocks: 1, GPU: 1, Credit: 1}},
		{true, TierMatch{Replica: rep("a", 1), Blocks: 3, GPU: 2, Credit: 2.5, Pending: 1}},
	} {
		got := x.LookupTiers([]uint64{1, 2, 3, 4}, w, tc.pending, nil)
		if len(got) != 1 || got[0] != tc.want {
			t.Errorf("pending %v: got %+v, want %+v", tc.pending, got, tc.want)
		}
		if tc.pending {
			if pm := pendingAnswer(x, []uint64{1, 2, 3, 4}); pm["a"] != "2/1" {
				t.Errorf("LookupPending says %v, LookupTiers' GPU part %d", pm, got[0].GPU)
			}
		}
	}
}

// BenchmarkLookupTiers is BenchmarkLookup's fleet answered by LookupTiers:
// without offload (what a fleet pays for tier-aware credit it does not
// use), and with each replica also holding, in CPU, the leading blocks of
// as many other prompts as it holds on the GPU.
func BenchmarkLookupTiers(b *testing.B) {
	for _, offload := range []bool{false, true} {
		b.Run(map[bool]string{false: "gpu-only", true: "cpu-offload"}[offload], func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 2))
			x, ps := fleet(b, 1000, 2000, 256, rng)
			if offload {
				sets := make([][]uint64, 1000)
				for _, p := range ps {
					for range 1 + rng.IntN(8) {
						r := rng.IntN(1000)
						sets[r] = append(sets[r], p[:1+rng.IntN(len(p))]...)
					}
				}
				for r, s := range sets {
					_ = x.Apply("n", &llmgwv1.KVBlocks{ReplicaId: "r" + itoa(r), Uid: 1, StoredCpu: s})
				}
			}
			w := DefaultWeights()
			dst := make([]TierMatch, 0, 16)
			benchLookups(b, ps, func(p []uint64, _ []Match) []Match {
				dst = x.LookupTiers(p, w, false, dst[:0])
				return nil
			})
		})
	}
}

// tierModel is what the index should hold: each replica's blocks by tier.
type tierModel map[string]*[3]map[uint64]bool // gpu, cpu, storage

// lookup is LookupTiers by the definition: for each replica holding the
// first hash in some tier, the leading run held in any tier, its credit
// summed block by block in prompt order (as the index sums it, so the
// floats are equal), and the leading run on the GPU.
// pending, if not nil, holds each replica's pending hashes, which count as
// GPU blocks where the GPU holds none.
func (m tierModel) lookup(hashes []uint64, w Weights, pending map[string]map[uint64]bool) map[string]TierMatch {
	out := map[string]TierMatch{}
	for id, ts := range m {
		var tm TierMatch
		gpuRun := true
		for _, h := range hashes {
			t, pend := TierNone, false
			switch {
			case ts[0][h]:
				t = TierGPU
			case pending[id][h]:
				t, pend = TierGPU, true
			case ts[1][h]:
				t = TierCPU
			case ts[2][h]:
				t = TierStorage
			}
			if t == TierNone {
				break
			}
			tm.Blocks++
			tm.Credit += w.Of(t)
			if gpuRun = gpuRun && t == TierGPU; gpuRun {
				tm.GPU++
				if pend {
					tm.Pending++
				}
			}
		}
		if tm.Blocks > 0 {
			out[id] = tm
		}
	}
	return out
}

// FuzzTiers applies random tier changes to replicas sharing a few blocks —
// stores and removals in each tier, resets, replicas dropped — so blocks
// go GPU-only, offload-only, in several tiers at once, rise and fall
// between tiers and spill past inlineHolders and back, then checks the
// holder table against the replicas' sets (checkInvariants) and
// LookupTiers and Lookup against the model; then, with speculative entries
// recorded for two blocks on every replica, LookupTiers with pending.
func FuzzTiers(f *testing.F) {
	// ops are 3 bytes each: kind, replica, hash.
	f.Add([]byte{2, 0, 1, 0, 0, 1, 1, 0, 1}) // cpu only, then gpu, then gpu gone: cpu again
	f.Add([]byte{0, 0, 0, 2, 0, 1, 4, 0, 1, 3, 0, 1, 5, 0, 1})
	var spill []byte
	for r := range 10 { // ten holders of block 0, in mixed tiers, then half go
		spill = append(spill, byte(r%3)*2, byte(r), 0)
	}
	for r := range 5 {
		spill = append(spill, byte(r%3)*2+1, byte(r), 0)
	}
	f.Add(spill)
	f.Add([]byte{2, 1, 0, 4, 1, 1, 6, 1, 0, 2, 2, 0, 7, 2, 0, 0, 1, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		const replicas, hashes = 10, 6
		x := specIndex(t, newClock(), Config{})
		model := tierModel{}
		for len(ops) >= 3 {
			kind, id, h := ops[0]%8, "r"+itoa(int(ops[1]%replicas)), uint64(ops[2]%hashes)
			ops = ops[3:]
			ts := model[id]
			if ts == nil {
				if kind == 7 {
					continue
				}
				if err := x.Apply("n1", tiered(id, true, nil, nil, nil)); err != nil {
					t.Fatal(err)
				}
				ts = &[3]map[uint64]bool{{}, {}, {}}
				model[id] = ts
			}
			u := &llmgwv1.KVBlocks{ReplicaId: id, Uid: 1, Incarnation: 1}
			one := []uint64{h}
			switch kind {
			case 0:
				u.Stored, ts[0][h] = one, true
			case 1:
				u.Removed = one
				delete(ts[0], h)
			case 2:
				u.StoredCpu, ts[1][h] = one, true
			case 3:
				u.RemovedCpu = one
				delete(ts[1], h)
			case 4:
				u.StoredStorage, ts[2][h] = one, true
			case 5:
				u.RemovedStorage = one
				delete(ts[2], h)
			case 6:
				u.Reset_ = true
				*ts = [3]map[uint64]bool{{}, {}, {}}
			case 7:
				x.Retain(func(r Replica) bool { return r.ID != id })
				delete(model, id)
				checkInvariants(t, x)
				continue
			}
			if err := x.Apply("n1", u); err != nil {
				t.Fatal(err)
			}
			checkInvariants(t, x)
		}
		w := Weights{CPU: 0.7, Storage: 0.3}
		prompts := [][]uint64{{0, 1, 2, 3, 4, 5}, {1, 0, 2}, {5, 4, 3, 2, 1, 0}, {3}}
		for _, prompt := range prompts {
			want := model.lookup(prompt, w, nil)
			got := x.LookupTiers(prompt, w, false, nil)
			if len(got) != len(want) {
				t.Fatalf("prompt %v: %d matches, model %d: %+v", prompt, len(got), len(want), got)
			}
			for _, m := range got {
				wt := want[m.ID]
				if m.Blocks != wt.Blocks || m.GPU != wt.GPU || m.Credit != wt.Credit || m.Pending != 0 {
					t.Fatalf("prompt %v, %s: got %+v, model %+v", prompt, m.ID, m, wt)
				}
			}
			gpu := 0
			for _, m := range x.Lookup(prompt, nil) {
				if m.Blocks != want[m.ID].GPU {
					t.Fatalf("prompt %v, %s: Lookup %d, model's GPU run %d", prompt, m.ID, m.Blocks, want[m.ID].GPU)
				}
				gpu++
			}
			for _, wt := range want {
				if wt.GPU > 0 {
					gpu--
				}
			}
			if gpu != 0 {
				t.Fatalf("prompt %v: Lookup lists %+d replicas against the model's", prompt, gpu)
			}
		}
		pending := map[string]map[uint64]bool{}
		for id, ts := range model {
			pending[id] = map[uint64]bool{}
			for _, h := range []uint64{0, 3} { // Speculate skips blocks on the GPU
				if !ts[0][h] {
					pending[id][h] = true
				}
			}
			x.Speculate(Replica{ID: id, UID: 1, Incarnation: 1}, []uint64{0, 3})
		}
		for _, prompt := range prompts {
			want := model.lookup(prompt, w, pending)
			got := x.LookupTiers(prompt, w, true, nil)
			if len(got) != len(want) {
				t.Fatalf("pending, prompt %v: %d matches, model %d: %+v", prompt, len(got), len(want), got)
			}
			for _, m := range got {
				wt := want[m.ID]
				if m.Blocks != wt.Blocks || m.GPU != wt.GPU || m.Credit != wt.Credit || m.Pending != wt.Pending {
					t.Fatalf("pending, prompt %v, %s: got %+v, model %+v", prompt, m.ID, m, wt)
				}
			}
		}
	})
}
