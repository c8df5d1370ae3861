package kvindex

import (
	"fmt"
	"maps"
	"slices"
	"time"
)

// Speculative entries (design §7.5 step 6): the router's own sends,
// recorded as *pending* on the replica it sent to until the engine's events
// confirm them. Why: the index hears of a stored block only after the
// engine prefilled it, the agent's next batch carried it and the control
// plane passed it on — hundreds of milliseconds in which every request with
// the same prefix would otherwise be told that nobody holds it. A pending
// block counts as held by LookupPending, mixed with confirmed ones under
// the same leading-blocks rule.
//
// Lifecycle of a pending (block, replica) entry:
//
//   - recorded by Speculate, when the router sends an attempt; a block the
//     replica is already known to hold is not recorded, nor one pending
//     already (the oldest send is the one whose confirmation is awaited);
//   - confirmed by a store event for that hash on that replica: it moves to
//     the confirmed set, and the time since it was recorded is a lag sample;
//   - dropped by a removal event for that hash on that replica. vLLM emits
//     BlockRemoved only for a block it stored, so the engine did store it
//     (the store may have been netted out of the agent's batch, or carried
//     in a batch the index took as the base) and has evicted it since:
//     either way it is not held now;
//   - dropped when the replica is reset, turns untrusted or leaves the index
//     (its blocks are not known, so neither are the router's guesses about
//     them), and when the router withdraws it (the attempt failed);
//   - expired by the TTL, which adapts to the measured lag: twice the p99 of
//     the last lagSamples lags, within [SpecTTLMin, SpecTTLMax];
//   - at the bounds (per replica, overall) the oldest entry goes first.
//
// The confirmed set (Blocks, /debug/kvindex) never holds pending entries:
// exactness against the engines' caches is about what they reported.

// Speculation outcomes, as counted in
// llmgw_router_kvindex_speculative_dropped_total{reason}.
const (
	DropRemoved   = "removed"   // a removal event for the hash
	DropReset     = "reset"     // the replica was reset or left the index
	DropUntrusted = "untrusted" // the replica turned untrusted
	DropFull      = "full"      // a pending bound was reached; the oldest went
	DropWithdrawn = "withdrawn" // the router withdrew it: the attempt failed
)

// lagSamples is how many recent confirmation lags the TTL is computed
// from, and ttlEvery how often (in confirmations) it is recomputed.
const (
	lagSamples = 256
	ttlEvery   = 32
	// ttlLagFactor times the p99 lag is the TTL: the lag's tail moves
	// with load, and an entry expired a little late costs one doubtful
	// preference, one expired early the hit it was made for.
	ttlLagFactor = 2
)

// specDefaults are the bounds DefaultConfig sets, and New takes for a
// zero field.
const (
	defaultSpecTTLMin     = 500 * time.Millisecond
	defaultSpecTTLMax     = 10 * time.Second
	defaultSpecTTLInitial = 2 * time.Second
	defaultSpecPending    = 1 << 20
	defaultSpecPerReplica = 1 << 16
)

// validateSpec checks the speculation keys; zero takes the default.
func (c Config) validateSpec() error {
	switch {
	case c.SpecTTLMin < 0:
		return fmt.Errorf("kv_speculation_ttl_min: must not be negative, got %s", c.SpecTTLMin)
	case c.SpecTTLMax < 0:
		return fmt.Errorf("kv_speculation_ttl_max: must not be negative, got %s", c.SpecTTLMax)
	case c.SpecTTLMin > 0 && c.SpecTTLMax > 0 && c.SpecTTLMin > c.SpecTTLMax:
		return fmt.Errorf("kv_speculation_ttl_min: %s is above kv_speculation_ttl_max %s", c.SpecTTLMin, c.SpecTTLMax)
	case c.SpecPending < 0:
		return fmt.Errorf("kv_speculation_max_pending: must not be negative, got %d", c.SpecPending)
	case c.SpecPendingPerReplica < 0:
		return fmt.Errorf("kv_speculation_max_pending_per_replica: must not be negative, got %d", c.SpecPendingPerReplica)
	}
	return nil
}

