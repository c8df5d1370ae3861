package scheduler

import (
	"maps"
	"math"
	"sync"
	"time"

	"github.com/llmgw/llmgw/internal/configfile"
)

// KVPressure is tier 2's cache-pressure rule (design §7.5 step 6, "Cache
// pressure"): the KV affinity filter sends a hit to the replica that holds
// the longest match, which is right while that replica's cache has room
// for what the request adds, and wrong once it has not — the blocks the
// request adds then evict other conversations' contexts, which those
// conversations recompute on their next turn. Two parts:
//
//   - EvictionWeight prices the evictions. Among the candidates the filter
//     keeps the one with the least prefill plus EvictionWeight × the blocks
//     it would evict (held + new − the engine's num_gpu_blocks), the
//     longest match winning ties — so while no cache is full the choice is
//     the longest match, as before. A session whose last prompt its replica
//     still holds stays there regardless. 0 (the default) turns it off.
//   - SessionReserveTokens plans room for conversations. A session this
//     router has not seen yet (session: new) matches only what other
//     requests left — a shared system prompt — yet will grow on whichever
//     replica it lands: agents' sessions grow every turn. Each live
//     session counts for the larger of its prompt and this reserve on its
//     replica, and a new session goes to the longest match only while the
//     sessions planned there, plus this one, fit SessionFill × the
//     replica's cache; else to the cheapest replica where it fits; else to
//     the one with the most room planned. 0 turns it off.
//
// Both need the engines' cache sizes (the agents report num_gpu_blocks);
// a replica without one switches the rule off for the request.
type KVPressure struct {
	EvictionWeight       float64 `yaml:"scheduler_kv_eviction_weight"`
	SessionReserveTokens int     `yaml:"scheduler_kv_session_reserve_tokens"`
	SessionFill          float64 `yaml:"scheduler_kv_session_fill"`
}

// DefaultKVPressure plans 4,096 tokens per live session (a coding agent's
// session passes that within a few dozen turns; issue 31's bench grows
// from ~1,100 to ~4,200) and lets sessions be planned into 90 % of a
// cache, the rest for the shared prefixes and the blocks of answers being
// decoded. The eviction part is off: on the agent bench it acted 3 times
// in 6 runs for no measurable gain, and on issue 14's shared-prefix bench
// it moves requests whose group's prompt their home partly evicted,
// leaving a second copy that evicts another group elsewhere — the churn
// KVAffinity exists to stop — with a reading within main's own spread
// (docs/benchmarks.md "Cache pressure in the router").
func DefaultKVPressure() KVPressure {
	return KVPressure{EvictionWeight: 0, SessionReserveTokens: 4096, SessionFill: 0.9}
}

// Validate reports every bad field, each named by its configuration key.
func (k KVPressure) Validate() error {
	var p configfile.Problems
	if !(k.EvictionWeight >= 0) || math.IsInf(k.EvictionWeight, 0) {
		p.Add("scheduler_kv_eviction_weight", "must be a finite number >= 0, got %v", k.EvictionWeight)
	}
	if k.SessionReserveTokens < 0 {
		p.Add("scheduler_kv_session_reserve_tokens", "must be at least 0, got %d", k.SessionReserveTokens)
	}
	if !(k.SessionFill > 0 && k.SessionFill <= 1) {
		p.Add("scheduler_kv_session_fill", "must be in (0, 1], got %v", k.SessionFill)
	}
	return p.Err()
}

// Cache-pressure decisions, as counted in
// llmgw_router_kv_pressure_decisions_total{decision}.
const (
	// PressureKept: the rule ran and kept the longest match.
	PressureKept = "kept"
	// PressureEvictions: the longest match would have evicted more than
	// another replica's extra prefill; sent there instead.
	PressureEvictions = "evictions"
	// PressureSessionPlaced: a new session did not fit the longest match's
	// cache; sent where it fits.
	PressureSessionPlaced = "session_placed"
	// PressureSessionOverfull: a new session fit no cache; sent where the
	// most room is planned.
	PressureSessionOverfull = "session_overfull"
)

