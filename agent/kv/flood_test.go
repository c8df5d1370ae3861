package kv

import (
	"encoding/binary"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/llmgw/llmgw/internal/testkit"
	"github.com/llmgw/llmgw/vllm"
)

// floodPayload is a batch of one BlockStored of n distinct int hashes from
// first on, without tokens (so the mirror takes them as the engine's), in
// vLLM's array form: written by hand, as msgpack's encoder would take
// longer than the listener to handle it.
func floodPayload(first uint64, n int) []byte {
	p := make([]byte, 0, 64+9*n)
	p = append(p, 0x92, 0xcb) // [ts, events]; ts a float64
	p = binary.BigEndian.AppendUint64(p, 0x41d954fc40200000)
	p = append(p, 0x91, 0x97, 0xab) // one event: its tag and 6 fields
	p = append(p, vllm.TagBlockStored...)
	p = append(p, 0xdd)
	p = binary.BigEndian.AppendUint32(p, uint32(n))
	for i := range n {
		p = append(p, 0xcf)
		p = binary.BigEndian.AppendUint64(p, first+uint64(i))
	}
	return append(p, 0xc0, 0x90, 0x10, 0xc0, 0xc0) // parent, token_ids, block_size, lora_id, medium
}

// heapPeak samples the heap in use until stop is called, which returns the
// highest sample.
func heapPeak() (stop func() uint64) {
	var (
		wg   sync.WaitGroup
		peak uint64
		done = make(chan struct{})
	)
	wg.Go(func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	})
	return func() uint64 { close(done); wg.Wait(); return peak }
}

func heapLive() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// floodBlocks and floodBatch are the flood of issue 27: 4.5 M forged
// blocks took a node's agent to 1.43 GB.
const (
	floodBlocks = 5_000_000
	floodBatch  = 100_000
)

// flood publishes floodBlocks distinct blocks on the engine's socket, in
// batches numbered on from the engine's seq, kept out of its replay
// buffer (whose memory would be the test's, not the agent's).
func (e *fakeEngine) flood(t *testing.T) int {
	t.Helper()
	batches := 0
	for first := uint64(1 << 40); first < 1<<40+floodBlocks; first += floodBatch {
		e.mu.Lock()
		seq := e.seq
		e.seq++
		e.mu.Unlock()
		if err := e.pub.SendMulti(zmq4.NewMsgFrom(vllm.PubFrames(e.topic, seq, floodPayload(first, floodBatch))...)); err != nil {
			t.Fatal(err)
		}
		batches++
	}
	return batches
}

// TestListenerFloodBounded is the node-down case of issue 27: 5 M blocks
// arrive on the engine's socket, far past what its cache holds. The mirror
// takes none past the engine's num_gpu_blocks: the replica becomes
// untrusted (and empty) at the first batch that would pass it, the agent's
// heap stays within the bounds of the queue, one decoded batch and the
// capped mirror, and the engine's own events are mirrored again once it
// clears its cache.
func TestListenerFloodBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("5 M blocks")
	}
	// No replay endpoint: the fake engine keeps the flood out of its
	// replay buffer (its memory would be the test's), so a replay there —
	// a handshake's poll or a repair — told the agent a history without
	// the flood, and the pre-flood set came back trusted (1 run in ~10).
	h := start(t, setup{enc: vllm.EncodingMap, noReplay: true})
	const numGPUBlocks = 65_536
	h.l.SetEngineBlocks(numGPUBlocks)
	a, ev := h.eng.stored(nil, toks(1, 4*testBS))
	h.eng.publish(false, ev)
	h.converged(t)

	base := heapLive()
	stop := heapPeak()
	n := h.eng.flood(t)
	// Handled, and the replica untrusted and empty: the counters are read
	// without the listener's lock, so on a loaded machine they can show
	// every batch before the mirror's state does (a CI run once read the
	// state from before the flood).
	testkit.WaitWithin(t, 5*time.Minute, "the flood to be handled and demo-0 to be untrusted and empty", func() bool {
		got, u, _ := h.hub.Blocks("demo-0")
		return value(h.hub.metrics.batches)+value(h.hub.metrics.badBatches) >= float64(1+n) && u && len(got) == 0
	})
	peak := stop()
	live := heapLive()
	t.Logf("flood of %d blocks in %d batches: heap in use peaked at %d MiB (%d MiB before); live after: %d MiB",
		floodBlocks, n, peak>>20, base>>20, live>>20)

	if got, u, _ := h.hub.Blocks("demo-0"); !u || len(got) != 0 {
		t.Fatalf("after the flood: untrusted %v with %d blocks, want untrusted and empty", u, len(got))
	}
	if v := value(h.hub.metrics.badBatches); v != 0 {
		t.Errorf("bad batches = %v: the flood must decode, to reach the cap", v)
	}
	if v := value(h.hub.metrics.overCap); v != 1 {
		t.Errorf("over-capacity count = %v, want 1", v)
	}
	// The stated bound (design §7.5 "Bounds"): the queue's bytes, one
	// decoded batch and a mirror of num_gpu_blocks, with the collector's
	// slack; without the caps the mirror alone passes a gigabyte.
	const liveBound, peakBound = 64 << 20, 512 << 20
	if live > base+liveBound {
		t.Errorf("live heap grew by %d MiB, bound %d MiB", (live-base)>>20, liveBound>>20)
	}
	if peak > base+peakBound {
		t.Errorf("heap in use peaked %d MiB over the base, bound %d MiB", (peak-base)>>20, peakBound>>20)
	}
	// The agent still reports the replica (untrusted: routers use tier 1).
	if full := h.hub.Full(); len(full) != 1 || !full[0].Untrusted {
		t.Fatalf("full copy after the flood: %v", full)
	}

	// The engine's own events: a clear makes the set known again.
	h.eng.mu.Lock()
	clear(h.eng.held)
	h.eng.mu.Unlock()
	h.eng.publish(false, &vllm.AllBlocksCleared{})
	_, ev = h.eng.stored(&a[3], toks(900, 2*testBS))
	h.eng.publish(false, ev)
	h.converged(t)
}

