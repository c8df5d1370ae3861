package sim

import (
	"container/list"

	"github.com/llmgw/llmgw/vllm"
)

// CacheObserver is told what the prefix cache stores and evicts, in the
// shape of vLLM's KV events (design §7.5): one BlocksStored per commit, with
// the parent of its first block (nil for a prompt's first block); one
// BlocksRemoved per evicted block; AllBlocksCleared on a reset. The KV
// event publisher (a later issue) hooks in here.
//
// Calls are made with the engine's lock held, in the order the cache
// changed: an implementation must return quickly and must not call back
// into the server.
type CacheObserver interface {
	BlocksStored(parent *vllm.BlockHash, blocks []StoredBlock)
	BlocksRemoved(hashes []vllm.BlockHash)
	AllBlocksCleared()
}

// StoredBlock is one newly cached block and the tokens it holds.
type StoredBlock struct {
	Hash   vllm.BlockHash
	Tokens []int
	// LoRAName and LoRAID name the adapter of the request that computed
	// the block ("" and 0 for the base model): vLLM's BlockStored carries
	// them, and the name is part of the block's hash.
	LoRAName string
	LoRAID   int
}

type nopObserver struct{}

func (nopObserver) BlocksStored(*vllm.BlockHash, []StoredBlock) {}
func (nopObserver) BlocksRemoved([]vllm.BlockHash)              {}
func (nopObserver) AllBlocksCleared()                           {}

// prefixCache models vLLM's block pool with prefix caching: capacity
// physical blocks; a full block, once computed, is kept under its hash;
// blocks no running sequence uses stay cached but free, and are evicted
// least recently used first when a sequence needs room. Usage counts only
// blocks in use, as vLLM's kv_cache_usage_perc does.
//
// Not safe for concurrent use: the engine's mutex guards it.
type prefixCache struct {
	capacity int
	// held counts physical blocks sequences hold that are not cache
	// entries: partial blocks, blocks not yet computed, and duplicates of
	// a block another sequence cached first.
	held    int
	entries map[vllm.BlockHash]*cacheEntry
	// lru holds entries no sequence uses, least recently used at the
	// front: the free-but-cached blocks.
	lru      list.List
	enabled  bool
	observer CacheObserver
}

type cacheEntry struct {
	hash vllm.BlockHash
	refs int
	elem *list.Element // in lru while refs == 0
}

func newPrefixCache(capacity int, enabled bool, obs CacheObserver) *prefixCache {
	if obs == nil {
		obs = nopObserver{}
	}
	return &prefixCache{capacity: capacity, enabled: enabled, observer: obs,
		entries: make(map[vllm.BlockHash]*cacheEntry)}
}

// used is the number of blocks sequences are using.
func (c *prefixCache) used() int { return c.held + len(c.entries) - c.lru.Len() }

// usage is vLLM's kv_cache_usage_perc: the fraction of blocks in use.
func (c *prefixCache) usage() float64 { return float64(c.used()) / float64(c.capacity) }

// allocation is what one sequence holds in the cache.
type allocation struct {
	// entries are the sequence's leading cached blocks, in order.
	entries []*cacheEntry
	// held is how many other physical blocks it holds.
	held int
	// loraName and loraID are the request's adapter, for the events of
	// the blocks it stores.
	loraName string
	loraID   int
}

// hits is how many leading blocks of hashes are cached, capped so that at
// least one prompt token is computed: vLLM must run the last token to
// produce the first output, so a fully cached prompt recomputes its last
// block.
func (c *prefixCache) hits(hashes []vllm.BlockHash, promptLen, blockSize int) int {
	if !c.enabled {
		return 0
	}
	limit := min(len(hashes), (promptLen-1)/blockSize)
	n := 0
	for n < limit {
		if _, ok := c.entries[hashes[n]]; !ok {
			break
		}
		n++
	}
	return n
}