// footprintWindow is how long a session counts as living on the replica
// it was last sent to: longer than an agent's gaps between turns (tool
// calls, a user reading), short enough that a finished conversation stops
// reserving room within minutes.
const footprintWindow = 2 * time.Minute

// footprintFresh is how long after a send the index may not yet show the
// prompt's blocks: the agent's flush (250 ms), the prefill, and margin.
// Older footprints are checked against the index (footprints.planned).
const footprintFresh = 2 * time.Second

// maxFootprints bounds the record (some 100 bytes an entry).
const maxFootprints = 64 << 10

// footprints is where this router last sent each session, the blocks of
// its prompt then, and the blocks planned for it there (the larger of its
// prompt and the reserve): the room its replica's live sessions are
// expected to need. Safe for concurrent use.
type footprints struct {
	now func() time.Time

	mu sync.Mutex
	m  map[uint64]footprint
	// per sums m by replica, kept with m.
	per map[Key]blockSums
	// recent lists the sets of the last footprintFresh, oldest first (a
	// session set twice appears twice; only its current entry counts).
	recent    []recentSet
	lastPrune time.Time
}

type footprint struct {
	k       Key
	planned int // blocks planned: max(reserve, prompt)
	prompt  int // the prompt's blocks at the last send
	at      time.Time
}

type blockSums struct{ planned, prompt int }

type recentSet struct {
	session uint64
	at      time.Time
}

func newFootprints(now func() time.Time) *footprints {
	return &footprints{now: now, m: map[uint64]footprint{}, per: map[Key]blockSums{}}
}

// set records session as living on k now, its prompt prompt blocks long,
// with planned blocks planned.
func (f *footprints) set(session uint64, k Key, planned, prompt int) {
	now := f.now()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pruneLocked(now)
	old, ok := f.m[session]
	if !ok && len(f.m) >= maxFootprints {
		return
	}
	if ok {
		f.dropLocked(old)
	}
	e := footprint{k, planned, prompt, now}
	f.m[session] = e
	f.addLocked(e)
	f.recent = append(f.recent, recentSet{session, now})
}

// planned returns the blocks planned for the live sessions of each
// replica, not counting session itself. A footprint older than
// footprintFresh should by now show in the index, so the room planned for
// those of a replica is at most what its cache holds (held, by the index)
// plus their expected growth (planned − prompt): a cache that was reset,
// or whose sessions' contexts were evicted, does not keep reserving room
// for conversations that are no longer in it. Fresh footprints count in
// full — the burst of new sessions the index has not heard of yet.
func (f *footprints) planned(session uint64, held map[string]int) map[Key]int {
	now := f.now()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pruneLocked(now)
	// The fresh part of each replica's sums; session itself left out of
	// both.
	fresh := map[Key]blockSums{}
	counted := map[uint64]bool{session: true}
	for _, rs := range f.recent {
		e, ok := f.m[rs.session]
		if !ok || !e.at.Equal(rs.at) || counted[rs.session] {
			continue
		}
		counted[rs.session] = true
		fresh[e.k] = fresh[e.k].add(e, 1)
	}
	all := maps.Clone(f.per)
	if e, ok := f.m[session]; ok {
		all[e.k] = all[e.k].add(e, -1)
	}
	out := make(map[Key]int, len(all))
	for k, a := range all {
		fs := fresh[k]
		oldPlanned, oldPrompt := a.planned-fs.planned, a.prompt-fs.prompt
		if h, ok := held[k.ID]; ok {
			oldPlanned = min(oldPlanned, h+oldPlanned-oldPrompt)
		}
		out[k] = oldPlanned + fs.planned
	}
	return out
}

// cached reports whether session was last sent to k and k still holds
// its prompt of then — all of its full blocks but the last, which the
// prompt's end may have left partial and so unhashed — by matched, the
// leading blocks k holds of its new prompt.
func (f *footprints) cached(session uint64, k Key, matched int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.m[session]
	return ok && e.k == k && matched >= e.prompt-1
}