// TestMirrorCapacity: a store past the cap stops the batch (the caller
// untrusts the replica); copies of held blocks and blocks freed first do
// not count against it; SetEngineBlocks below what is held untrusts.
func TestMirrorCapacity(t *testing.T) {
	ext := func(hs ...uint64) []vllm.ExternalBlockHash {
		out := make([]vllm.ExternalBlockHash, len(hs))
		for i, h := range hs {
			out[i] = vllm.IntBlockHash(h)
		}
		return out
	}
	st := func(hs ...uint64) vllm.Event { return &vllm.BlockStored{BlockHashes: ext(hs...), BlockSize: testBS} }
	rm := func(hs ...uint64) vllm.Event { return &vllm.BlockRemoved{BlockHashes: ext(hs...)} }
	for _, tc := range []struct {
		name   string
		events []vllm.Event
		over   bool
	}{
		{"at the cap", []vllm.Event{st(1, 2, 3)}, false},
		{"over the cap", []vllm.Event{st(1, 2, 3, 4)}, true},
		{"a copy is not a block", []vllm.Event{st(1, 2, 3), st(3)}, false},
		{"evicted first", []vllm.Event{st(1, 2, 3), rm(1), st(4)}, false},
		{"over in a later event", []vllm.Event{st(1, 2), st(3), st(4)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMirror("r", 1, testBS, "0", 3, DefaultMaxOffloadBlocks, 16)
			if got := m.applyBatch(vllm.EventBatch{Events: tc.events}); got.overCap != tc.over {
				t.Errorf("overCap = %v, want %v", got.overCap, tc.over)
			}
			if len(m.byEngine) > 3 {
				t.Errorf("the mirror holds %d blocks, cap 3", len(m.byEngine))
			}
		})
	}
	t.Run("SetEngineBlocks below the held set", func(t *testing.T) {
		h := start(t, setup{enc: vllm.EncodingMap})
		_, ev := h.eng.stored(nil, toks(1, 4*testBS))
		h.eng.publish(false, ev)
		h.converged(t)
		h.l.SetEngineBlocks(8)
		if _, u, _ := h.hub.Blocks("demo-0"); u {
			t.Fatal("untrusted with 4 blocks of 8")
		}
		h.l.SetEngineBlocks(3)
		if _, u, _ := h.hub.Blocks("demo-0"); !u {
			t.Fatal("trusted with 4 blocks of a cache of 3")
		}
	})
}

// TestReplayBounded: a replay reply longer than the engine's buffer holds,
// in batches or in bytes, is not its buffer's: the replay fails (the
// replica becomes untrusted) instead of the agent holding it all.
func TestReplayBounded(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*ListenerConfig)
	}{
		{"more batches than the buffer", func(c *ListenerConfig) { c.ReplayBufferSteps = 5 }},
		{"more bytes than the cap", func(c *ListenerConfig) { c.MaxReplayBytes = 200 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, setup{enc: vllm.EncodingMap})
			for i := range 10 {
				_, ev := h.eng.stored(nil, toks(10*i, 4))
				h.eng.publish(false, ev)
			}
			h.converged(t)
			h.l.Close() // before its config changes under it
			tc.mod(&h.l.cfg)
			h.catchUp(t)
			h.untrusted(t)
			if n := value(h.hub.metrics.replays.WithLabelValues("failed")); n != 1 {
				t.Errorf("failed replays = %v, want 1", n)
			}
		})
	}
}