// allocate reserves blocks for a sequence whose prompt has the given full
// block hashes and which needs total blocks in all: the first hits come
// from the cache, the rest are fresh, evicting free cached blocks as
// needed. ok is false, and nothing changes, when they do not fit.
func (c *prefixCache) allocate(hashes []vllm.BlockHash, hits, total int) (*allocation, bool) {
	fresh := total - hits
	// Hit entries currently free are about to be used, so they cannot
	// also be evicted to make room.
	freeHits := 0
	for _, h := range hashes[:hits] {
		if c.entries[h].refs == 0 {
			freeHits++
		}
	}
	if c.capacity-c.used()-freeHits < fresh {
		return nil, false
	}
	a := &allocation{entries: make([]*cacheEntry, 0, len(hashes)), held: fresh}
	for _, h := range hashes[:hits] {
		e := c.entries[h]
		c.ref(e)
		a.entries = append(a.entries, e)
	}
	c.evictFor(fresh)
	c.held += fresh
	return a, true
}

// grow reserves n more fresh blocks for a running sequence, evicting free
// cached blocks as needed: vLLM's allocate_slots for the tokens of the next
// step. ok is false, and nothing changes, when they do not fit.
func (c *prefixCache) grow(a *allocation, n int) bool {
	if n <= 0 {
		return true
	}
	if c.capacity-c.used() < n {
		return false
	}
	c.evictFor(n)
	c.held += n
	a.held += n
	return true
}

// evictFor evicts free cached blocks, least recently used first, until n
// fresh blocks are unclaimed.
func (c *prefixCache) evictFor(n int) {
	var evicted []vllm.BlockHash
	for c.capacity-c.held-len(c.entries) < n {
		e := c.lru.Remove(c.lru.Front()).(*cacheEntry)
		delete(c.entries, e.hash)
		evicted = append(evicted, e.hash)
	}
	// One event per evicted block, as vLLM's block pool emits them.
	for _, h := range evicted {
		c.observer.BlocksRemoved([]vllm.BlockHash{h})
	}
}

func (c *prefixCache) ref(e *cacheEntry) {
	if e.refs == 0 && e.elem != nil {
		c.lru.Remove(e.elem)
		e.elem = nil
	}
	e.refs++
}

// commit caches the sequence's full blocks beyond those it already has as
// entries: hashes are the hashes of its tokens' full blocks so far.
func (c *prefixCache) commit(a *allocation, hashes []vllm.BlockHash, tokens []int, blockSize int) {
	if !c.enabled || len(hashes) <= len(a.entries) {
		return
	}
	start := len(a.entries)
	var parent *vllm.BlockHash
	if start > 0 {
		p := hashes[start-1]
		parent = &p
	}
	var stored []StoredBlock
	for i := start; i < len(hashes); i++ {
		h := hashes[i]
		if e, ok := c.entries[h]; ok {
			// Another sequence cached the same block first; this one keeps
			// its own copy as a plain held block, and shares the entry.
			c.ref(e)
			a.entries = append(a.entries, e)
			continue
		}
		if a.held == 0 {
			break // cannot happen: every full block was reserved
		}
		e := &cacheEntry{hash: h, refs: 1}
		c.entries[h] = e
		a.entries = append(a.entries, e)
		a.held--
		c.held--
		stored = append(stored, StoredBlock{Hash: h, Tokens: tokens[i*blockSize : (i+1)*blockSize],
			LoRAName: a.loraName, LoRAID: a.loraID})
	}
	if len(stored) > 0 {
		c.observer.BlocksStored(parent, stored)
	}
}

// release returns a finished sequence's blocks: its entries become free
// (and evictable, most recently used last), the rest simply free.
func (c *prefixCache) release(a *allocation) {
	// Later blocks are freed first, as vLLM does, so a prompt's tail is
	// evicted before its shared head.
	for i := len(a.entries) - 1; i >= 0; i-- {
		e := a.entries[i]
		e.refs--
		if e.refs == 0 {
			if _, live := c.entries[e.hash]; live {
				e.elem = c.lru.PushBack(e)
			}
		}
	}
	c.held -= a.held
	a.entries, a.held = nil, 0
}

// reset drops every cached block. Like vLLM it refuses while any cached
// block is in use, since running sequences still point at them.
func (c *prefixCache) reset() bool {
	if len(c.entries) != c.lru.Len() {
		return false
	}
	clear(c.entries)
	c.lru.Init()
	c.observer.AllBlocksCleared()
	return true
}
