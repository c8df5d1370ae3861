// Package kvindex is the router's precise KV-cache index (design §7.5 tier 2,
// step 4): which replica holds which KV block, as the agents' mirrors report
// it through the control plane's watch stream, so a prompt's block hashes can
// be answered with "replica r holds its first n blocks".
//
// Leading blocks only, because that is what an engine can reuse: vLLM's
// prefix cache chains each block's hash on its parent's, so a replica holding
// block 5 but not block 4 must recompute from block 4 on, and block 5's copy
// is worthless to this request.
//
// The index is a set per replica, not a count: the agent's mirror already
// folds vLLM's duplicate stores of one hash into one presence (design §7.5
// step 2), so every update says "now held" or "no longer held".
package kvindex

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Config bounds the index.
type Config struct {
	// MaxEntries bounds the (block, replica) pairs held. Stores past it are
	// dropped and counted: the index then under-reports, which costs a
	// missed preference and never a wrong one. At about 40 bytes an entry
	// (BenchmarkBytesPerEntry) the default (8 Mi entries) is some 320 MiB —
	// 1,000 replicas of 8k blocks each. Configuration key (no flag):
	// kv_index_max_entries.
	MaxEntries int `yaml:"kv_index_max_entries"`
	// SpecTTLMin and SpecTTLMax bound the TTL of speculative entries
	// (spec.go), which otherwise follows the measured lag from a send to
	// its confirmation. Configuration keys (no flags):
	// kv_speculation_ttl_min (default 500ms), kv_speculation_ttl_max
	// (default 10s); 0 takes the default.
	SpecTTLMin time.Duration `yaml:"kv_speculation_ttl_min"`
	SpecTTLMax time.Duration `yaml:"kv_speculation_ttl_max"`
	// SpecPending bounds the pending entries overall, SpecPendingPerReplica
	// those of one replica; past either the oldest goes. At about 100 bytes
	// an entry (its map slot, its holder and two queue entries) the default
	// 1 Mi is some 100 MiB at most, and a replica's 64 Ki the blocks of a
	// large engine. Keys: kv_speculation_max_pending,
	// kv_speculation_max_pending_per_replica; 0 takes the default.
	SpecPending           int `yaml:"kv_speculation_max_pending"`
	SpecPendingPerReplica int `yaml:"kv_speculation_max_pending_per_replica"`
	// Credit weighs the blocks an engine holds in its offload tiers in
	// tier 2's prefix score (tiers.go; keys kv_credit_cpu,
	// kv_credit_storage).
	Credit Weights `yaml:",inline"`
	// Now is the clock of speculative entries; nil is time.Now.
	Now func() time.Time `yaml:"-"`
}

// DefaultConfig holds 8 Mi entries and the speculation defaults.
func DefaultConfig() Config {
	return Config{MaxEntries: 8 << 20, SpecTTLMin: defaultSpecTTLMin, SpecTTLMax: defaultSpecTTLMax,
		SpecPending: defaultSpecPending, SpecPendingPerReplica: defaultSpecPerReplica, Credit: DefaultWeights()}
}

// Validate names the bad field by its configuration key.
func (c Config) Validate() error {
	if c.MaxEntries < 1 {
		return fmt.Errorf("kv_index_max_entries: must be at least 1, got %d", c.MaxEntries)
	}
	if err := c.Credit.Validate(); err != nil {
		return err
	}
	return c.validateSpec()
}

// Replica identifies one replica incarnation's KV state, as KVBlocks names
// it: a new uid is a new placement and a new incarnation a restarted engine,
// and neither shares blocks with what came before (design §4 "Identity").
type Replica struct {
	ID          string
	UID         uint64
	Incarnation uint64
}

// Status is what the index knows of one replica's KV state.
type Status struct {
	Replica
	// Node is the agent that reported it.
	Node string
	// Untrusted: the agent lost events it could not replay, so the set is
	// not known; the replica is to be routed by tier 1 until a reset.
	Untrusted bool
	// BlockSize is the engine's block size in tokens (0: not reported).
	BlockSize uint32
	// Blocks is how many blocks it holds on the GPU, and Offloaded how
	// many it holds in an offload tier (CPU or storage) only or as well.
	Blocks    int
	Offloaded int
}

// Match is one replica's answer to a lookup.
type Match struct {
	Replica
	// Blocks is how many of the prompt's leading blocks it holds (≥ 1).
	Blocks int
	// Untrusted: Blocks is not to be believed (see Status.Untrusted).
	Untrusted bool
	// Pending is how many of Blocks were this router's pending entries
	// rather than confirmed ones (LookupPending only).
	Pending int
}

