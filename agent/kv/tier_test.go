package kv

import (
	"slices"
	"testing"

	"github.com/llmgw/llmgw/internal/testkit"
	"github.com/llmgw/llmgw/vllm"
)

// offStoredEv is what vLLM's OffloadingConnector publishes for blocks hs
// offloaded to medium: the GPU blocks' hashes, no tokens, no parent.
func offStoredEv(medium string, hs ...uint64) *vllm.BlockStored {
	e := &vllm.BlockStored{BlockSize: testBS, Medium: vllm.Ptr(medium)}
	for _, h := range hs {
		e.BlockHashes = append(e.BlockHashes, vllm.IntBlockHash(h))
	}
	return e
}

func offRemovedEv(medium string, hs ...uint64) *vllm.BlockRemoved {
	e := &vllm.BlockRemoved{Medium: vllm.Ptr(medium)}
	for _, h := range hs {
		e.BlockHashes = append(e.BlockHashes, vllm.IntBlockHash(h))
	}
	return e
}

func TestMirrorTiers(t *testing.T) {
	root := vllm.NoneHash("0")
	a := chain(t, root, toks(1, 12)) // a0 a1 a2
	// An engine hashing another way: its hashes 7, 8, 9 stand for a0..a2.
	foreign := &vllm.BlockStored{BlockHashes: []vllm.ExternalBlockHash{vllm.IntBlockHash(7), vllm.IntBlockHash(8), vllm.IntBlockHash(9)},
		TokenIDs: toks(1, 12), BlockSize: testBS}
	cpu, disk := vllm.MediumCPU, vllm.MediumStorage
	tests := []struct {
		name               string
		events             []vllm.Event
		gpu, cpu, storage  []uint64
		untrusted, overCap bool
	}{
		{"offloaded while on the gpu: both tiers", []vllm.Event{storedEv(nil, a, toks(1, 12)), offStoredEv(cpu, u64s(a[0], a[1])...)},
			u64s(a...), u64s(a[0], a[1]), nil, false, false},
		{"evicted from the gpu, kept on cpu", []vllm.Event{storedEv(nil, a, toks(1, 12)), offStoredEv(cpu, u64s(a...)...),
			removedEv(u64s(a...)...)}, nil, u64s(a...), nil, false, false},
		{"foreign hashes: the cpu tier keeps the mapping learned on the gpu", []vllm.Event{foreign, offStoredEv(cpu, 7, 8),
			removedEv(7, 8, 9)}, nil, u64s(a[0], a[1]), nil, false, false},
		{"mapping kept while a tier holds it, then dropped", []vllm.Event{foreign, offStoredEv(cpu, 7), removedEv(7),
			offRemovedEv(cpu, 7), offStoredEv(cpu, 7)}, u64s(a[1], a[2]), []uint64{7}, nil, false, false},
		{"offloaded first, derived later: moved to the canonical hash", []vllm.Event{offStoredEv(cpu, 7),
			foreign}, u64s(a...), u64s(a[0]), nil, false, false},
		{"cpu removal leaves the gpu copy", []vllm.Event{storedEv(nil, a[:1], toks(1, 4)), offStoredEv(cpu, a[0].Uint64()),
			offRemovedEv(cpu, a[0].Uint64())}, u64s(a[0]), nil, nil, false, false},
		{"cpu stores are a set", []vllm.Event{offStoredEv(cpu, a[0].Uint64()), offStoredEv(cpu, a[0].Uint64()),
			offRemovedEv(cpu, a[0].Uint64())}, nil, nil, nil, false, false},
		{"storage tier, DISK too", []vllm.Event{offStoredEv(disk, a[0].Uint64()), offStoredEv("DISK", a[1].Uint64()),
			offStoredEv(cpu, a[0].Uint64())}, nil, u64s(a[0]), u64s(a[0], a[1]), false, false},
		{"unknown medium ignored", []vllm.Event{offStoredEv("TAPE", a[0].Uint64())}, nil, nil, nil, false, false},
		{"offload blocks of a block size not a multiple skipped", []vllm.Event{func() vllm.Event {
			e := offStoredEv(cpu, a[0].Uint64())
			e.BlockSize = testBS + 1
			return e
		}()}, nil, nil, nil, false, false},
		{"cleared clears every tier", []vllm.Event{storedEv(nil, a, toks(1, 12)), offStoredEv(cpu, u64s(a...)...),
			&vllm.AllBlocksCleared{}}, nil, nil, nil, false, false},
		{"offload cap", []vllm.Event{offStoredEv(cpu, 1, 2), offStoredEv(disk, 3), offStoredEv(cpu, 4)},
			nil, []uint64{1, 2}, []uint64{3}, false, true},
		{"gpu cap counts the gpu only", []vllm.Event{offStoredEv(cpu, 1, 2, 3), storedEv(nil, a, toks(1, 12))},
			u64s(a...), []uint64{1, 2, 3}, nil, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newMirror("r", 1, testBS, "0", 3, 3, 16)
			m.newEngine(1)
			st := m.applyBatch(vllm.EventBatch{Events: tc.events})
			if st.overCap != tc.overCap {
				t.Errorf("overCap = %v, want %v", st.overCap, tc.overCap)
			}
			for _, c := range []struct {
				tier      string
				got, want []uint64
			}{{"gpu", m.blocks(), tc.gpu}, {"cpu", m.offBlocks(offCPU), tc.cpu}, {"storage", m.offBlocks(offStorage), tc.storage}} {
				if !slices.Equal(c.got, c.want) && (len(c.got) > 0 || len(c.want) > 0) {
					t.Errorf("%s = %v, want %v", c.tier, c.got, c.want)
				}
			}
			checkInvariants(t, m)
		})
	}
}

