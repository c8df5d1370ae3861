package sim

import (
	"fmt"
	"slices"
	"testing"

	"github.com/llmgw/llmgw/vllm"
)

// recorder is a CacheObserver that writes down what it is told.
type recorder struct{ events []string }

func (r *recorder) BlocksStored(parent *vllm.BlockHash, blocks []StoredBlock) {
	p := "none"
	if parent != nil {
		p = parent.String()[:6]
	}
	r.events = append(r.events, fmt.Sprintf("stored parent=%s n=%d", p, len(blocks)))
}
func (r *recorder) BlocksRemoved(h []vllm.BlockHash) {
	r.events = append(r.events, "removed "+h[0].String()[:6])
}
func (r *recorder) AllBlocksCleared() { r.events = append(r.events, "cleared") }

const bs = 4

// seqOf returns a prompt of n tokens starting at first, and its hashes.
func seqOf(t *testing.T, first, n int) ([]int, []vllm.BlockHash) {
	t.Helper()
	toks := make([]int, n)
	for i := range toks {
		toks[i] = first + i
	}
	h, err := vllm.BlockHashes(vllm.NoneHash("0"), toks, bs, nil)
	if err != nil {
		t.Fatal(err)
	}
	return toks, h
}

// run admits, computes and releases one prompt, returning the cached
// tokens it was given.
func run(t *testing.T, c *prefixCache, toks []int, hashes []vllm.BlockHash, extraBlocks int) int {
	t.Helper()
	hits := c.hits(hashes, len(toks), bs)
	a, ok := c.allocate(hashes, hits, (len(toks)+bs-1)/bs+extraBlocks)
	if !ok {
		t.Fatalf("allocation of %d tokens failed", len(toks))
	}
	c.commit(a, hashes, toks, bs)
	c.release(a)
	return hits * bs
}

func TestCacheHitsAfterSharedPrefix(t *testing.T) {
	tests := []struct {
		name       string
		first      [2]int // starting token of each prompt
		lens       [2]int
		wantCached int
	}{
		{"identical prompt recomputes its last block", [2]int{0, 0}, [2]int{12, 12}, 8},
		{"identical prompt with a partial tail", [2]int{0, 0}, [2]int{14, 14}, 12},
		{"longer prompt sharing the head", [2]int{0, 0}, [2]int{8, 20}, 8},
		{"different prompt", [2]int{0, 100}, [2]int{12, 12}, 0},
		{"shorter than a block", [2]int{0, 0}, [2]int{3, 3}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newPrefixCache(64, true, nil)
			t1, h1 := seqOf(t, tc.first[0], tc.lens[0])
			if got := run(t, c, t1, h1, 1); got != 0 {
				t.Fatalf("cold cache gave %d cached tokens", got)
			}
			t2, h2 := seqOf(t, tc.first[1], tc.lens[1])
			if got := run(t, c, t2, h2, 1); got != tc.wantCached {
				t.Errorf("cached %d tokens, want %d", got, tc.wantCached)
			}
			if c.used() != 0 {
				t.Errorf("%d blocks still used after release", c.used())
			}
		})
	}
}

func TestCacheDisabled(t *testing.T) {
	c := newPrefixCache(64, false, nil)
	toks, h := seqOf(t, 0, 16)
	run(t, c, toks, h, 0)
	if got := run(t, c, toks, h, 0); got != 0 {
		t.Errorf("disabled cache gave %d cached tokens", got)
	}
}

func TestCacheLRUEviction(t *testing.T) {
	rec := &recorder{}
	c := newPrefixCache(4, true, rec) // room for two 2-block prompts
	a, ha := seqOf(t, 0, 8)
	b, hb := seqOf(t, 100, 8)
	run(t, c, a, ha, 0)
	run(t, c, b, hb, 0)
	// a again: its last block is recomputed (one prompt token must be),
	// evicting its own cached copy, the least recently used block.
	run(t, c, a, ha, 0)
	x, hx := seqOf(t, 200, 8)
	run(t, c, x, hx, 0) // evicts b, now the least recently used, tail first
	want := []string{
		"stored parent=none n=2", "stored parent=none n=2",
		"removed " + ha[1].String()[:6], "stored parent=" + ha[0].String()[:6] + " n=1",
		"removed " + hb[1].String()[:6], "removed " + hb[0].String()[:6],
		"stored parent=none n=2",
	}
	if !slices.Equal(rec.events, want) {
		t.Errorf("events\n got %q\nwant %q", rec.events, want)
	}
	if got := run(t, c, a, ha, 0); got != 4 {
		t.Errorf("a after eviction of b: %d cached, want 4", got)
	}
	if got := run(t, c, b, hb, 0); got != 0 {
		t.Errorf("b was evicted but gave %d cached tokens", got)
	}
}

func TestCacheFullRefusesAndUsage(t *testing.T) {
	c := newPrefixCache(4, true, nil)
	toks, h := seqOf(t, 0, 12)
	a, ok := c.allocate(h, 0, 3)
	if !ok {
		t.Fatal("first allocation failed")
	}
	if got := c.usage(); got != 0.75 {
		t.Errorf("usage = %v, want 0.75", got)
	}
	if _, ok := c.allocate(nil, 0, 2); ok {
		t.Error("allocated 2 blocks with 1 free")
	}
	c.commit(a, h, toks, bs)
	if c.reset(false) {
		t.Error("reset succeeded with cached blocks in use")
	}
	c.release(a)
	if c.usage() != 0 {
		t.Errorf("usage after release = %v", c.usage())
	}
	// Free cached blocks do not count as used, and are evicted for room.
	if _, ok := c.allocate(nil, 0, 4); !ok {
		t.Error("could not evict free cached blocks")
	}
}

func TestCacheReset(t *testing.T) {
	rec := &recorder{}
	c := newPrefixCache(8, true, rec)
	toks, h := seqOf(t, 0, 8)
	run(t, c, toks, h, 0)
	if !c.reset(false) {
		t.Fatal("reset refused on an idle cache")
	}
	if got := run(t, c, toks, h, 0); got != 0 {
		t.Errorf("%d cached tokens after reset", got)
	}
	if !slices.Contains(rec.events, "cleared") {
		t.Errorf("no AllBlocksCleared in %q", rec.events)
	}
}