// Update outcomes, as counted in llmgw_router_kvindex_updates_total{result}.
const (
	ResultApplied = "applied"
	// ResultStale: an update for an older placement or incarnation than the
	// one held (a late message); dropped.
	ResultStale = "stale"
	// ResultUnknown: a delta for a replica incarnation the index holds no
	// base for; dropped, since applying it would invent a partial set. The
	// agent's next full copy (every new session, every reset) brings it.
	ResultUnknown = "unknown"
	// ResultInvalid: an update without a replica id.
	ResultInvalid = "invalid"
)

// ErrNoReplica is returned for updates that name no replica.
var ErrNoReplica = errors.New("kvindex: update names no replica")

// ErrStale and ErrUnknown are wrapped by Apply's refusals (see ResultStale
// and ResultUnknown).
var (
	ErrFull    = fmt.Errorf("kvindex: more than %d replicas", MaxReplicas)
	ErrStale   = errors.New("kvindex: update for an older replica incarnation")
	ErrUnknown = errors.New("kvindex: delta for a replica incarnation without a base")
)

// replica is one replica incarnation's entry. slot is its interned index in
// the holder sets, so a (block, replica) pair costs two bytes there rather
// than a string.
type replica struct {
	Status
	slot   uint16
	blocks hashSet
	// off is the offload tiers' blocks (bits offCPU, offStorage): a map,
	// since most fleets offload nothing. The holder table carries each
	// block's best tier beside (tiers.go); this is the whole truth.
	off map[uint64]uint8
	// pending maps a hash recorded by Speculate to its recording time
	// (unix ns); queue holds them oldest first (spec.go). gone marks a
	// replica dropped from the index, whose queued entries are stale.
	pending map[uint64]int64
	queue   fifo
	gone    bool
}

// MaxReplicas is how many replicas the index holds at once: a slot is the
// low slotBits of a holder (the high two are its tier, tiers.go). Replicas
// past it are not indexed and answer "no data" (tier 1). Four times the
// control plane's replicas per model (design §4, "Entry rules").
const MaxReplicas = 1 << slotBits

// inlineHolders is how many holders a block keeps inside its table slot.
const inlineHolders = 7

// holders is the set of replicas holding one block in any tier, inline in
// the table's slot so a lookup costs one probe and a store no allocation:
// the fleet holds each block on 1–8 replicas. Each holder is a slot
// tagged with the best tier holding the block there (tiers.go): a GPU
// holder is its bare slot, so Lookup's test "does slot s hold it on the
// GPU" stays a plain comparison. n == spilled marks a set that grew past
// inlineHolders and lives in Index.spill instead, at the index ids[0:2]
// hold (spillAt): a slice index rather than a map, so a lookup reaching a
// spilled block pays no hashing and a miss less. Holders keep the order
// they were added in (removal shifts, not swaps), which LookupTiers'
// walk relies on for speed.
type holders struct {
	ids [inlineHolders]uint16
	n   uint16
}

const spilled = 0xffff

// spillAt is the index in Index.spill of a spilled set's holders.
func (hs *holders) spillAt() uint32 { return uint32(hs.ids[0]) | uint32(hs.ids[1])<<16 }

// Index is the KV-block index. Safe for concurrent use: lookups share a read
// lock, updates take the write lock (the watch client applies them from one
// goroutine, a few times a second per node).
type Index struct {
	cfg Config

	mu sync.RWMutex
	// holders maps a block hash to the replicas holding it in any tier,
	// each tagged with its best (tiers.go) — 1 to a handful each, so a
	// short array beats any set (table.go).
	holders blockTable
	// spill holds the holder sets past inlineHolders, spillFree the
	// indexes of its unused (nil) entries.
	spill     [][]uint16
	spillFree []uint32
	replicas  map[string]*replica // by replica id: one incarnation each
	slots     []*replica          // by slot; nil when free
	free      []uint16
	entries   int
	// offEntries counts the (block, replica) pairs of the offload tiers:
	// while 0, LookupTiers is Lookup.
	offEntries int
	dropped    uint64 // stores refused at MaxEntries

	spec specState

	m *metrics
}

// New builds an empty index; reg receives its metrics (nil for none).
func New(cfg Config, reg prometheus.Registerer) (*Index, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.fillSpec()
	x := &Index{cfg: cfg, replicas: make(map[string]*replica)}
	x.holders.init(minCap)
	x.spec = specState{holders: make(map[uint64][]uint16), dropped: make(map[string]uint64),
		ttl: min(max(defaultSpecTTLInitial, cfg.SpecTTLMin), cfg.SpecTTLMax)}
	x.m = newMetrics(x, reg)
	return x, nil
}

