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

// TierObserver is told, when a CacheObserver also implements it, what the
// CPU tier (--kv-offloading-size) stores and evicts, as vLLM's
// OffloadingConnector reports them: one OffloadStored per completed store
// and one OffloadRemoved per eviction round, each naming every block in it
// (design §8 "KV offload"). Same rules as CacheObserver's.
type TierObserver interface {
	OffloadStored(hashes []vllm.BlockHash)
	OffloadRemoved(hashes []vllm.BlockHash)
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
	// cpu is the offload tier, nil without one.
	cpu *cpuTier
}

// cpuTier is vLLM's native offloading connector with its LRU manager
// (vllm/v1/kv_offload/lru_manager.py): a bounded set of blocks in host
// memory. Every full block a sequence computes is stored to it as well
// (write-through: the connector offloads each request's new full blocks,
// skipping those already stored), evicting the least recently used when
// full; a prefix the GPU cache has lost but the tier holds is loaded back
// instead of recomputed.
type cpuTier struct {
	capacity int
	entries  map[vllm.BlockHash]*list.Element
	lru      list.List // of vllm.BlockHash, least recently used at the front
	observer TierObserver
}

func newCPUTier(capacity int, obs CacheObserver) *cpuTier {
	t := &cpuTier{capacity: capacity, entries: make(map[vllm.BlockHash]*list.Element)}
	if o, ok := obs.(TierObserver); ok {
		t.observer = o
	}
	return t
}

// store offloads the blocks not yet in the tier, as prepare_store and
// complete_store do: it evicts least recently used blocks to make room
// (one OffloadRemoved for them all), then stores (one OffloadStored). When
// more blocks are new than the tier holds, nothing is stored, as vLLM's
// prepare_store gives up when it cannot evict enough.
func (t *cpuTier) store(hashes []vllm.BlockHash) {
	var fresh []vllm.BlockHash
	seen := make(map[vllm.BlockHash]bool, len(hashes))
	for _, h := range hashes {
		if e, ok := t.entries[h]; ok {
			t.lru.MoveToBack(e) // stored again: used again
		} else if !seen[h] {
			fresh = append(fresh, h)
			seen[h] = true
		}
	}
	if len(fresh) == 0 || len(fresh) > t.capacity {
		return
	}
	var evicted []vllm.BlockHash
	for len(t.entries)+len(fresh) > t.capacity {
		h := t.lru.Remove(t.lru.Front()).(vllm.BlockHash)
		delete(t.entries, h)
		evicted = append(evicted, h)
	}
	if len(evicted) > 0 && t.observer != nil {
		t.observer.OffloadRemoved(evicted)
	}
	for _, h := range fresh {
		t.entries[h] = t.lru.PushBack(h)
	}
	if t.observer != nil {
		t.observer.OffloadStored(fresh)
	}
}

// hits is how many of hashes, from the first, the tier holds.
func (t *cpuTier) hits(hashes []vllm.BlockHash) int {
	n := 0
	for n < len(hashes) {
		if _, ok := t.entries[hashes[n]]; !ok {
			break
		}
		n++
	}
	return n
}

// touch marks blocks as recently used, the last most recently (the
// manager's touch walks them in reverse).
func (t *cpuTier) touch(hashes []vllm.BlockHash) {
	for _, h := range hashes {
		if e, ok := t.entries[h]; ok {
			t.lru.MoveToBack(e)
		}
	}
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

// withCPUTier adds an offload tier of capacity blocks (none when 0).
func (c *prefixCache) withCPUTier(capacity int) *prefixCache {
	if capacity > 0 {
		c.cpu = newCPUTier(capacity, c.observer)
	}
	return c
}

// offloadHits is how many blocks after the GPU cache's gpuHits the CPU tier
// holds, within the same cap as hits (at least one prompt token is
// computed); those are loaded, not recomputed. It touches the whole prefix
// the request uses, as the connector touches a request's blocks.
func (c *prefixCache) offloadHits(hashes []vllm.BlockHash, gpuHits, promptLen, blockSize int) int {
	if c.cpu == nil || !c.enabled {
		return 0
	}
	limit := min(len(hashes), (promptLen-1)/blockSize)
	if gpuHits >= limit {
		return 0
	}
	n := c.cpu.hits(hashes[gpuHits:limit])
	c.cpu.touch(hashes[:gpuHits+n])
	return n
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
	if c.cpu != nil {
		c.cpu.store(hashes[start:len(a.entries)])
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
// block is in use, since running sequences still point at them. With
// external it empties the CPU tier too (vLLM's reset_connector, asked for
// by POST /reset_prefix_cache?reset_external=true); its AllBlocksCleared,
// which names no medium, then tells subscribers of both tiers.
func (c *prefixCache) reset(external bool) bool {
	if len(c.entries) != c.lru.Len() {
		return false
	}
	clear(c.entries)
	c.lru.Init()
	if external && c.cpu != nil {
		clear(c.cpu.entries)
		c.cpu.lru.Init()
	}
	c.observer.AllBlocksCleared()
	return true
}
