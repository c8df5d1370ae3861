package kvindex

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Offload tiers (design §7.5 "Offload tiers"). An engine that offloads
// evicted KV blocks (vLLM's OffloadingConnector, LMCache) can load a
// prefix back from CPU memory or storage instead of recomputing it: not
// as good as holding it on the GPU, much better than nothing.
//
// Every tier shares the holder table: a block's holders are the replicas
// holding it in any tier, each a slot tagged in its high bits with the best
// tier holding the block there — none for the GPU, tagCPU, tagStorage. So
// LookupTiers costs one probe per block, as Lookup does, however many
// replicas offload (a Go map for the offload tiers beside the table cost a
// second probe per block: 75.5 µs at p50 in BenchmarkLookupTiers/
// cpu-offload against Lookup's 8.0 µs, docs/benchmarks.md), and a
// GPU holder is its bare slot, so Lookup and LookupPending compare slots
// as before and never see an offloaded holder. A fleet without offloading
// pays nothing in memory. Each replica's own sets (replica.blocks, .off)
// are the truth the tags are kept from: a change in any tier recomputes
// the pair's best tier (offTag).

// Tier is where a replica holds a block, best first.
type Tier uint8

const (
	TierNone Tier = iota
	TierGPU
	TierCPU
	TierStorage
)

// Bits of replica.off.
const (
	offCPU     uint8 = 1 << 0
	offStorage uint8 = 1 << 1
)

// A holder's layout: the replica's slot in the low slotBits, its best tier
// in the two above (0: the GPU).
const (
	slotBits          = 14
	slotMask   uint16 = 1<<slotBits - 1
	tagCPU     uint16 = 1 << slotBits
	tagStorage uint16 = 2 << slotBits
)

// offOf is r's offload tier bits for h, without a map probe for a replica
// offloading nothing.
func offOf(r *replica, h uint64) uint8 {
	if len(r.off) == 0 {
		return 0
	}
	return r.off[h]
}

// offTag is the holder tag of a block held in the offload tiers off only.
func offTag(off uint8) uint16 {
	if off&offCPU != 0 {
		return tagCPU
	}
	return tagStorage
}

// Weights credit a block held in an offload tier, as a share of one held
// on the GPU (1): what loading it back saves of recomputing it.
type Weights struct {
	// CPU weighs a block in host memory. Configuration key:
	// kv_credit_cpu (default 0.8).
	CPU float64 `yaml:"kv_credit_cpu"`
	// Storage weighs a block on local disk or remote storage. Key:
	// kv_credit_storage (default 0.25).
	Storage float64 `yaml:"kv_credit_storage"`
}

// DefaultWeights are llm-d's CPU weight (0.8) and NVIDIA Dynamo's disk
// weight (0.25); design §7.5 "Offload tiers" says why.
func DefaultWeights() Weights { return Weights{CPU: 0.8, Storage: 0.25} }

// Validate names the bad key: each weight in [0, 1], storage's at most
// CPU's (a slower tier is not worth more).
func (w Weights) Validate() error {
	switch {
	case !(w.CPU >= 0 && w.CPU <= 1):
		return fmt.Errorf("kv_credit_cpu: must be between 0 and 1, got %v", w.CPU)
	case !(w.Storage >= 0 && w.Storage <= 1):
		return fmt.Errorf("kv_credit_storage: must be between 0 and 1, got %v", w.Storage)
	case w.Storage > w.CPU:
		return fmt.Errorf("kv_credit_storage: must not exceed kv_credit_cpu (%v), got %v", w.CPU, w.Storage)
	}
	return nil
}

// Of is the credit of a block held at best in tier t.
func (w Weights) Of(t Tier) float64 {
	switch t {
	case TierGPU:
		return 1
	case TierCPU:
		return w.CPU
	case TierStorage:
		return w.Storage
	}
	return 0
}

// TierMatch is one replica's answer to LookupTiers.
type TierMatch struct {
	Replica
	// Blocks is how many of the prompt's leading blocks it holds in any
	// tier (≥ 1), and Credit their sum, each weighed by the best tier
	// holding it (Weights.Of).
	Blocks int
	Credit float64
	// GPU is how many leading blocks it holds on the GPU: Lookup's Blocks
	// (0 when the first block is offloaded only).
	GPU int
	// Untrusted: none of this is to be believed (see Status.Untrusted).
	Untrusted bool
	// Pending is how many of GPU were this router's pending entries
	// (with pending only).
	Pending int
}