func (b blockSums) add(e footprint, sign int) blockSums {
	return blockSums{b.planned + sign*e.planned, b.prompt + sign*e.prompt}
}

func (f *footprints) addLocked(e footprint) { f.per[e.k] = f.per[e.k].add(e, 1) }

func (f *footprints) dropLocked(e footprint) {
	s := f.per[e.k].add(e, -1)
	if s.planned <= 0 {
		delete(f.per, e.k)
		return
	}
	f.per[e.k] = s
}

// pruneLocked drops the recent sets past footprintFresh, and entries past
// the window at most every tenth of it.
func (f *footprints) pruneLocked(now time.Time) {
	i := 0
	for i < len(f.recent) && now.Sub(f.recent[i].at) >= footprintFresh {
		i++
	}
	if i > 0 {
		f.recent = append(f.recent[:0], f.recent[i:]...)
	}
	if now.Sub(f.lastPrune) < footprintWindow/10 {
		return
	}
	f.lastPrune = now
	old := now.Add(-footprintWindow)
	for s, e := range f.m {
		if !e.at.After(old) {
			delete(f.m, s)
			f.dropLocked(e)
		}
	}
}

// retain forgets the sessions on replicas keep rejects.
func (f *footprints) retain(keep func(Key) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for s, e := range f.m {
		if !keep(e.k) {
			delete(f.m, s)
			f.dropLocked(e)
		}
	}
}

// reserveBlocks is the reserve in q's blocks, rounded up; 0 when off.
func (k KVPressure) reserveBlocks(q *KVQuery) int {
	bs := max(q.BlockSize, 1)
	return (k.SessionReserveTokens + bs - 1) / bs
}

// plannedBlocks is what a session whose prompt is q counts for.
func (k KVPressure) plannedBlocks(q *KVQuery) int {
	if k.SessionReserveTokens <= 0 {
		return 0
	}
	return max(k.reserveBlocks(q), q.Total)
}

// capacities returns each candidate's cache size in blocks, or nil when
// some cool candidate's is unknown (the rule is off for the request).
func capacities(q *KVQuery, hot []bool, in []Candidate) []int {
	out := make([]int, len(in))
	for i := range in {
		if hot != nil && hot[i] {
			continue
		}
		c := q.Capacity[in[i].Key.ID]
		if c <= 0 {
			return nil
		}
		out[i] = c
	}
	return out
}

// evictionCost is the prefill a request costs on candidate i — the
// prompt's blocks it does not hold — plus w × the blocks adding them
// would evict there: what the cache would hold past its size.
func evictionCost(q *KVQuery, id string, capacity int, w float64) float64 {
	matched := min(q.Matched[id], q.Total)
	added := q.Total - matched
	evicted := max(q.Held[id]+added-capacity, 0)
	return float64(added) + w*float64(min(evicted, added))
}

// pressureChoice returns the candidate to keep instead of primary j, or j:
// for a new session, the session rule; otherwise the eviction rule. It
// records a new session's footprint at once, so the requests of a burst
// that follow see it before any is accepted.
func (f kvAffinity) pressureChoice(r *Request, q *KVQuery, hot []bool, in []Candidate, j int) int {
	if f.s == nil {
		return j
	}
	kp := f.s.cfg.KVPressure
	caps := capacities(q, hot, in)
	if caps == nil {
		return j
	}
	if r.Session != "" && kp.SessionReserveTokens > 0 {
		h := sessionHash(r.Session)
		if k, depth := f.s.sessions.Match([]uint64{h}, nil); depth == 0 || indexOf(in, k) < 0 {
			c := f.placeSession(q, hot, in, caps, j, h)
			f.s.footprints.set(h, in[c].Key, kp.plannedBlocks(q), q.Total)
			return c
		}
	}
	if kp.EvictionWeight <= 0 {
		return j
	}
	if r.Session != "" && f.s.footprints.cached(sessionHash(r.Session), in[j].Key, min(q.Matched[in[j].Key.ID], q.Total)) {
		// Session affinity is not broken while the session's context is
		// cached where it lives.
		f.s.m.pressure.WithLabelValues(PressureKept).Inc()
		return j
	}
	best, bestCost := j, evictionCost(q, in[j].Key.ID, caps[j], kp.EvictionWeight)
	for i := range in {
		if i == j || (hot != nil && hot[i]) {
			continue
		}
		c := evictionCost(q, in[i].Key.ID, caps[i], kp.EvictionWeight)
		if c < bestCost || (c == bestCost && best != j && rank(firstKey(r), &in[i]) > rank(firstKey(r), &in[best])) {
			best, bestCost = i, c
		}
	}
	if best == j {
		f.s.m.pressure.WithLabelValues(PressureKept).Inc()
	} else {
		f.s.m.pressure.WithLabelValues(PressureEvictions).Inc()
	}
	return best
}

