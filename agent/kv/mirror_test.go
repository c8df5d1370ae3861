package kv

import (
	"slices"
	"testing"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/vllm"
)

const testBS = 4

// chain hashes tokens as vLLM does with seed "0", block size testBS.
func chain(t testing.TB, parent vllm.BlockHash, tokens []int) []vllm.BlockHash {
	t.Helper()
	hs, err := vllm.BlockHashes(parent, tokens, testBS, nil)
	if err != nil {
		t.Fatal(err)
	}
	return hs
}

func toks(from, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = from + i
	}
	return out
}

// storedEv is the event an engine with int hashes sends for blocks hs,
// holding tokens, chained from parent (nil: the prompt's start).
func storedEv(parent *vllm.BlockHash, hs []vllm.BlockHash, tokens []int) *vllm.BlockStored {
	e := &vllm.BlockStored{TokenIDs: tokens, BlockSize: testBS, Medium: vllm.Ptr(vllm.MediumGPU),
		GroupIdx: vllm.Ptr(0), KVCacheSpecKind: vllm.Ptr(vllm.KVCacheSpecFullAttention)}
	if parent != nil {
		e.ParentBlockHash = vllm.Ptr(vllm.ExternalHash(*parent, true))
	}
	for _, h := range hs {
		e.BlockHashes = append(e.BlockHashes, vllm.ExternalHash(h, true))
	}
	return e
}

func removedEv(hs ...uint64) *vllm.BlockRemoved {
	e := &vllm.BlockRemoved{Medium: vllm.Ptr(vllm.MediumGPU), GroupIdx: vllm.Ptr(0)}
	for _, h := range hs {
		e.BlockHashes = append(e.BlockHashes, vllm.IntBlockHash(h))
	}
	return e
}

func u64s(hs ...vllm.BlockHash) []uint64 {
	out := make([]uint64, len(hs))
	for i, h := range hs {
		out[i] = h.Uint64()
	}
	slices.Sort(out)
	return out
}