// ApplyNode applies the KV part of one accepted ephemeral update from node.
// A full update replaces everything the index holds from that node, so a
// replica absent from it is dropped (its blocks are unknown, not kept);
// removed lists replicas the agent no longer runs. It returns the outcome of
// each entry of kv, in order, for the caller's metrics.
func (x *Index) ApplyNode(node string, full bool, kv []*llmgwv1.KVBlocks, removed []string) []error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if full {
		keep := make(map[string]bool, len(kv))
		for _, u := range kv {
			keep[u.GetReplicaId()] = true
		}
		for id, r := range x.replicas {
			if r.Node == node && !keep[id] {
				x.dropLocked(r)
			}
		}
	}
	for _, id := range removed {
		if r := x.replicas[id]; r != nil {
			x.dropLocked(r)
		}
	}
	errs := make([]error, len(kv))
	for i, u := range kv {
		errs[i] = x.applyLocked(node, u)
		x.m.update(errs[i])
	}
	return errs
}

// Apply applies one replica's update (see ApplyNode).
func (x *Index) Apply(node string, u *llmgwv1.KVBlocks) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	err := x.applyLocked(node, u)
	x.m.update(err)
	return err
}

func (x *Index) applyLocked(node string, u *llmgwv1.KVBlocks) error {
	id := u.GetReplicaId()
	if id == "" {
		return ErrNoReplica
	}
	want := Replica{ID: id, UID: u.GetUid(), Incarnation: u.GetIncarnation()}
	r := x.replicas[id]
	if r != nil && r.Replica != want {
		if want.UID < r.UID || (r.UID == want.UID && r.Incarnation > want.Incarnation) {
			return fmt.Errorf("%w: replica %s incarnation %d, holding %d", ErrStale, id, want.Incarnation, r.Incarnation)
		}
		if !u.GetReset_() {
			// A new placement or incarnation starts with a reset; a delta for
			// it means the reset was lost, and the old set is wrong anyway.
			x.dropLocked(r)
			return fmt.Errorf("%w: replica %s uid %d incarnation %d", ErrUnknown, id, want.UID, want.Incarnation)
		}
		x.dropLocked(r)
		r = nil
	}
	if r == nil {
		if !u.GetReset_() {
			return fmt.Errorf("%w: replica %s uid %d incarnation %d", ErrUnknown, id, want.UID, want.Incarnation)
		}
		if r = x.addLocked(want); r == nil {
			return fmt.Errorf("%w: replica %s", ErrFull, id)
		}
	}
	r.Node = node
	r.Untrusted = u.GetUntrusted()
	if r.Untrusted {
		x.clearPendingLocked(r, DropUntrusted)
	}
	if bs := u.GetBlockSize(); bs != 0 {
		r.BlockSize = bs
	}
	if u.GetReset_() {
		x.clearLocked(r)
	}
	for _, h := range u.GetRemoved() {
		x.removeLocked(r, h)
	}
	for _, h := range u.GetStored() {
		x.storeLocked(r, h)
	}
	for _, t := range []struct {
		stored, removed []uint64
		bit             uint8
	}{{u.GetStoredCpu(), u.GetRemovedCpu(), offCPU}, {u.GetStoredStorage(), u.GetRemovedStorage(), offStorage}} {
		for _, h := range t.removed {
			x.removeOffLocked(r, h, t.bit)
		}
		for _, h := range t.stored {
			x.storeOffLocked(r, h, t.bit)
		}
	}
	r.Blocks = r.blocks.Len()
	r.Offloaded = len(r.off)
	return nil
}

func (x *Index) addLocked(id Replica) *replica {
	r := &replica{Status: Status{Replica: id}}
	if n := len(x.free); n > 0 {
		r.slot = x.free[n-1]
		x.free = x.free[:n-1]
		x.slots[r.slot] = r
	} else if len(x.slots) < MaxReplicas {
		r.slot = uint16(len(x.slots))
		x.slots = append(x.slots, r)
	} else {
		return nil
	}
	x.replicas[id.ID] = r
	return r
}

func (x *Index) storeLocked(r *replica, h uint64) {
	x.confirmLocked(r, h)
	if x.entries >= x.cfg.MaxEntries {
		if !r.blocks.has(h) {
			x.dropped++
		}
		return
	}
	if !r.blocks.add(h) {
		return
	}
	if offOf(r, h) == 0 {
		x.addHolderLocked(h, r.slot) // not held in any tier before
	} else {
		x.setHolderLocked(h, r.slot) // its tier rises to the GPU
	}
	x.entries++
}