// LookupTiers is Lookup over every tier: for every replica holding the
// first of hashes in some tier, how many leading blocks it holds in any,
// their credit by w, and how many it holds on the GPU. With pending, this
// router's pending speculative entries count as GPU blocks, as in
// LookupPending.
func (x *Index) LookupTiers(hashes []uint64, w Weights, pending bool, dst []TierMatch) []TierMatch {
	if len(hashes) == 0 {
		return dst
	}
	start := time.Now()
	x.mu.RLock()
	defer func() {
		x.mu.RUnlock()
		x.m.lookup.Observe(time.Since(start).Seconds())
	}()
	pending = pending && x.spec.n > 0
	if x.offEntries == 0 {
		// No replica offloads: the GPU walk answers, at its speed.
		var buf [16]Match
		ms := buf[:0]
		if pending {
			ms = x.lookupPendingLocked(hashes, ms)
		} else {
			ms = x.lookupLocked(hashes, ms)
		}
		for _, m := range ms {
			dst = append(dst, TierMatch{Replica: m.Replica, Blocks: m.Blocks, Credit: float64(m.Blocks), GPU: m.Blocks,
				Untrusted: m.Untrusted, Pending: m.Pending})
		}
		return dst
	}
	return x.lookupTiersLocked(hashes, w, pending, dst)
}

// probeBatch is how many blocks lookupTiersLocked probes at once.
const probeBatch = 16

// noTag is lookupTiersLocked's tag for a block a candidate does not hold.
const noTag = 3

// lookupTiersLocked is LookupTiers' walk over every tier, under the read
// lock: lookupLocked's, with each candidate's tier read from the tag of
// its holder in the same probe.
func (x *Index) lookupTiersLocked(hashes []uint64, w Weights, pending bool, dst []TierMatch) []TierMatch {
	var now int64
	if pending {
		now = x.cfg.Now().UnixNano()
	}
	type cand struct {
		credit            float64
		blocks, gpu, pend int32
		slot              uint16
		gpuRun            uint8 // 1 while every block so far was on the GPU
	}
	var buf [16]cand
	alive := buf[:0]
	// A block's credit by its holder's tag (0 the GPU, then tagCPU and
	// tagStorage shifted down).
	credit := [4]float64{1, w.CPU, w.Storage, 0}
	t := &x.holders
	mask := len(t.slots) - 1
	// The blocks are probed probeBatch at a time before any is read, so
	// the CPU overlaps their cache misses: the candidates' work between
	// two probes is too long for it to run ahead into the next as it does
	// in lookupLocked. A walk ending mid-batch wastes a few probes.
	var batch [probeBatch][]uint16
	for base := 0; base < len(hashes) && (base == 0 || len(alive) > 0); base += probeBatch {
		end := min(base+probeBatch, len(hashes))
		for i := base; i < end; i++ {
			h := hashes[i]
			batch[i-base] = nil
			for j := int(mix(h, t.shift)); ; j = (j + 1) & mask {
				s := &t.slots[j]
				if s.n == 0 {
					break
				}
				if s.key == h {
					if s.n == spilled {
						batch[i-base] = x.spill[s.spillAt()]
					} else {
						batch[i-base] = s.ids[:s.n]
					}
					break
				}
			}
		}
		if base == 0 {
			// The candidates: block 0's holders in any tier, and with
			// pending the replicas it is pending on.
			for _, v := range batch[0] {
				alive = append(alive, cand{slot: v & slotMask, gpuRun: 1})
			}
			if h0 := hashes[0]; pending {
				for _, s := range x.spec.holders[h0] {
					if x.livePending(s, h0, now) && !slices.ContainsFunc(alive, func(c cand) bool { return c.slot == s }) {
						alive = append(alive, cand{slot: s, gpuRun: 1})
					}
				}
			}
		}
		// Candidate by candidate through the batch, each one's state in
		// registers: block by block, every candidate's state went
		// through memory at every block, and that was most of the walk's
		// time once the misses overlapped.
		var next [probeBatch]int // where block i's next candidate's holder likely is
		bs := batch[:end-base]
		nx := next[:len(bs)]
		k := 0
		for _, c := range alive {
			// held is how many of the batch's blocks c holds in a row;
			// gpuEnd where its run on the GPU ended (-1: it has not).
			held, gpuEnd, cr := len(bs), -1, c.credit
			for bi, hs := range bs {
				// Holders keep their order from block to block (a
				// replica's stores are appended), and so do the
				// candidates: try where the one before was found, then
				// scan.
				tag := uint16(noTag)
				if p := nx[bi]; p < len(hs) && hs[p]&slotMask == c.slot {
					tag = hs[p] >> slotBits
					nx[bi] = p + 1
				} else if at := holderIndex(hs, c.slot); at >= 0 {
					tag = hs[at] >> slotBits
					nx[bi] = at + 1
				}
				// A pending entry counts as a GPU block where no GPU
				// holder is, as LookupPending counts it.
				pend := false
				if pending && tag != 0 {
					if h := hashes[base+bi]; slices.Contains(x.spec.holders[h], c.slot) && x.livePending(c.slot, h, now) {
						tag, pend = 0, true
					}
				}
				if tag == noTag {
					held = bi
					break
				}
				cr += credit[tag&3]
				if c.gpuRun == 1 && gpuEnd < 0 {
					if tag != 0 {
						gpuEnd = bi
					} else if pend {
						c.pend++
					}
				}
			}
			c.blocks += int32(held)
			c.credit = cr
			if c.gpuRun == 1 {
				if gpuEnd < 0 {
					c.gpu += int32(held)
				} else {
					c.gpu += int32(gpuEnd)
					c.gpuRun = 0
				}
			}
			if held < len(bs) {
				r := x.slots[c.slot]
				dst = append(dst, TierMatch{Replica: r.Replica, Blocks: int(c.blocks), Credit: c.credit, GPU: int(c.gpu),
					Untrusted: r.Untrusted, Pending: int(c.pend)})
				continue
			}
			alive[k] = c
			k++
		}
		alive = alive[:k]
	}
	for _, c := range alive {
		r := x.slots[c.slot]
		dst = append(dst, TierMatch{Replica: r.Replica, Blocks: int(c.blocks), Credit: c.credit, GPU: int(c.gpu),
			Untrusted: r.Untrusted, Pending: int(c.pend)})
	}
	return dst
}