// noteNewSession records, for a session new to this router whose request
// the filter sent to k without the session rule (a prefix nobody holds
// yet: the first request of a burst), its footprint at once, as the rule
// does for those it places — else the burst's next sessions, placed
// before this one is accepted, would not see it.
func (f kvAffinity) noteNewSession(r *Request, q *KVQuery, k Key) {
	if f.s == nil || r.Session == "" || f.s.cfg.KVPressure.SessionReserveTokens <= 0 {
		return
	}
	h := sessionHash(r.Session)
	if _, depth := f.s.sessions.Match([]uint64{h}, nil); depth > 0 {
		return
	}
	f.s.footprints.set(h, k, f.s.cfg.KVPressure.plannedBlocks(q), q.Total)
}

// placeSession chooses the replica for a session new to this router: the
// primary j while the session fits there (the planned blocks of the live
// sessions, plus this one's, within SessionFill × the cache); else the
// fitting candidate with the least prefill, the most room breaking ties,
// then rendezvous; else the candidate with the most room planned. Only
// candidates whose match falls short of j's by at most the reserve are
// considered (j always is).
func (f kvAffinity) placeSession(q *KVQuery, hot []bool, in []Candidate, caps []int, j int, session uint64) int {
	kp := f.s.cfg.KVPressure
	planned := f.s.footprints.planned(session, q.Held)
	need := kp.plannedBlocks(q)
	room := func(i int) float64 {
		return kp.SessionFill*float64(caps[i]) - float64(planned[in[i].Key]+need)
	}
	if room(j) >= 0 {
		f.s.m.pressure.WithLabelValues(PressureKept).Inc()
		return j
	}
	mj := min(q.Matched[in[j].Key.ID], q.Total)
	best, overfull := -1, -1
	for i := range in {
		// A move must not recompute more than one session's reserve: a
		// session another router (or this one before a restart) served
		// holds its whole context at j, and stays.
		if (hot != nil && hot[i]) || mj-min(q.Matched[in[i].Key.ID], q.Total) > kp.reserveBlocks(q) {
			continue
		}
		if overfull < 0 || room(i)/float64(caps[i]) > room(overfull)/float64(caps[overfull]) {
			overfull = i
		}
		if room(i) < 0 {
			continue
		}
		if best < 0 {
			best = i
			continue
		}
		ci, cb := q.Total-min(q.Matched[in[i].Key.ID], q.Total), q.Total-min(q.Matched[in[best].Key.ID], q.Total)
		switch {
		case ci < cb:
			best = i
		case ci == cb && room(i) > room(best):
			best = i
		case ci == cb && room(i) == room(best) && rank(session, &in[i]) > rank(session, &in[best]):
			best = i
		}
	}
	if best >= 0 {
		f.s.m.pressure.WithLabelValues(PressureSessionPlaced).Inc()
		return best
	}
	if overfull == j {
		f.s.m.pressure.WithLabelValues(PressureKept).Inc()
	} else {
		f.s.m.pressure.WithLabelValues(PressureSessionOverfull).Inc()
	}
	return overfull
}

// firstKey is the prompt's first chunk's hash, rendezvous' key for a
// prefix; 0 without one.
func firstKey(r *Request) uint64 {
	if len(r.Prefix) > 0 {
		return r.Prefix[0]
	}
	return 0
}