// TestMirrorTierReports: a reset carries every tier's whole set, a delta
// each tier's net change, and a change undone between reports is none.
func TestMirrorTierReports(t *testing.T) {
	root := vllm.NoneHash("0")
	a := chain(t, root, toks(1, 12))
	m := newMirror("r", 1, testBS, "0", DefaultMaxBlocks, DefaultMaxOffloadBlocks, 16)
	m.newEngine(1)
	m.applyBatch(vllm.EventBatch{Events: []vllm.Event{storedEv(nil, a, toks(1, 12)), offStoredEv(vllm.MediumCPU, a[0].Uint64())}})
	r := m.report(false)
	if !r.Reset_ || !slices.Equal(r.Stored, u64s(a...)) || !slices.Equal(r.StoredCpu, u64s(a[0])) || len(r.StoredStorage) != 0 {
		t.Fatalf("first report %v: want a reset with every tier", r)
	}
	m.applyBatch(vllm.EventBatch{Events: []vllm.Event{
		offStoredEv(vllm.MediumCPU, a[1].Uint64()), removedEv(a[1].Uint64()),
		offStoredEv(vllm.MediumStorage, a[2].Uint64()), offRemovedEv(vllm.MediumStorage, a[2].Uint64()),
		offRemovedEv(vllm.MediumCPU, a[0].Uint64()),
	}})
	r = m.report(false)
	if r.Reset_ || len(r.Stored) != 0 || !slices.Equal(r.Removed, u64s(a[1])) || !slices.Equal(r.StoredCpu, u64s(a[1])) ||
		!slices.Equal(r.RemovedCpu, u64s(a[0])) || len(r.StoredStorage)+len(r.RemovedStorage) != 0 {
		t.Fatalf("delta %v", r)
	}
	if r := m.report(false); r != nil {
		t.Fatalf("no change, yet %v", r)
	}
	if r := m.report(true); !r.Reset_ || !slices.Equal(r.Stored, u64s(a[0], a[2])) || !slices.Equal(r.StoredCpu, u64s(a[1])) {
		t.Fatalf("full copy %v", r)
	}
}

// convergedTiers waits until the mirror holds the engine's set in every
// tier (trusted).
func (h *harness) convergedTiers(t *testing.T) {
	t.Helper()
	h.converged(t)
	for _, tc := range []struct {
		medium string
		tier   int
	}{{vllm.MediumCPU, offCPU}, {vllm.MediumStorage, offStorage}} {
		want := h.eng.offTruth(tc.medium)
		testkit.Wait(t, "the mirror's "+tc.medium+" tier to match the engine's", func() bool {
			m := h.l.mirror
			m.mu.Lock()
			defer m.mu.Unlock()
			got := m.offBlocks(tc.tier)
			return !m.untrusted && slices.Equal(got, want)
		})
	}
}

