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
// as good as holding it on the GPU, much better than nothing. The GPU tier
// lives in the holder table and answers Lookup as before; the offload
// tiers live beside it, so a fleet without offloading pays a map probe per
// lookup and nothing else.

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

// offHolder is one replica holding a block in an offload tier: its slot
// and its tier bits (offCPU, offStorage), kept with the block so a lookup
// probes one map per block rather than one per replica.
type offHolder struct {
	slot  uint16
	tiers uint8
}

// offTiersOf returns slot's tier bits in hs (0: none).
func offTiersOf(hs []offHolder, slot uint16) uint8 {
	for _, o := range hs {
		if o.slot == slot {
			return o.tiers
		}
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
	if len(x.offHolders) == 0 {
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
	var now int64
	if pending {
		now = x.cfg.Now().UnixNano()
	}
	type cand struct {
		credit            float64
		blocks, gpu, pend int32
		slot              uint16
		gpuRun            bool // every block so far was on the GPU
	}
	var buf [16]cand
	alive := buf[:0]
	var hv holders
	h0 := hashes[0]
	add := func(s uint16) {
		if !slices.ContainsFunc(alive, func(c cand) bool { return c.slot == s }) {
			alive = append(alive, cand{slot: s, gpuRun: true})
		}
	}
	for _, s := range x.holdersOf(h0, &hv) {
		add(s)
	}
	for _, o := range x.offHolders[h0] {
		add(o.slot)
	}
	if pending {
		for _, s := range x.spec.holders[h0] {
			if x.livePending(s, h0, now) {
				add(s)
			}
		}
	}
	emit := func(c *cand) {
		r := x.slots[c.slot]
		dst = append(dst, TierMatch{Replica: r.Replica, Blocks: int(c.blocks), Credit: c.credit, GPU: int(c.gpu),
			Untrusted: r.Untrusted, Pending: int(c.pend)})
	}
	for i := 0; i < len(hashes) && len(alive) > 0; i++ {
		h := hashes[i]
		hs := x.holdersOf(h, &hv)
		// The offload holders are probed only for a candidate the GPU
		// holders do not cover.
		var offs []offHolder
		probed := false
		k := 0
		for _, c := range alive {
			t, pend := TierNone, false
			switch {
			case slices.Contains(hs, c.slot):
				t = TierGPU
			case pending && slices.Contains(x.spec.holders[h], c.slot) && x.livePending(c.slot, h, now):
				t, pend = TierGPU, true
			default:
				if !probed {
					offs, probed = x.offHolders[h], true
				}
				switch off := offTiersOf(offs, c.slot); {
				case off&offCPU != 0:
					t = TierCPU
				case off&offStorage != 0:
					t = TierStorage
				}
			}
			if t == TierNone {
				emit(&c)
				continue
			}
			c.blocks++
			c.credit += w.Of(t)
			if t == TierGPU && c.gpuRun {
				c.gpu++
				if pend {
					c.pend++
				}
			} else {
				c.gpuRun = false
			}
			alive[k] = c
			k++
		}
		alive = alive[:k]
	}
	for i := range alive {
		emit(&alive[i])
	}
	return dst
}

// storeOffLocked records that r holds h in the offload tier bit.
func (x *Index) storeOffLocked(r *replica, h uint64, bit uint8) {
	cur, ok := r.off[h]
	if cur&bit != 0 {
		return
	}
	if !ok {
		if x.entries >= x.cfg.MaxEntries {
			x.dropped++
			return
		}
		if r.off == nil {
			r.off = map[uint64]uint8{}
		}
		x.offHolders[h] = append(x.offHolders[h], offHolder{slot: r.slot})
		x.entries++
	}
	r.off[h] = cur | bit
	x.setOffTiers(r.slot, h, cur|bit)
}

// setOffTiers sets slot's tier bits in h's offload holders.
func (x *Index) setOffTiers(slot uint16, h uint64, tiers uint8) {
	hs := x.offHolders[h]
	for i := range hs {
		if hs[i].slot == slot {
			hs[i].tiers = tiers
			return
		}
	}
}

// removeOffLocked records that r no longer holds h in tier bit.
func (x *Index) removeOffLocked(r *replica, h uint64, bit uint8) {
	cur, ok := r.off[h]
	if !ok || cur&bit == 0 {
		return
	}
	if cur &^= bit; cur != 0 {
		r.off[h] = cur
		x.setOffTiers(r.slot, h, cur)
		return
	}
	delete(r.off, h)
	x.unholdOffLocked(r.slot, h)
	x.entries--
}

func (x *Index) unholdOffLocked(slot uint16, h uint64) {
	hs := x.offHolders[h]
	i := slices.IndexFunc(hs, func(o offHolder) bool { return o.slot == slot })
	if i < 0 {
		return
	}
	hs[i] = hs[len(hs)-1]
	if hs = hs[:len(hs)-1]; len(hs) == 0 {
		delete(x.offHolders, h)
		return
	}
	x.offHolders[h] = hs
}

// clearOffLocked forgets r's offload tiers.
func (x *Index) clearOffLocked(r *replica) {
	for h := range r.off {
		x.unholdOffLocked(r.slot, h)
	}
	x.entries -= len(r.off)
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
