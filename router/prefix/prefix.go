// Package prefix is tier 1 of prefix-aware routing (design §7.5): an
// approximate memory of which replica each prompt prefix was last sent to.
//
// Approximate because the router never sees the engine's cache: it only
// knows where it sent things. A prefix sent to a replica is probably still
// cached there for a while, and that guess is cheap — no tokenizer, no round
// trip — so it is what the router uses wherever the precise index (tier 2)
// is off or cannot answer.
//
// A prompt is cut into fixed-size chunks of its leading text and each chunk
// is hashed together with everything before it, so one hash stands for a
// whole prefix and two prompts share hash i exactly when they share their
// first i+1 chunks. The tree is then a bounded map from prefix hash to
// replica; "longest match" is a walk from the deepest hash up.
package prefix

import (
	"container/list"
	"sync"
)

// DefaultChunk is the number of bytes of text per chunk. About 16 tokens:
// short enough that a system prompt is many chunks, long enough that
// hashing an 8 KiB prompt is 128 map probes, not thousands.
const DefaultChunk = 64

// Hashes appends to dst the chained hash of each successive chunk of text
// (whole chunks only: a partial tail says nothing two prompts could share
// reliably) up to max chunks, and returns it. Hash i covers text[:chunk*(i+1)].
// FNV-1a 64 with a final mix: stable across processes and routers, which the
// rendezvous placement of unseen prefixes relies on (design §7.3).
func Hashes(dst []uint64, text string, chunk, max int) []uint64 {
	if chunk <= 0 {
		chunk = DefaultChunk
	}
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for i := 0; i+chunk <= len(text) && (max <= 0 || len(dst) < max); i += chunk {
		for j := i; j < i+chunk; j++ {
			h ^= uint64(text[j])
			h *= prime
		}
		dst = append(dst, Mix(h))
	}
	return dst
}

// Mix is splitmix64's finalizer: it spreads FNV's weak low bits so hashes
// can be compared and combined (rendezvous) without bias.
func Mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Tree remembers, for up to a bounded number of prefix hashes, the replica
// each was last sent to; the least recently used entries go first. K is the
// caller's replica identity (per design §4, its uid and incarnation). Safe for
// concurrent use.
type Tree[K comparable] struct {
	max int

	mu  sync.Mutex
	m   map[uint64]*list.Element
	lru *list.List // of *entry, most recent at the front
}

type entry[K comparable] struct {
	hash    uint64
	replica K
}

// NewTree returns a tree holding at most maxEntries prefix hashes (at least 1).
// An entry costs about 100 bytes, so the default of 1<<18 is some 25 MiB.
func NewTree[K comparable](maxEntries int) *Tree[K] {
	return &Tree[K]{max: max(maxEntries, 1), m: make(map[uint64]*list.Element), lru: list.New()}
}

// Match returns the replica of the longest remembered prefix of hashes that
// accept takes (a replica still a candidate), and how many chunks matched;
// depth 0 means no match. Matching does not refresh recency: only a request
// actually sent does (Observe), so probing never keeps a stale entry alive.
func (t *Tree[K]) Match(hashes []uint64, accept func(K) bool) (replica K, depth int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := len(hashes) - 1; i >= 0; i-- {
		el := t.m[hashes[i]]
		if el == nil {
			continue
		}
		if r := el.Value.(*entry[K]).replica; accept == nil || accept(r) {
			return r, i + 1
		}
	}
	var zero K
	return zero, 0
}

// Observe records that a request with these prefix hashes was sent to
// replica. Call it after the pick, with where the request really went, never
// with what a scorer proposed (design §7.5).
func (t *Tree[K]) Observe(hashes []uint64, replica K) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, h := range hashes {
		if el := t.m[h]; el != nil {
			el.Value.(*entry[K]).replica = replica
			t.lru.MoveToFront(el)
			continue
		}
		if t.lru.Len() >= t.max {
			old := t.lru.Back()
			delete(t.m, old.Value.(*entry[K]).hash)
			t.lru.Remove(old)
		}
		t.m[h] = t.lru.PushFront(&entry[K]{hash: h, replica: replica})
	}
}

// Forget drops every entry pointing at replica: it is gone, and its cache
// with it. Linear in the tree's size; replicas go rarely.
func (t *Tree[K]) Forget(replica K) {
	t.RetainReplicas(func(k K) bool { return k != replica })
}

// RetainReplicas drops every entry whose replica keep rejects.
func (t *Tree[K]) RetainReplicas(keep func(K) bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for el := t.lru.Front(); el != nil; {
		next := el.Next()
		if e := el.Value.(*entry[K]); !keep(e.replica) {
			delete(t.m, e.hash)
			t.lru.Remove(el)
		}
		el = next
	}
}

// Len is the number of prefix hashes held.
func (t *Tree[K]) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}