// TestListenerTiersExact extends the exactness checks to the offload
// tiers, with a fake engine that offloads as vLLM's OffloadingConnector
// does (the GPU blocks' hashes, no tokens, no parent): the mirror equals
// the engine's cache per tier after lost batches repaired by replay, an
// engine's restart (kill -9: a new incarnation, an empty cache), and an
// agent's restart (a new listener catching up by replay).
func TestListenerTiersExact(t *testing.T) {
	h := start(t, setup{})
	cpu, storage := vllm.MediumCPU, vllm.MediumStorage
	var prompts [][]vllm.BlockHash
	for i := range 6 {
		hs, ev := h.eng.stored(nil, toks(100*i, 12))
		prompts = append(prompts, hs)
		h.eng.publish(i == 2, ev) // one lost, repaired by replay
	}
	// Offload three prompts to CPU, one to storage; evict two from the
	// GPU (one lost on the way); drop one from the CPU tier.
	h.eng.publish(false, offStoredEv(cpu, u64s(prompts[0]...)...), offStoredEv(cpu, u64s(prompts[1]...)...))
	h.eng.publish(true, offStoredEv(cpu, u64s(prompts[2]...)...), offStoredEv(storage, u64s(prompts[3]...)...))
	h.eng.publish(false, removedEv(u64s(prompts[0]...)...))
	h.eng.publish(true, removedEv(u64s(prompts[1]...)...), offRemovedEv(cpu, prompts[2][2].Uint64()))
	_, ev := h.eng.stored(nil, toks(900, 4))
	h.eng.publish(false, ev)
	h.convergedTiers(t)
	if got := h.eng.offTruth(cpu); len(got) != 8 {
		t.Fatalf("the fake engine holds %d CPU blocks, want 8: the test is wrong", len(got))
	}
	if _, off, _ := h.hub.totals(); off[offCPU] != 8 || off[offStorage] != 3 {
		t.Fatalf("gauges read %v offloaded blocks, want 8 CPU and 3 storage", off)
	}

	// The agent's restart: a new listener, whose mirror starts empty,
	// catches up by replaying the engine's buffer.
	h.catchUp(t)
	h.convergedTiers(t)

	// The engine's kill -9: a new incarnation with an empty cache in every
	// tier, then new blocks offloaded.
	h.l.Engine(2)
	h.eng.restartEngine()
	hs, ev := h.eng.stored(nil, toks(5000, 8))
	h.eng.publish(false, ev, offStoredEv(cpu, u64s(hs...)...), removedEv(hs[1].Uint64()))
	h.convergedTiers(t)
	ch := h.hub.Changes()
	if len(ch) != 1 || !ch[0].Reset_ || ch[0].Incarnation != 2 || !slices.Equal(ch[0].StoredCpu, u64s(hs...)) ||
		!slices.Equal(ch[0].Stored, u64s(hs[0])) {
		t.Fatalf("changes after the restart: %v", ch)
	}
}

// TestMirrorOffloadSpan: an offloaded block k times the GPU's is named by
// its last GPU block's hash (vLLM's block_size_factor) and stands for it
// and its k-1 ancestors, stored and removed together; the mapping of each
// stays while the offload tier holds it.
func TestMirrorOffloadSpan(t *testing.T) {
	root := vllm.NoneHash("0")
	a := chain(t, root, toks(1, 16)) // a0..a3
	// The engine's own hashes 7..10 stand for a0..a3 (foreign hashing).
	foreign := &vllm.BlockStored{BlockHashes: []vllm.ExternalBlockHash{vllm.IntBlockHash(7), vllm.IntBlockHash(8)},
		TokenIDs: toks(1, 8), BlockSize: testBS}
	foreign2 := &vllm.BlockStored{BlockHashes: []vllm.ExternalBlockHash{vllm.IntBlockHash(9), vllm.IntBlockHash(10)},
		ParentBlockHash: vllm.Ptr(vllm.IntBlockHash(8)), TokenIDs: toks(9, 8), BlockSize: testBS}
	span2 := func(hs ...uint64) *vllm.BlockStored {
		e := offStoredEv(vllm.MediumCPU, hs...)
		e.BlockSize = 2 * testBS
		return e
	}
	tests := []struct {
		name     string
		events   []vllm.Event
		gpu, cpu []uint64
	}{
		{"two groups of two, then evicted from the GPU", []vllm.Event{foreign, foreign2, span2(8, 10), removedEv(7, 8, 9, 10)},
			nil, u64s(a...)},
		{"a group removed by its last hash", []vllm.Event{foreign, foreign2, span2(8, 10), removedEv(7, 8, 9, 10),
			offRemovedEv(vllm.MediumCPU, 10)}, nil, u64s(a[0], a[1])},
		{"an ancestor never seen ends the group", []vllm.Event{foreign2, span2(9)}, []uint64{9, 10}, []uint64{9}},
		{"a group within a prompt whose start was never seen", []vllm.Event{foreign2, span2(10)}, []uint64{9, 10}, []uint64{9, 10}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newMirror("r", 1, testBS, "0", DefaultMaxBlocks, DefaultMaxOffloadBlocks, 16)
			m.newEngine(1)
			m.applyBatch(vllm.EventBatch{Events: tc.events})
			if got := m.blocks(); !slices.Equal(got, tc.gpu) && (len(got) > 0 || len(tc.gpu) > 0) {
				t.Errorf("gpu = %v, want %v", got, tc.gpu)
			}
			if got := m.offBlocks(offCPU); !slices.Equal(got, tc.cpu) && (len(got) > 0 || len(tc.cpu) > 0) {
				t.Errorf("cpu = %v, want %v", got, tc.cpu)
			}
			checkInvariants(t, m)
		})
	}
}