// storeOffLocked records that r holds h in the offload tier bit.
func (x *Index) storeOffLocked(r *replica, h uint64, bit uint8) {
	cur := r.off[h]
	if cur&bit != 0 {
		return
	}
	if cur == 0 {
		if x.entries >= x.cfg.MaxEntries {
			x.dropped++
			return
		}
		if r.off == nil {
			r.off = map[uint64]uint8{}
		}
		x.entries++
		x.offEntries++
	}
	r.off[h] = cur | bit
	if !r.blocks.has(h) { // on the GPU, the holder's tier stays the GPU
		x.setHolderLocked(h, r.slot|offTag(cur|bit))
	}
}

// removeOffLocked records that r no longer holds h in tier bit.
func (x *Index) removeOffLocked(r *replica, h uint64, bit uint8) {
	cur := r.off[h]
	if cur&bit == 0 {
		return
	}
	if cur &^= bit; cur != 0 {
		r.off[h] = cur
	} else {
		delete(r.off, h)
		x.entries--
		x.offEntries--
	}
	switch {
	case r.blocks.has(h): // the holder's tier stays the GPU
	case cur != 0:
		x.setHolderLocked(h, r.slot|offTag(cur))
	default:
		x.unholdLocked(r.slot, h)
	}
}

// clearOffLocked forgets r's offload tiers; its GPU blocks are gone from
// the holders already (clearLocked).
func (x *Index) clearOffLocked(r *replica) {
	for h := range r.off {
		x.unholdLocked(r.slot, h)
	}
	x.entries -= len(r.off)
	x.offEntries -= len(r.off)
	r.off = nil
	r.Offloaded = 0
}

// TierBlocks returns replica id's block hashes in tier t, sorted; for
// debugging and the exactness tests.
func (x *Index) TierBlocks(id string, t Tier) ([]uint64, bool) {
	if t == TierGPU {
		_, hs, ok := x.Blocks(id)
		return hs, ok
	}
	bit := offCPU
	if t == TierStorage {
		bit = offStorage
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	r := x.replicas[id]
	if r == nil {
		return nil, false
	}
	out := []uint64{}
	for h, b := range r.off {
		if b&bit != 0 {
			out = append(out, h)
		}
	}
	slices.Sort(out)
	return out, true
}

// creditEpsilon absorbs float sums' rounding when a credit is compared
// with a whole number of blocks.
const creditEpsilon = 1e-9

// AtLeast reports whether credit c reaches n blocks.
func AtLeast(c float64, n int) bool { return c+creditEpsilon >= float64(n) && !math.IsNaN(c) }