func (c *Config) fillSpec() {
	if c.SpecTTLMax == 0 {
		c.SpecTTLMax = max(defaultSpecTTLMax, c.SpecTTLMin)
	}
	if c.SpecTTLMin == 0 {
		c.SpecTTLMin = min(defaultSpecTTLMin, c.SpecTTLMax)
	}
	if c.SpecPending == 0 {
		c.SpecPending = defaultSpecPending
	}
	if c.SpecPendingPerReplica == 0 {
		c.SpecPendingPerReplica = defaultSpecPerReplica
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// pendEntry is one pending (block, replica) entry in a FIFO: t is its
// recording time, unique within the index, so an entry confirmed, dropped
// or recorded anew since is told from the one queued by comparing it.
type pendEntry struct {
	r *replica
	h uint64
	t int64
}

// fifo is a queue of pending entries, oldest first. Entries no longer
// pending stay until they reach the front or the queue is compacted.
type fifo struct {
	q    []pendEntry
	head int
}

func (f *fifo) push(e pendEntry)  { f.q = append(f.q, e) }
func (f *fifo) len() int          { return len(f.q) - f.head }
func (f *fifo) front() *pendEntry { return &f.q[f.head] }

func (f *fifo) pop() {
	f.q[f.head] = pendEntry{}
	f.head++
	if f.head == len(f.q) {
		f.q, f.head = f.q[:0], 0
	}
}

// compact keeps the entries still pending, once stale ones are most of the
// queue, so its memory follows the pending count rather than the sends.
func (f *fifo) compact(live int) {
	if f.len() <= 2*live+64 {
		return
	}
	q := make([]pendEntry, 0, 2*live+8)
	for _, e := range f.q[f.head:] {
		if e.valid() {
			q = append(q, e)
		}
	}
	f.q, f.head = q, 0
}

func (e *pendEntry) valid() bool {
	t, ok := e.r.pending[e.h]
	return ok && t == e.t && !e.r.gone
}

// specState is the index's speculation state, guarded by Index.mu.
type specState struct {
	// holders maps a pending hash to the slots it is pending on.
	holders map[uint64][]uint16
	queue   fifo // every pending entry, oldest first
	n       int  // pending entries
	last    int64
	ttl     time.Duration

	lags  [lagSamples]time.Duration
	nLags int

	recorded, confirmed, expired uint64
	dropped                      map[string]uint64
}

// SpecStats is the speculation state's size and counters, for metrics.
type SpecStats struct {
	Pending                      int
	TTL                          time.Duration
	Recorded, Confirmed, Expired uint64
	Dropped                      map[string]uint64
}

// Speculate records hashes as pending on replica rep — the incarnation the
// router sends to — and returns how many it recorded. Blocks the replica
// already holds, or has pending, are skipped; a replica the index holds
// no base for, another incarnation of, or that is untrusted gets none.
func (x *Index) Speculate(rep Replica, hashes []uint64) int {
	if len(hashes) == 0 {
		return 0
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	r := x.replicas[rep.ID]
	if r == nil || r.Replica != rep || r.Untrusted {
		return 0
	}
	now := x.cfg.Now().UnixNano()
	x.expireLocked(now)
	n := 0
	for _, h := range hashes {
		if r.blocks.has(h) {
			continue
		}
		if _, ok := r.pending[h]; ok {
			continue
		}
		for len(r.pending) >= x.cfg.SpecPendingPerReplica && r.queue.len() > 0 {
			x.popOldestLocked(&r.queue)
		}
		for x.spec.n >= x.cfg.SpecPending && x.spec.queue.len() > 0 {
			x.popOldestLocked(&x.spec.queue)
		}
		t := max(now, x.spec.last+1)
		x.spec.last = t
		if r.pending == nil {
			r.pending = make(map[uint64]int64)
		}
		r.pending[h] = t
		x.spec.holders[h] = append(x.spec.holders[h], r.slot)
		e := pendEntry{r: r, h: h, t: t}
		r.queue.push(e)
		x.spec.queue.push(e)
		x.spec.n++
		n++
	}
	r.queue.compact(len(r.pending))
	x.spec.queue.compact(x.spec.n)
	x.spec.recorded += uint64(n)
	return n
}

// Withdraw drops rep's pending entries for hashes: the attempt they were
// recorded for failed. An entry another send recorded for the same block
// goes too, which costs at most a missed preference.
func (x *Index) Withdraw(rep Replica, hashes []uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	r := x.replicas[rep.ID]
	if r == nil || r.Replica != rep || len(r.pending) == 0 {
		return
	}
	for _, h := range hashes {
		if _, ok := r.pending[h]; ok {
			x.unpendLocked(r, h)
			x.spec.dropped[DropWithdrawn]++
		}
	}
}

// Expire drops the entries past the TTL now. Lookups ignore them anyway;
// this frees them and keeps the pending gauge true between sends (the
// router calls it every second).
func (x *Index) Expire() {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.expireLocked(x.cfg.Now().UnixNano())
}

func (x *Index) expireLocked(now int64) {
	q := &x.spec.queue
	for q.len() > 0 {
		e := q.front()
		if e.valid() {
			if e.t+int64(x.spec.ttl) > now {
				return
			}
			x.unpendLocked(e.r, e.h)
			x.spec.expired++
		}
		q.pop()
	}
}

// popOldestLocked drops the oldest entry still pending in q (a bound was
// reached).
func (x *Index) popOldestLocked(q *fifo) {
	for q.len() > 0 {
		e := *q.front()
		q.pop()
		if e.valid() {
			x.unpendLocked(e.r, e.h)
			x.spec.dropped[DropFull]++
			return
		}
	}
}

// unpendLocked removes h from r's pending entries.
func (x *Index) unpendLocked(r *replica, h uint64) {
	delete(r.pending, h)
	x.spec.n--
	x.unholdPendingLocked(r.slot, h)
}

// unholdPendingLocked takes slot out of h's pending holders.
func (x *Index) unholdPendingLocked(slot uint16, h uint64) {
	hs := x.spec.holders[h]
	if i := slices.Index(hs, slot); i >= 0 {
		hs[i] = hs[len(hs)-1]
		hs = hs[:len(hs)-1]
	}
	if len(hs) == 0 {
		delete(x.spec.holders, h)
	} else {
		x.spec.holders[h] = hs
	}
}

// confirmLocked is a store event's part in speculation: a pending h on r
// is confirmed, and its lag sampled.
func (x *Index) confirmLocked(r *replica, h uint64) {
	t, ok := r.pending[h]
	if !ok {
		return
	}
	x.unpendLocked(r, h)
	x.spec.confirmed++
	lag := time.Duration(x.cfg.Now().UnixNano() - t)
	x.m.specLag.Observe(lag.Seconds())
	x.spec.lags[x.spec.nLags%lagSamples] = lag
	x.spec.nLags++
	if x.spec.nLags%ttlEvery == 0 {
		x.spec.ttl = x.ttlFor(x.spec.lags[:min(x.spec.nLags, lagSamples)])
	}
}

// ttlFor is the TTL for lag samples: ttlLagFactor × their p99, clamped.
func (x *Index) ttlFor(lags []time.Duration) time.Duration {
	s := slices.Clone(lags)
	slices.Sort(s)
	p99 := s[min(len(s)*99/100, len(s)-1)]
	return min(max(ttlLagFactor*p99, x.cfg.SpecTTLMin), x.cfg.SpecTTLMax)
}

// removedLocked is a removal event's part: a pending h on r is dropped.
func (x *Index) removedLocked(r *replica, h uint64) {
	if _, ok := r.pending[h]; ok {
		x.unpendLocked(r, h)
		x.spec.dropped[DropRemoved]++
	}
}

// clearPendingLocked drops all of r's pending entries.
func (x *Index) clearPendingLocked(r *replica, reason string) {
	if len(r.pending) == 0 {
		return
	}
	for h := range r.pending {
		x.unholdPendingLocked(r.slot, h)
	}
	x.spec.n -= len(r.pending)
	x.spec.dropped[reason] += uint64(len(r.pending))
	r.pending = nil
	r.queue = fifo{}
}

// livePending reports whether h is pending on slot s and within the TTL.
func (x *Index) livePending(s uint16, h uint64, now int64) bool {
	t, ok := x.slots[s].pending[h]
	return ok && t+int64(x.spec.ttl) > now
}

// LookupPending is Lookup counting this router's pending entries as held,
// under the same leading-blocks rule: a replica's match runs while each
// block is held or pending there. Match.Pending says how many of its
// blocks were pending.
func (x *Index) LookupPending(hashes []uint64, dst []Match) []Match {
	return x.lookup(hashes, dst, true)
}

// lookupPendingLocked is LookupPending under the read lock.
func (x *Index) lookupPendingLocked(hashes []uint64, dst []Match) []Match {
	now := x.cfg.Now().UnixNano()
	type cand struct {
		slot uint16
		pend int
	}
	var buf [16]cand
	var hv holders
	alive := buf[:0]
	h0 := hashes[0]
	for _, s := range x.holdersOf(h0, &hv) {
		if s <= slotMask { // on the GPU
			alive = append(alive, cand{slot: s})
		}
	}
	for _, s := range x.spec.holders[h0] {
		if x.livePending(s, h0, now) {
			alive = append(alive, cand{slot: s, pend: 1})
		}
	}
	for i := 1; i < len(hashes) && len(alive) > 0; i++ {
		h := hashes[i]
		hs := x.holdersOf(h, &hv)
		// The pending holders are looked up only for a replica the
		// confirmed ones do not cover: most blocks of most prompts.
		var ps []uint16
		probed := false
		k := 0
		for _, c := range alive {
			if !slices.Contains(hs, c.slot) && !probed {
				ps, probed = x.spec.holders[h], true
			}
			switch {
			case slices.Contains(hs, c.slot):
			case slices.Contains(ps, c.slot) && x.livePending(c.slot, h, now):
				c.pend++
			default:
				dst = x.appendMatch(dst, c.slot, i, c.pend)
				continue
			}
			alive[k] = c
			k++
		}
		alive = alive[:k]
	}
	for _, c := range alive {
		dst = x.appendMatch(dst, c.slot, len(hashes), c.pend)
	}
	return dst
}

// SpecStats reports the speculation state.
func (x *Index) SpecStats() SpecStats {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return SpecStats{Pending: x.spec.n, TTL: x.spec.ttl, Recorded: x.spec.recorded, Confirmed: x.spec.confirmed,
		Expired: x.spec.expired, Dropped: maps.Clone(x.spec.dropped)}
}