// addHolderLocked adds holder v (a slot and its tier tag) to h's holders,
// which do not list its slot.
func (x *Index) addHolderLocked(h uint64, v uint16) {
	hs := x.holders.slot(h)
	switch {
	case hs.n == spilled:
		at := hs.spillAt()
		x.spill[at] = append(x.spill[at], v)
	case hs.n == inlineHolders:
		sp := append(append(make([]uint16, 0, 2*inlineHolders), hs.ids[:]...), v)
		var at uint32
		if n := len(x.spillFree); n > 0 {
			at = x.spillFree[n-1]
			x.spillFree = x.spillFree[:n-1]
			x.spill[at] = sp
		} else {
			at = uint32(len(x.spill))
			x.spill = append(x.spill, sp)
		}
		hs.ids[0], hs.ids[1] = uint16(at), uint16(at>>16)
		hs.n = spilled
	default:
		hs.ids[hs.n] = v
		hs.n++
	}
}

// setHolderLocked makes v's slot's holder in h's holders v (its tier
// changed), adding it when absent.
func (x *Index) setHolderLocked(h uint64, v uint16) {
	if at := x.holders.find(h); at >= 0 {
		hs := &x.holders.slots[at].holders
		ids := hs.ids[:min(hs.n, inlineHolders)]
		if hs.n == spilled {
			ids = x.spill[hs.spillAt()]
		}
		if i := holderIndex(ids, v&slotMask); i >= 0 {
			ids[i] = v
			return
		}
	}
	x.addHolderLocked(h, v)
}

// holderIndex returns the index of slot's holder in hs, or -1.
func holderIndex(hs []uint16, slot uint16) int {
	for i, v := range hs {
		if v&slotMask == slot {
			return i
		}
	}
	return -1
}

func (x *Index) removeLocked(r *replica, h uint64) {
	x.removedLocked(r, h)
	if !r.blocks.remove(h) {
		return
	}
	if off := offOf(r, h); off != 0 {
		x.setHolderLocked(h, r.slot|offTag(off)) // still offloaded
	} else {
		x.unholdLocked(r.slot, h)
	}
	x.entries--
}

// unholdLocked takes slot's holder, whatever its tier, out of h's holders,
// dropping the hash when none are left so the table shrinks with the
// fleet's caches.
func (x *Index) unholdLocked(slot uint16, h uint64) {
	at := x.holders.find(h)
	if at < 0 {
		return
	}
	hs := &x.holders.slots[at].holders
	if hs.n == spilled {
		at := hs.spillAt()
		sp := x.spill[at]
		i := holderIndex(sp, slot)
		if i < 0 {
			return
		}
		sp = slices.Delete(sp, i, i+1)
		if len(sp) > inlineHolders {
			x.spill[at] = sp
			return
		}
		x.spill[at] = nil
		x.spillFree = append(x.spillFree, at)
		hs.n = uint16(copy(hs.ids[:], sp))
		return
	}
	i := holderIndex(hs.ids[:hs.n], slot)
	if i < 0 {
		return
	}
	copy(hs.ids[i:hs.n], hs.ids[i+1:hs.n])
	hs.n--
	if hs.n == 0 {
		x.holders.del(at)
	}
}

// holdersOf returns the holders of h in any tier (tagged slots, tiers.go);
// the slice may alias hs or spill and is valid until the next change.
func (x *Index) holdersOf(h uint64, hs *holders) []uint16 {
	*hs = x.holders.get(h)
	if hs.n == spilled {
		return x.spill[hs.spillAt()]
	}
	return hs.ids[:hs.n]
}

func (x *Index) clearLocked(r *replica) {
	x.clearPendingLocked(r, DropReset)
	r.blocks.each(func(h uint64) { x.unholdLocked(r.slot, h) })
	x.entries -= r.blocks.Len()
	x.clearOffLocked(r) // a reset resets every tier
	// A fresh set rather than emptying it in place: it would keep its peak
	// size, and a reset is when an engine's set is likely to have shrunk.
	r.blocks = hashSet{}
	r.Blocks = 0
}

func (x *Index) dropLocked(r *replica) {
	x.clearLocked(r)
	r.gone = true
	delete(x.replicas, r.ID)
	x.slots[r.slot] = nil
	x.free = append(x.free, r.slot)
}

// Retain drops every replica keep rejects: those that left desired state or
// were placed anew. Call it when the routing table changes.
func (x *Index) Retain(keep func(Replica) bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, r := range x.replicas {
		if !keep(r.Replica) {
			x.dropLocked(r)
		}
	}
}

