// Package kv is the agent's half of precise prefix routing (design §7.5 tier
// 2, steps 1–2): a listener per engine that receives the engine's KV-cache
// events over ZMQ, and a mirror of each engine's cached blocks whose net
// changes go up the control session.
//
// The mirror exists because the control plane and the routers must never
// see an engine's raw event stream: it is per step, it repeats blocks an
// engine holds twice, it carries CPU-offload and sliding-window blocks no
// prefix lookup can use, and its hashes are only as good as the engine's
// hashing configuration. What leaves the agent is the set of blocks a
// prompt can actually hit, under the hash every router computes from
// tokens.
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
	// copies counts how many of the engine's blocks hold this hash: vLLM
	// can cache one hash in two blocks and evict them one at a time.
	copies int
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

	// maxBlocks caps len(byEngine): what the engine's cache can hold
	// (ListenerConfig.MaxBlocks, SetEngineBlocks).
	maxBlocks int

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
func newMirror(replicaID string, uid uint64, blockSize uint32, hashSeed string, maxBlocks, recent int) *mirror {
	return &mirror{
		replicaID: replicaID, uid: uid, blockSize: blockSize, root: vllm.NoneHash(hashSeed), maxBlocks: maxBlocks,
		byEngine: map[uint64]*block{}, held: map[uint64]int{}, skipGroups: map[int]bool{},
		pending: map[uint64]int8{}, reset: true, recent: newRecentBatches(recent),
	}
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

// clear forgets every block and schedules a reset.
func (m *mirror) clear() {
	clear(m.byEngine)
	clear(m.held)
	clear(m.pending)
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
	if !e.OnGPU() {
		return 0, true
	}
	if !e.FullAttention() {
		if e.GroupIdx != nil {
			m.skipGroups[*e.GroupIdx] = true
		}
		return 0, true
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
		if m.byEngine[h.Uint64()] == nil && len(m.byEngine) >= m.maxBlocks {
			return mismatches, false
		}
		if derive && parentKnown {
			d, err := vllm.HashBlock(parent, e.TokenIDs[i*bs:(i+1)*bs], extraKeys(e, i))
			if err == nil {
				if !h.Matches(d) {
					mismatches++
				}
				m.store(h.Uint64(), block{canon: d.Uint64(), digest: d, known: true})
				parent = d
				continue
			}
		}
		d, ok := h.Digest()
		m.store(h.Uint64(), block{canon: h.Uint64(), digest: d, known: ok})
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

func (m *mirror) store(engine uint64, b block) {
	if cur := m.byEngine[engine]; cur != nil {
		cur.copies++
		return
	}
	b.copies = 1
	m.byEngine[engine] = &b
	m.held[b.canon]++
	if m.held[b.canon] == 1 {
		m.mark(b.canon, +1)
	}
}

func (m *mirror) removed(e *vllm.BlockRemoved) {
	if !e.OnGPU() || (e.GroupIdx != nil && m.skipGroups[*e.GroupIdx]) {
		return
	}
	for _, h := range e.BlockHashes {
		b := m.byEngine[h.Uint64()]
		if b == nil {
			// A block from before this mirror, another group, or another
			// medium: nothing of it is held.
			continue
		}
		if b.copies--; b.copies > 0 {
			continue
		}
		delete(m.byEngine, h.Uint64())
		if m.held[b.canon]--; m.held[b.canon] == 0 {
			delete(m.held, b.canon)
			m.mark(b.canon, -1)
		}
	}
}

func (m *mirror) mark(canon uint64, d int8) {
	if m.reset {
		return // the next report carries the whole set anyway
	}
	if m.pending[canon] == -d {
		delete(m.pending, canon)
		return
	}
	m.pending[canon] = d
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
		out.Stored = make([]uint64, 0, len(m.held))
		for h := range m.held {
			out.Stored = append(out.Stored, h)
		}
		slices.Sort(out.Stored)
	case len(m.pending) == 0:
		return nil
	default:
		for h, d := range m.pending {
			if d > 0 {
				out.Stored = append(out.Stored, h)
			} else {
				out.Removed = append(out.Removed, h)
			}
		}
		slices.Sort(out.Stored)
		slices.Sort(out.Removed)
	}
	m.reset = false
	clear(m.pending)
	return out
}

// unixNano is Unix seconds as nanoseconds; 0 stays 0.
func unixNano(s float64) int64 { return int64(math.Round(s * 1e9)) }

// blocks is the reported set, sorted: for tests and the blocks gauge.
func (m *mirror) blocks() []uint64 {
	out := make([]uint64, 0, len(m.held))
	for h := range m.held {
		out = append(out, h)
	}
	slices.Sort(out)
	return out
}

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
