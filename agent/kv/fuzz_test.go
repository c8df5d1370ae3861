package kv

import (
	"testing"

	"github.com/llmgw/llmgw/vllm"
)

// FuzzMirrorApply feeds the mirror whatever an engine's socket could carry:
// batches that decode must be applied without a panic and leave the mirror
// consistent, whatever their hashes, parents, lengths and extra keys.
func FuzzMirrorApply(f *testing.F) {
	a := chain(f, vllm.NoneHash("0"), toks(1, 8))
	seeds := []vllm.EventBatch{
		{Events: []vllm.Event{storedEv(nil, a, toks(1, 8)), removedEv(a[0].Uint64())}},
		{Events: []vllm.Event{storedEv(&a[0], a[1:], toks(5, 4)), &vllm.AllBlocksCleared{}}},
		{Events: []vllm.Event{&vllm.BlockStored{BlockHashes: []vllm.ExternalBlockHash{vllm.IntBlockHash(1)},
			TokenIDs: toks(1, 3), BlockSize: 0, ExtraKeys: []vllm.ExtraKeys{{"x", int64(1), []any{true}}}}}},
	}
	for _, s := range seeds {
		for _, enc := range []vllm.Encoding{vllm.EncodingMap, vllm.EncodingArray} {
			p, err := vllm.EncodeEventBatch(s, enc)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(p)
		}
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := vllm.DecodeEventBatch(payload)
		if err != nil {
			return
		}
		m := newMirror("r", 1, testBS, "0", DefaultMaxBlocks, DefaultMaxOffloadBlocks, 16)
		m.newEngine(1)
		// Twice: the second pass meets its own blocks as copies and parents.
		m.applyBatch(b)
		m.applyBatch(b)
		checkInvariants(t, m)
		if r := m.report(false); r == nil || !r.Reset_ || len(r.Stored) != len(m.held) {
			t.Fatalf("first report %v for %d held", r, len(m.held))
		}
	})
}