func TestMirror(t *testing.T) {
	root := vllm.NoneHash("0")
	a := chain(t, root, toks(1, 12))       // a0 a1 a2
	b := chain(t, a[0], toks(100, 8))      // b0 b1 after a0
	orphan := chain(t, root, toks(500, 4)) // parent never seen below
	type want struct {
		blocks     []uint64
		mismatches int
	}
	tests := []struct {
		name   string
		events []vllm.Event
		want   want
	}{
		{"chain and a branch", []vllm.Event{storedEv(nil, a, toks(1, 12)), storedEv(&a[0], b, toks(100, 8))},
			want{blocks: u64s(a[0], a[1], a[2], b[0], b[1])}},
		{"copies: gone only at zero", []vllm.Event{
			storedEv(nil, a[:1], toks(1, 4)), storedEv(nil, a[:1], toks(1, 4)), removedEv(a[0].Uint64())},
			want{blocks: u64s(a[0])}},
		{"copies: both removed", []vllm.Event{
			storedEv(nil, a[:1], toks(1, 4)), storedEv(nil, a[:1], toks(1, 4)),
			removedEv(a[0].Uint64()), removedEv(a[0].Uint64())},
			want{blocks: u64s()}},
		{"unknown removal ignored", []vllm.Event{storedEv(nil, a[:1], toks(1, 4)), removedEv(42)},
			want{blocks: u64s(a[0])}},
		{"cpu medium not on the gpu", []vllm.Event{func() vllm.Event {
			e := storedEv(nil, a[:1], toks(1, 4))
			e.Medium = vllm.Ptr(vllm.MediumCPU)
			return e
		}()}, want{blocks: u64s()}},
		{"sliding window ignored, its removals too", []vllm.Event{
			storedEv(nil, a[:1], toks(1, 4)),
			func() vllm.Event {
				e := storedEv(nil, a[:1], toks(1, 4))
				e.GroupIdx, e.KVCacheSpecKind = vllm.Ptr(1), vllm.Ptr("sliding_window")
				return e
			}(),
			&vllm.BlockRemoved{BlockHashes: []vllm.ExternalBlockHash{vllm.IntBlockHash(a[0].Uint64())}, GroupIdx: vllm.Ptr(1)},
		}, want{blocks: u64s(a[0])}},
		{"parent never seen: taken as reported", []vllm.Event{storedEv(&root, orphan, toks(999, 4))},
			want{blocks: u64s(orphan[0])}},
		{"cleared", []vllm.Event{storedEv(nil, a, toks(1, 12)), &vllm.AllBlocksCleared{}, storedEv(nil, a[:1], toks(1, 4))},
			want{blocks: u64s(a[0])}},
		{"mismatching engine hashes mapped to canonical", []vllm.Event{
			&vllm.BlockStored{BlockHashes: []vllm.ExternalBlockHash{vllm.IntBlockHash(7), vllm.IntBlockHash(8), vllm.IntBlockHash(9)},
				TokenIDs: toks(1, 12), BlockSize: testBS},
			// A child chained from the engine's own hash still derives.
			&vllm.BlockStored{BlockHashes: []vllm.ExternalBlockHash{vllm.IntBlockHash(10), vllm.IntBlockHash(11)},
				ParentBlockHash: vllm.Ptr(vllm.IntBlockHash(7)), TokenIDs: toks(100, 8), BlockSize: testBS},
			removedEv(9),
		}, want{blocks: u64s(a[0], a[1], b[0], b[1]), mismatches: 5}},
		{"bytes hashes", []vllm.Event{func() vllm.Event {
			e := storedEv(nil, a[:2], toks(1, 8))
			e.BlockHashes = []vllm.ExternalBlockHash{vllm.ExternalHash(a[0], false), vllm.ExternalHash(a[1], false)}
			return e
		}(), &vllm.BlockRemoved{BlockHashes: []vllm.ExternalBlockHash{vllm.ExternalHash(a[1], false)}}},
			want{blocks: u64s(a[0])}},
		{"lora name from an engine without extra_keys", []vllm.Event{func() vllm.Event {
			hs, _ := vllm.BlockHashes(root, toks(1, 4), testBS, vllm.RequestExtraKeys("sql", ""))
			e := storedEv(nil, hs, toks(1, 4))
			e.LoRAName = vllm.Ptr("sql")
			return e
		}()}, want{blocks: func() []uint64 {
			hs, _ := vllm.BlockHashes(root, toks(1, 4), testBS, vllm.RequestExtraKeys("sql", ""))
			return u64s(hs...)
		}()}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newMirror("r", 1, testBS, "0", DefaultMaxBlocks, DefaultMaxOffloadBlocks, 16)
			m.newEngine(1)
			st := m.applyBatch(vllm.EventBatch{Events: tc.events})
			if got := m.blocks(); !slices.Equal(got, tc.want.blocks) {
				t.Errorf("blocks = %v, want %v", got, tc.want.blocks)
			}
			if st.mismatches != tc.want.mismatches {
				t.Errorf("mismatches = %d, want %d", st.mismatches, tc.want.mismatches)
			}
			checkInvariants(t, m)
		})
	}
}

// checkInvariants: the reported set is exactly the canonical hashes of the
// engine hashes held, and every held hash has a copy.
func checkInvariants(t testing.TB, m *mirror) {
	t.Helper()
	want := map[uint64]int{}
	var off [numOff]map[uint64]int
	for i := range off {
		off[i] = map[uint64]int{}
	}
	gpu := 0
	for _, b := range m.byEngine {
		if b.copies < 0 || (b.copies == 0 && b.offloaded == 0) {
			t.Fatalf("held block with %d copies in no offload tier", b.copies)
		}
		if b.copies > 0 {
			want[b.canon]++
			gpu++
		}
		for i := range numOff {
			if b.offloaded&(1<<i) != 0 {
				off[i][b.canon]++
			}
		}
	}
	if gpu != m.gpuBlocks {
		t.Fatalf("gpuBlocks %d, engine map holds %d", m.gpuBlocks, gpu)
	}
	for i := range numOff {
		n := 0
		for h, c := range off[i] {
			n += c
			if m.off[i].held[h] != c {
				t.Fatalf("tier %d: canonical %d held %d times, engine map says %d", i, h, m.off[i].held[h], c)
			}
		}
		if len(off[i]) != len(m.off[i].held) || n != m.off[i].n {
			t.Fatalf("tier %d: held %d canonical hashes (%d engine), engine map implies %d (%d)", i, len(m.off[i].held), m.off[i].n, len(off[i]), n)
		}
	}
	if len(want) != len(m.held) {
		t.Fatalf("held %d canonical hashes, engine map implies %d", len(m.held), len(want))
	}
	for h, n := range want {
		if m.held[h] != n {
			t.Fatalf("canonical %d held %d times, engine map says %d", h, m.held[h], n)
		}
	}
}

