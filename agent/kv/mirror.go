// Package kv is the agent's half of precise prefix routing (design §7.5 tier
// 2, steps 1–2): a listener per engine that receives the engine's KV-cache
// events over ZMQ, and a mirror of each engine's cached blocks whose net
// changes go up the control session.
//
// The mirror exists because the control plane and the routers must never
// see an engine's raw event stream: it is per step, it repeats blocks an
// engine holds twice, it carries sliding-window blocks no prefix lookup can
// use, it names offloaded blocks by the engine's hash alone, and its hashes
// are only as good as the engine's hashing configuration. What leaves the
// agent is, per tier (GPU, CPU, storage), the set of blocks a prompt can
// actually hit, under the hash every router computes from tokens.
package kv

import (
	"hash/maphash"
	"math"
	"slices"
	"sync"

	"github.com/llmgw/llmgw/vllm"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// block is one engine hash the mirror holds.
type block struct {
	// canon is the low 64 bits of the canonical digest: what routers hash
	// prompts to, and what the mirror reports.
	canon uint64
	// digest is the full canonical digest, the parent of the next block of
	// a prefix; known is false when neither the engine nor the mirror's
	// own hashing gave one (an int hash whose parent was never seen).
	digest vllm.BlockHash
	known  bool
	// copies counts how many of the engine's GPU blocks hold this hash:
	// vLLM can cache one hash in two blocks and evict them one at a time.
	copies int
	// parent is the engine hash of the block before it in its prompt, as
	// its GPU store gave it (hasParent false: a first block, or never on
	// the GPU): an offloaded block spanning several GPU blocks is named by
	// its last one's hash, and the others are found through it.
	parent    uint64
	hasParent bool
	// offloaded says which offload tiers hold it (bit offCPU, offStorage):
	// a set, as vLLM's offloading managers key their blocks by hash. The
	// block stays in byEngine while any tier holds it, so an offloaded
	// block keeps the canonical hash learned when it was on the GPU.
	offloaded uint8
}

// Offload tiers, as bits of block.offloaded and indices of mirror.off.
const (
	offCPU = iota
	offStorage
	numOff
)

// offTier maps an event's medium to its offload tier: gpu for the GPU
// (vLLM's "GPU", or no medium: engines before offloading), ok false for a
// medium no tier stands for (ignored).
func offTier(medium *string) (t int, gpu, ok bool) {
	if medium == nil {
		return 0, true, true
	}
	switch *medium {
	case vllm.MediumGPU:
		return 0, true, true
	case vllm.MediumCPU:
		return offCPU, false, true
	case vllm.MediumStorage, "DISK":
		return offStorage, false, true
	}
	return 0, false, false
}

// tierSet is one offload tier's reported set and its change since the last
// report, as mirror.held and mirror.pending are the GPU tier's.
type tierSet struct {
	held    map[uint64]int
	pending map[uint64]int8
	// n counts the engine hashes the tier holds (byEngine entries with
	// its bit): what the offload cap bounds.
	n int
}

// mirror is one engine's cached blocks, as its events describe them, keyed
// by the replica's (uid, incarnation) (design §4 "Identity"). Its mutex also
// guards the listener's sequence state, so that a restart reported by the
// supervisor and a batch arriving from the engine are applied in one order.
type mirror struct {
	mu sync.Mutex

	replicaID        string
	uid, incarnation uint64
	blockSize        uint32
	root             vllm.BlockHash // NoneHash(PYTHONHASHSEED): the first block's parent

	// byEngine maps the engine's hash (low 64 bits, the form removals can
	// be matched in whichever form the engine sends) to what is held. It
	// is also the engine-to-canonical map for engines that hash another
	// way.
	byEngine map[uint64]*block
	// held counts, per canonical hash, the engine hashes that map to it;
	// its keys are the reported set.
	held map[uint64]int
	// skipGroups are KV-cache groups seen to be other than full attention:
	// removals carry a group but not its kind.
	skipGroups map[int]bool

	// pending is the net change per canonical hash since the last report:
	// +1 stored, -1 removed. A hash stored and removed in between cancels.
	pending map[uint64]int8
	// reset makes the next report a reset with the whole set (restart,
	// AllBlocksCleared, trust lost or regained, a new mirror).
	reset bool
	// untrusted: events were lost and replay could not recover them, so
	// the set is unknown until the engine restarts or clears its cache;
	// why says so in the words reported (KVBlocks.untrusted_reason).
	untrusted bool
	why       string
	// oldest and newest are the engine's times (its batches' ts, Unix
	// seconds) of the first and last batch applied since the last report:
	// what the report carries for the lag metrics. 0: none.
	oldest, newest float64

	// gpuBlocks counts the engine hashes held on the GPU (byEngine entries
	// with copies > 0).
	gpuBlocks int
	// off are the offload tiers (offCPU, offStorage).
	off [numOff]tierSet
	// offSpan is, per offload tier, how many GPU blocks one of its blocks
	// spans (its stores' block_size over the engine's; 0 or 1: one), so
	// a removal, which carries no block size, covers what the store did.
	offSpan [numOff]int

	// maxBlocks caps gpuBlocks: what the engine's cache can hold
	// (ListenerConfig.MaxBlocks, SetEngineBlocks); maxOffload caps the
	// offload tiers' engine hashes together (ListenerConfig.MaxOffloadBlocks).
	// byEngine holds at most their sum.
	maxBlocks, maxOffload int

	// Sequence state of the engine's publisher, owned by the listener.
	seq seqState
	// recent tells a batch below seq.next that was applied already from
	// one of another engine process (recentBatches).
	recent *recentBatches
	// gen counts resets of the engine's identity, so a replay started for
	// one engine process is not applied to the next.
	gen uint64
}

type seqState struct {
	started bool   // a batch of this engine has been applied
	next    uint64 // the seq wanted next
}

// newMirror returns an empty mirror; recent is how many applied batches
// it remembers to tell a repeat from a restarted engine's (at least the
// listener's queue: a replay can overtake that many live batches).
func newMirror(replicaID string, uid uint64, blockSize uint32, hashSeed string, maxBlocks, maxOffload, recent int) *mirror {
	m := &mirror{
		replicaID: replicaID, uid: uid, blockSize: blockSize, root: vllm.NoneHash(hashSeed), maxBlocks: maxBlocks,
		maxOffload: maxOffload, byEngine: map[uint64]*block{}, held: map[uint64]int{}, skipGroups: map[int]bool{},
		pending: map[uint64]int8{}, reset: true, recent: newRecentBatches(recent),
	}
	for i := range m.off {
		m.off[i] = tierSet{held: map[uint64]int{}, pending: map[uint64]int8{}}
	}
	return m
}

// applyStats is what one batch did, for metrics.
type applyStats struct {
	stored, removed, cleared, skipped int
	mismatches                        int
	regainedTrust                     bool
	// overCap: a store would have held more than maxBlocks blocks; the
	// batch stopped there, and the caller makes the replica untrusted.
	overCap bool
}

// applyBatch applies a decoded batch's events in order. While untrusted,
// events are ignored until an AllBlocksCleared, after which the set is
// exactly known again (empty, then what follows).
func (m *mirror) applyBatch(b vllm.EventBatch) applyStats {
	var st applyStats
	st.skipped = len(b.Skipped)
	for _, ev := range b.Events {
		switch e := ev.(type) {
		case *vllm.AllBlocksCleared:
			st.cleared++
			if m.untrusted {
				st.regainedTrust = true
			}
			m.clear()
			m.untrusted, m.why = false, ""
		case *vllm.BlockStored:
			if m.untrusted {
				continue
			}
			st.stored += len(e.BlockHashes)
			mism, ok := m.stored(e)
			st.mismatches += mism
			if !ok {
				st.overCap = true
				return st
			}
		case *vllm.BlockRemoved:
			if m.untrusted {
				continue
			}
			st.removed += len(e.BlockHashes)
			m.removed(e)
		}
	}
	return st
}

// noteBatch records the engine's time of a batch with events. A ts that
// is not a plausible time (an engine's bug, or a hostile one) is left out
// rather than skew the lag metrics.
func (m *mirror) noteBatch(ts float64) {
	if !(ts > 0 && ts < 1<<33) { // also false for NaN; 1<<33 s is the year 2242
		return
	}
	if m.oldest == 0 || ts < m.oldest {
		m.oldest = ts
	}
	m.newest = max(m.newest, ts)
}

// clear forgets every block of every tier and schedules a reset.
// AllBlocksCleared clears every tier too: it names no medium, and an
// offloaded block forgotten costs a missed preference, never a wrong one.
func (m *mirror) clear() {
	clear(m.byEngine)
	clear(m.held)
	clear(m.pending)
	m.gpuBlocks = 0
	for i := range m.off {
		clear(m.off[i].held)
		clear(m.off[i].pending)
		m.off[i].n = 0
	}
	m.reset = true
}

// newEngine starts over for a new engine process: its cache is empty and
// its seq starts from 0 (design §7.5: "resets on engine restart").
func (m *mirror) newEngine(incarnation uint64) {
	m.incarnation = incarnation
	m.restart()
}

// restart starts over for a new process of the same engine, one the
// engine's own events showed (its seq counting again from below, or a
// whole history replayed) rather than the supervisor: the same
// incarnation, an empty cache, seq from 0.
func (m *mirror) restart() {
	m.clear()
	clear(m.skipGroups)
	m.untrusted, m.why = false, ""
	m.offSpan = [numOff]int{}
	m.seq = seqState{}
	m.recent.forget()
	m.gen++
}

// markUntrusted gives up on the set until the engine restarts or clears;
// why is what the report says.
func (m *mirror) markUntrusted(why string) {
	m.clear()
	m.untrusted, m.why = true, why
}

// stored adds the blocks of one event and returns how many of the
// engine's hashes differ from the canonical ones.
//
// Each block's canonical hash is re-derived from its tokens and its
// parent's canonical digest, the way a router will hash a prompt. An
// engine that hashes another way (another algorithm, seed or extra keys)
// would otherwise fill every index with hashes no prompt ever matches; the
// mismatch counter tells the operator, and byEngine keeps removals working.
// A block whose parent the mirror never saw cannot be derived, and is
// taken as the engine reports it.
//
// ok is false when a new block would take the mirror past maxBlocks: the
// event is not the engine's cache, and the rest of it is not stored.
func (m *mirror) stored(e *vllm.BlockStored) (mismatches int, ok bool) {
	t, gpu, known := offTier(e.Medium)
	if !known {
		return 0, true
	}
	if !e.FullAttention() {
		if e.GroupIdx != nil {
			m.skipGroups[*e.GroupIdx] = true
		}
		return 0, true
	}
	if !gpu {
		return 0, m.storedOff(e, t)
	}
	n := len(e.BlockHashes)
	bs := e.BlockSize
	if bs <= 0 {
		bs = int(m.blockSize)
	} else if m.blockSize != uint32(bs) {
		m.blockSize = uint32(bs)
	}
	derive := bs > 0 && len(e.TokenIDs) == n*bs
	parent, parentKnown := m.root, true
	if e.ParentBlockHash != nil {
		p := m.byEngine[e.ParentBlockHash.Uint64()]
		parentKnown = p != nil && p.known
		if parentKnown {
			parent = p.digest
		}
	}
	for i, h := range e.BlockHashes {
		if b := m.byEngine[h.Uint64()]; (b == nil || b.copies == 0) && m.gpuBlocks >= m.maxBlocks {
			return mismatches, false
		}
		var pe uint64
		hasParent := i > 0 || e.ParentBlockHash != nil
		if i > 0 {
			pe = e.BlockHashes[i-1].Uint64()
		} else if e.ParentBlockHash != nil {
			pe = e.ParentBlockHash.Uint64()
		}
		if derive && parentKnown {
			d, err := vllm.HashBlock(parent, e.TokenIDs[i*bs:(i+1)*bs], extraKeys(e, i))
			if err == nil {
				if !h.Matches(d) {
					mismatches++
				}
				m.store(h.Uint64(), block{canon: d.Uint64(), digest: d, known: true, parent: pe, hasParent: hasParent}, true)
				parent = d
				continue
			}
		}
		d, ok := h.Digest()
		m.store(h.Uint64(), block{canon: h.Uint64(), digest: d, known: ok, parent: pe, hasParent: hasParent}, false)
		parent, parentKnown = d, ok
	}
	return mismatches, true
}

// extraKeys are block i's extra hash keys as the event gives them. Engines
// from before extra_keys was published hashed the adapter's name alone.
func extraKeys(e *vllm.BlockStored, i int) []any {
	if e.ExtraKeys != nil {
		if i < len(e.ExtraKeys) && e.ExtraKeys[i] != nil {
			return []any(e.ExtraKeys[i])
		}
		return nil
	}
	if e.LoRAName != nil {
		return []any{*e.LoRAName}
	}
	return nil
}

// store adds a GPU copy of engine hash engine; b is the block when the
// mirror holds none of it yet in any tier. A block an offload tier holds
// already keeps its canonical hash unless b's was derived from tokens.
func (m *mirror) store(engine uint64, b block, derived bool) {
	cur := m.byEngine[engine]
	if cur != nil && cur.copies > 0 {
		cur.copies++
		return
	}
	if cur == nil {
		cur = &b
		m.byEngine[engine] = cur
	} else if !cur.hasParent {
		cur.parent, cur.hasParent = b.parent, b.hasParent
	}
	if derived && cur.canon != b.canon {
		// Offloaded before the mirror could derive its hash: move its
		// offload tiers to the canonical hash now known.
		for t := range numOff {
			if cur.offloaded&(1<<t) != 0 {
				m.unholdOff(t, cur.canon)
				m.holdOff(t, b.canon)
			}
		}
		cur.canon, cur.digest, cur.known = b.canon, b.digest, true
	}
	cur.copies = 1
	m.gpuBlocks++
	m.held[cur.canon]++
	if m.held[cur.canon] == 1 {
		markIn(m.pending, m.reset, cur.canon, +1)
	}
}

// storedOff adds the blocks of an event of offload tier t. Offloading
// connectors report the GPU blocks' own hashes but no tokens or parent
// (vLLM's OffloadingConnector.take_events), so a block's canonical hash is
// the one learned while it was on the GPU; one the mirror never saw there
// is taken as the engine reports it, as a block with an unknown parent is.
// An offloaded block larger than the GPU's (the connector's block_size k
// times the engine's: vLLM's block_size_factor) is named by the hash of
// the last of the k GPU blocks it holds (OffloadingConnectorScheduler.
// _get_block_hashes), so it stands for that block and its k-1 ancestors,
// found through the parents learned on the GPU; an ancestor the mirror
// does not know ends the group there (an under-report). A block_size not
// a multiple of the engine's is skipped. With maxOffload 0 offload tiers
// are not mirrored at all. ok is false past maxOffload.
func (m *mirror) storedOff(e *vllm.BlockStored, t int) (ok bool) {
	if m.maxOffload == 0 {
		return true
	}
	span := 1
	if bs := uint32(max(e.BlockSize, 0)); bs > 0 && m.blockSize != 0 && bs != m.blockSize {
		if bs%m.blockSize != 0 {
			return true
		}
		span = int(bs / m.blockSize)
	}
	m.offSpan[t] = span
	for _, h := range e.BlockHashes {
		eh := h.Uint64()
		for j := range span {
			cur := m.byEngine[eh]
			if cur == nil && j > 0 {
				break // an ancestor never seen: the group ends here
			}
			if cur == nil || cur.offloaded&(1<<t) == 0 {
				if m.off[offCPU].n+m.off[offStorage].n >= m.maxOffload {
					return false
				}
				if cur == nil {
					d, known := h.Digest()
					cur = &block{canon: eh, digest: d, known: known}
					m.byEngine[eh] = cur
				}
				cur.offloaded |= 1 << t // a set: stored once
				m.off[t].n++
				m.holdOff(t, cur.canon)
			}
			if !cur.hasParent {
				break
			}
			eh = cur.parent
		}
	}
	return true
}

func (m *mirror) holdOff(t int, canon uint64) {
	ts := &m.off[t]
	if ts.held[canon]++; ts.held[canon] == 1 {
		markIn(ts.pending, m.reset, canon, +1)
	}
}

func (m *mirror) unholdOff(t int, canon uint64) {
	ts := &m.off[t]
	if ts.held[canon]--; ts.held[canon] <= 0 {
		delete(ts.held, canon)
		markIn(ts.pending, m.reset, canon, -1)
	}
}

func (m *mirror) removed(e *vllm.BlockRemoved) {
	t, gpu, known := offTier(e.Medium)
	if !known || (e.GroupIdx != nil && m.skipGroups[*e.GroupIdx]) {
		return
	}
	if !gpu {
		for _, h := range e.BlockHashes {
			m.removedOff(h.Uint64(), t)
		}
		return
	}
	for _, h := range e.BlockHashes {
		b := m.byEngine[h.Uint64()]
		if b == nil {
			// A block from before this mirror, another group, or another
			// medium: nothing of it is held.
			continue
		}
		if b.copies == 0 {
			continue // held offloaded only
		}
		if b.copies--; b.copies > 0 {
			continue
		}
		m.gpuBlocks--
		if m.held[b.canon]--; m.held[b.canon] == 0 {
			delete(m.held, b.canon)
			markIn(m.pending, m.reset, b.canon, -1)
		}
		if b.copies == 0 && b.offloaded == 0 {
			delete(m.byEngine, h.Uint64()) // no tier holds it: the mapping goes
		}
	}
}

// removedOff takes the offloaded block named eh out of tier t: with the
// tier's span, eh and its ancestors, as storedOff put them there.
func (m *mirror) removedOff(eh uint64, t int) {
	for range max(m.offSpan[t], 1) {
		b := m.byEngine[eh]
		if b == nil || b.offloaded&(1<<t) == 0 {
			return
		}
		b.offloaded &^= 1 << t
		m.off[t].n--
		m.unholdOff(t, b.canon)
		next, more := b.parent, b.hasParent
		if b.copies == 0 && b.offloaded == 0 {
			delete(m.byEngine, eh) // no tier holds it: the mapping goes
		}
		if !more {
			return
		}
		eh = next
	}
}

// markIn notes a tier's net change of canon in pending; nothing while a
// reset is due, since the next report carries the whole set anyway.
func markIn(pending map[uint64]int8, reset bool, canon uint64, d int8) {
	if reset {
		return
	}
	if pending[canon] == -d {
		delete(pending, canon)
		return
	}
	pending[canon] = d
}

// report returns the change since the last report (nil when there is
// none, or before the engine's first start), or with full the whole set
// as a reset. Either way what it returns
// is now reported.
func (m *mirror) report(full bool) *llmgwv1.KVBlocks {
	if m.incarnation == 0 {
		// No engine has started yet: there is no (uid, incarnation) to
		// report under, and the first report after its start is a reset.
		return nil
	}
	out := &llmgwv1.KVBlocks{ReplicaId: m.replicaID, Uid: m.uid, Incarnation: m.incarnation,
		Untrusted: m.untrusted, UntrustedReason: m.why, BlockSize: m.blockSize,
		OldestEventUnixNano: unixNano(m.oldest), NewestEventUnixNano: unixNano(m.newest)}
	m.oldest, m.newest = 0, 0
	switch {
	case full || m.reset:
		out.Reset_ = true
		out.Stored = sortedKeys(m.held)
		out.StoredCpu = sortedKeys(m.off[offCPU].held)
		out.StoredStorage = sortedKeys(m.off[offStorage].held)
		if len(out.StoredCpu) == 0 {
			out.StoredCpu = nil
		}
		if len(out.StoredStorage) == 0 {
			out.StoredStorage = nil
		}
	case len(m.pending) == 0 && len(m.off[offCPU].pending) == 0 && len(m.off[offStorage].pending) == 0:
		return nil
	default:
		out.Stored, out.Removed = splitPending(m.pending)
		out.StoredCpu, out.RemovedCpu = splitPending(m.off[offCPU].pending)
		out.StoredStorage, out.RemovedStorage = splitPending(m.off[offStorage].pending)
	}
	m.reset = false
	clear(m.pending)
	for i := range m.off {
		clear(m.off[i].pending)
	}
	return out
}

// sortedKeys returns a tier's held hashes, sorted.
func sortedKeys(held map[uint64]int) []uint64 {
	out := make([]uint64, 0, len(held))
	for h := range held {
		out = append(out, h)
	}
	slices.Sort(out)
	return out
}

// splitPending returns a tier's stored and removed hashes since the last
// report, each sorted (nil when none).
func splitPending(pending map[uint64]int8) (stored, removed []uint64) {
	for h, d := range pending {
		if d > 0 {
			stored = append(stored, h)
		} else {
			removed = append(removed, h)
		}
	}
	slices.Sort(stored)
	slices.Sort(removed)
	return stored, removed
}

// unixNano is Unix seconds as nanoseconds; 0 stays 0.
func unixNano(s float64) int64 { return int64(math.Round(s * 1e9)) }

// blocks is the reported GPU set, sorted: for tests and the blocks gauge.
func (m *mirror) blocks() []uint64 { return sortedKeys(m.held) }

// offBlocks is offload tier t's reported set, sorted: for tests.
func (m *mirror) offBlocks(t int) []uint64 { return sortedKeys(m.off[t].held) }

// recentBatches remembers a digest of each of the last batches applied, by
// seq, in a ring. A batch whose seq is below the one wanted next is either
// one of these again (a live batch a replay overtook: the same bytes, as
// vLLM replays what it published) or a batch of another process of the
// engine, restarted and counting from 0 again before any health check
// noticed (issue 27: its batches were dropped as "already applied" and
// the index stayed stale).
type recentBatches struct {
	seed    maphash.Seed
	entries []recentBatch
}

type recentBatch struct {
	seq, sum uint64
	set      bool
}

func newRecentBatches(n int) *recentBatches {
	return &recentBatches{seed: maphash.MakeSeed(), entries: make([]recentBatch, max(n, 1))}
}

func (r *recentBatches) add(seq uint64, payload []byte) {
	r.entries[seq%uint64(len(r.entries))] = recentBatch{seq: seq, sum: maphash.Bytes(r.seed, payload), set: true}
}

// applied reports whether the batch seq with payload is one applied lately.
func (r *recentBatches) applied(seq uint64, payload []byte) bool {
	e := r.entries[seq%uint64(len(r.entries))]
	return e.set && e.seq == seq && e.sum == maphash.Bytes(r.seed, payload)
}

func (r *recentBatches) forget() { clear(r.entries) }
