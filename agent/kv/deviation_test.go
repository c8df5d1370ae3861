package kv

import (
	"testing"

	"github.com/llmgw/llmgw/internal/testkit"
	"github.com/llmgw/llmgw/vllm"
)

// Engines that deviate from vLLM in small ways keep tier 2 (issue 14): one
// that numbers batches from 1 has its whole history replayed at the first
// live batch, which closes the gap (complete) rather than leaving the
// replica untrusted; a parent of 0 is none, so the first block's canonical
// hash is derived from the root and the next block chains from it.
func TestListenerDeviations(t *testing.T) {
	tests := []struct {
		name string
		s    setup
		// catchUp: a second listener catches up on what a first one saw.
		catchUp   bool
		untrusted bool
		result    string // the replay counter that rises to n
		n         float64
	}{
		{"from 1, parent 0, array", setup{seqStart: 1, parentZero: true, enc: vllm.EncodingArray}, false, false, "complete", 1},
		{"from 1, map, bytes", setup{seqStart: 1, bytes: true}, false, false, "complete", 1},
		{"from 5: any start", setup{seqStart: 5, parentZero: true}, false, false, "complete", 1},
		// Catch-up: the first listener's replay was complete too.
		{"from 1, catch-up of a history shorter than the buffer", setup{seqStart: 1, buffer: 100}, true, false, "complete", 2},
		{"from 1, catch-up of a full buffer: history may be lost", setup{seqStart: 1, buffer: 3}, true, true, "unrepairable", 1},
		{"from 1 without a replay socket: nothing can tell", setup{seqStart: 1, noReplay: true}, false, true, "failed", 1},
		{"from 0, parent 0: no replay needed", setup{parentZero: true, enc: vllm.EncodingArray}, false, false, "", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, tc.s)
			var first []vllm.BlockHash
			publish := func() {
				a, ev := h.eng.stored(nil, toks(1, 8))
				h.eng.publish(false, ev)
				first = append(first, a...)
				b, ev := h.eng.stored(&a[1], toks(100, 4))
				h.eng.publish(false, ev)
				first = append(first, b...)
			}
			if tc.catchUp {
				// Four batches seen by a first listener, then a second
				// listener (an agent restart) catches up from seq 0.
				publish()
				h.converged(t)
				publish()
				h.converged(t)
				h.catchUp(t)
			} else {
				publish()
			}
			replays := func() float64 {
				if tc.result == "" {
					return 0
				}
				return value(h.hub.metrics.replays.WithLabelValues(tc.result))
			}
			if tc.untrusted {
				h.untrusted(t)
				testkit.Wait(t, "the replay counted "+tc.result, func() bool { return replays() == tc.n })
				return
			}
			h.converged(t)
			if tc.result != "" {
				if n := replays(); n != tc.n {
					t.Errorf("%s replays = %v, want %v", tc.result, n, tc.n)
				}
			}
			for _, r := range []string{"repaired", "unrepairable", "failed", "complete"} {
				if r != tc.result && (!tc.catchUp || r != "complete") {
					if n := value(h.hub.metrics.replays.WithLabelValues(r)); n != 0 {
						t.Errorf("%s replays = %v, want 0", r, n)
					}
				}
			}
			// Every block's canonical digest was derived from its tokens,
			// the first from the root: a parent of 0 was read as none.
			m := h.l.mirror
			m.mu.Lock()
			defer m.mu.Unlock()
			for i, d := range first {
				b := m.byEngine[d.Uint64()]
				if b == nil || !b.known || b.digest != d {
					t.Errorf("block %d (%x): mirrored as %+v, want its derived digest", i, d.Uint64(), b)
				}
			}
			if n := value(h.hub.metrics.mismatches); n != 0 {
				t.Errorf("hash mismatches = %v", n)
			}
		})
	}
}

// catchUp replaces the listener with one that catches up by replay from
// seq 0, as after an agent restart that re-adopted the engine.
func (h *harness) catchUp(t *testing.T) {
	t.Helper()
	cfg := h.l.cfg
	h.l.Close()
	cfg.CatchUp, cfg.Endpoint = true, "tcp://127.0.0.1:0"
	l2, err := h.hub.Listen(cfg, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l2.Close)
	l2.Engine(1)
	h.l = l2
	h.eng.connect(l2.Endpoint())
}