func TestMirrorReports(t *testing.T) {
	root := vllm.NoneHash("0")
	a := chain(t, root, toks(1, 12))
	m := newMirror("r", 9, testBS, "0", DefaultMaxBlocks, DefaultMaxOffloadBlocks, 16)
	if r := m.report(false); r != nil {
		t.Fatalf("report before the engine started: %v", r)
	}
	m.newEngine(1)
	steps := []struct {
		name   string
		events []vllm.Event
		full   bool
		want   *llmgwv1.KVBlocks // nil: no report
	}{
		{"first report is a reset", nil, false, &llmgwv1.KVBlocks{Reset_: true, Stored: []uint64{}}},
		{"nothing changed", nil, false, nil},
		{"stored", []vllm.Event{storedEv(nil, a[:2], toks(1, 8))}, false, &llmgwv1.KVBlocks{Stored: u64s(a[0], a[1])}},
		{"stored then removed within a tick cancels", []vllm.Event{
			storedEv(&a[1], a[2:], toks(9, 4)), removedEv(a[2].Uint64())}, false, nil},
		{"removed then stored again cancels", []vllm.Event{
			removedEv(a[1].Uint64()), storedEv(&a[0], a[1:2], toks(5, 4))}, false, nil},
		{"removed", []vllm.Event{removedEv(a[1].Uint64())}, false, &llmgwv1.KVBlocks{Removed: u64s(a[1])}},
		{"full copy", []vllm.Event{storedEv(&a[0], a[1:2], toks(5, 4))}, true,
			&llmgwv1.KVBlocks{Reset_: true, Stored: u64s(a[0], a[1])}},
		{"cleared is a reset", []vllm.Event{storedEv(&a[1], a[2:], toks(9, 4)), &vllm.AllBlocksCleared{}}, false,
			&llmgwv1.KVBlocks{Reset_: true, Stored: []uint64{}}},
	}
	for _, s := range steps {
		m.applyBatch(vllm.EventBatch{Events: s.events})
		got := m.report(s.full)
		if s.want == nil {
			if got != nil {
				t.Errorf("%s: got %v, want no report", s.name, got)
			}
			continue
		}
		if got == nil {
			t.Errorf("%s: no report", s.name)
			continue
		}
		if got.ReplicaId != "r" || got.Uid != 9 || got.Incarnation != 1 || got.BlockSize != testBS {
			t.Errorf("%s: identity %v", s.name, got)
		}
		if got.Reset_ != s.want.Reset_ || !slices.Equal(got.Stored, s.want.Stored) || !slices.Equal(got.Removed, s.want.Removed) {
			t.Errorf("%s: got reset=%v stored=%v removed=%v, want reset=%v stored=%v removed=%v", s.name,
				got.Reset_, got.Stored, got.Removed, s.want.Reset_, s.want.Stored, s.want.Removed)
		}
	}
	// A restart is a reset under the new incarnation.
	m.applyBatch(vllm.EventBatch{Events: []vllm.Event{storedEv(nil, a[:1], toks(1, 4))}})
	m.newEngine(2)
	if got := m.report(false); got == nil || !got.Reset_ || got.Incarnation != 2 || len(got.Stored) != 0 {
		t.Errorf("after restart: %v", got)
	}
}

func TestMirrorUntrusted(t *testing.T) {
	a := chain(t, vllm.NoneHash("0"), toks(1, 8))
	m := newMirror("r", 1, testBS, "0", DefaultMaxBlocks, DefaultMaxOffloadBlocks, 16)
	m.newEngine(1)
	m.applyBatch(vllm.EventBatch{Events: []vllm.Event{storedEv(nil, a, toks(1, 8))}})
	m.report(false)
	m.markUntrusted("test")
	if r := m.report(false); r == nil || !r.Reset_ || !r.Untrusted || len(r.Stored) != 0 {
		t.Fatalf("untrusted report: %v", r)
	}
	// Events are ignored while untrusted ...
	m.applyBatch(vllm.EventBatch{Events: []vllm.Event{storedEv(nil, a[:1], toks(1, 4))}})
	if len(m.blocks()) != 0 {
		t.Fatalf("untrusted mirror applied a store: %v", m.blocks())
	}
	// ... until the engine clears its cache; what follows is exact.
	st := m.applyBatch(vllm.EventBatch{Events: []vllm.Event{&vllm.AllBlocksCleared{}, storedEv(nil, a[:1], toks(1, 4))}})
	if !st.regainedTrust {
		t.Error("clear did not regain trust")
	}
	if r := m.report(false); r == nil || !r.Reset_ || r.Untrusted || !slices.Equal(r.Stored, u64s(a[0])) {
		t.Fatalf("trusted again: %v", r)
	}
}