// Lookup appends to dst, for every replica holding the first of hashes,
// how many of hashes' leading blocks it holds — counting stops at a
// replica's first missing block. Replicas holding none are not listed.
// hashes are a prompt's block hashes in order (the low 64 bits of vLLM's,
// as KVBlocks carries them).
func (x *Index) Lookup(hashes []uint64, dst []Match) []Match { return x.lookup(hashes, dst, false) }

// lookup is Lookup, or with pending LookupPending, timed.
func (x *Index) lookup(hashes []uint64, dst []Match, pending bool) []Match {
	if len(hashes) == 0 {
		return dst
	}
	start := time.Now()
	x.mu.RLock()
	defer func() {
		x.mu.RUnlock()
		x.m.lookup.Observe(time.Since(start).Seconds())
	}()
	if pending && x.spec.n > 0 {
		return x.lookupPendingLocked(hashes, dst)
	}
	return x.lookupLocked(hashes, dst)
}

// lookupLocked is Lookup under the read lock.
func (x *Index) lookupLocked(hashes []uint64, dst []Match) []Match {
	// The replicas still matching: the holders of block 0, narrowed block
	// by block until none is left, so the walk costs one probe per block
	// up to the longest match (design §7.5: leading blocks only).
	var buf [16]uint16
	var hv holders
	alive := appendGPU(buf[:0], x.holdersOf(hashes[0], &hv))
	t := &x.holders
	mask := len(t.slots) - 1
	for i := 1; i < len(hashes) && len(alive) > 0; i++ {
		// The probe inline: the loop stays small enough for the CPU to
		// run ahead into the next blocks' cache misses.
		h := hashes[i]
		var hs []uint16
		for j := int(mix(h, t.shift)); ; j = (j + 1) & mask {
			s := &t.slots[j]
			if s.n == 0 {
				break
			}
			if s.key == h {
				if s.n == spilled {
					hs = x.spill[s.spillAt()]
				} else {
					hs = s.ids[:s.n]
				}
				break
			}
		}
		k := 0
		for _, s := range alive {
			// A bare slot is a GPU holder: an offloaded one's tag
			// never equals it.
			if slices.Contains(hs, s) {
				alive[k] = s
				k++
			} else {
				dst = x.appendMatch(dst, s, i, 0)
			}
		}
		alive = alive[:k]
	}
	for _, s := range alive {
		dst = x.appendMatch(dst, s, len(hashes), 0)
	}
	return dst
}

// appendGPU appends the slots of hs's GPU holders (the untagged ones).
func appendGPU(dst, hs []uint16) []uint16 {
	for _, v := range hs {
		if v <= slotMask {
			dst = append(dst, v)
		}
	}
	return dst
}

func (x *Index) appendMatch(dst []Match, slot uint16, n, pending int) []Match {
	r := x.slots[slot]
	return append(dst, Match{Replica: r.Replica, Blocks: n, Untrusted: r.Untrusted, Pending: pending})
}

// Status returns what the index holds for replica id; false when it has
// heard nothing of it (no data yet).
func (x *Index) Status(id string) (Status, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	r := x.replicas[id]
	if r == nil {
		return Status{}, false
	}
	return r.Status, true
}

// Blocks returns replica id's status and its block hashes, sorted; for
// debugging and the exactness tests.
func (x *Index) Blocks(id string) (Status, []uint64, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	r := x.replicas[id]
	if r == nil {
		return Status{}, nil, false
	}
	out := make([]uint64, 0, r.blocks.Len())
	r.blocks.each(func(h uint64) { out = append(out, h) })
	slices.Sort(out)
	return r.Status, out, true
}

// Replicas returns the status of every replica held, sorted by id.
func (x *Index) Replicas() []Status {
	x.mu.RLock()
	defer x.mu.RUnlock()
	out := make([]Status, 0, len(x.replicas))
	for _, r := range x.replicas {
		out = append(out, r.Status)
	}
	slices.SortFunc(out, func(a, b Status) int {
		if a.ID < b.ID {
			return -1
		} else if a.ID > b.ID {
			return 1
		}
		return 0
	})
	return out
}

// Size is the index's size: distinct block hashes in any tier, (block,
// replica) entries of every tier (an offloaded block counts once however
// many offload tiers hold it), replicas, and stores dropped at MaxEntries
// since the start.
type Size struct {
	Blocks, Entries, Replicas int
	Dropped                   uint64
}

// Size reports the index's size.
func (x *Index) Size() Size {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return Size{Blocks: x.holders.n, Entries: x.entries, Replicas: len(x.replicas), Dropped: x.dropped}
}
