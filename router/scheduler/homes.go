package scheduler

import (
	"sync"
	"time"
)

// homesWindow is how long a prefix counts as living on the replica tier 2
// last sent it to as its primary: longer than the gaps between a shared
// prefix's requests, short enough that a prefix the traffic left stops
// counting about when an engine's LRU would have evicted it.
const homesWindow = 30 * time.Second

// maxHomes bounds the record (some 64 bytes an entry).
const maxHomes = 64 << 10

// homes is where tier 2's KV affinity sent each prefix — keyed by the
// prompt's first chunk — as its primary, and when: the count per replica
// is how many live prefixes it is home to, which is where a new prefix
// goes (the fewest). Every router sees the same index and so picks the
// same primaries, so their counts agree without talking, as rendezvous
// hashing does for one key. Safe for concurrent use.
type homes struct {
	now func() time.Time

	mu sync.Mutex
	m  map[uint64]home
	// per counts m's entries by replica, kept with m, so a placement
	// reads it without walking every prefix.
	per       map[Key]int
	lastPrune time.Time
}

type home struct {
	k  Key
	at time.Time
}

func newHomes(now func() time.Time) *homes {
	return &homes{now: now, m: map[uint64]home{}, per: map[Key]int{}}
}

// set records k as prefix's home now.
func (h *homes) set(prefix uint64, k Key) {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pruneLocked(now)
	old, ok := h.m[prefix]
	if !ok && len(h.m) >= maxHomes {
		return
	}
	if ok {
		h.dropLocked(old.k)
	}
	h.m[prefix] = home{k, now}
	h.per[k]++
}

// get returns prefix's live home.
func (h *homes) get(prefix uint64) (Key, bool) {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	e, ok := h.m[prefix]
	if !ok || !e.at.After(now.Add(-homesWindow)) {
		return Key{}, false
	}
	return e.k, true
}

// counts returns how many live prefixes each replica is home to, not
// counting prefix itself (a prefix being placed again is not yet anywhere).
// An expired home may count for up to a tenth of the window (pruneLocked).
func (h *homes) counts(prefix uint64) map[Key]int {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pruneLocked(now)
	out := make(map[Key]int, len(h.per))
	for k, n := range h.per {
		out[k] = n
	}
	if e, ok := h.m[prefix]; ok {
		if out[e.k]--; out[e.k] == 0 {
			delete(out, e.k)
		}
	}
	return out
}

// dropLocked takes one home off k's count.
func (h *homes) dropLocked(k Key) {
	if h.per[k]--; h.per[k] <= 0 {
		delete(h.per, k)
	}
}

// pruneLocked drops entries past the window, at most every tenth of it.
func (h *homes) pruneLocked(now time.Time) {
	if now.Sub(h.lastPrune) < homesWindow/10 {
		return
	}
	h.lastPrune = now
	old := now.Add(-homesWindow)
	for p, e := range h.m {
		if !e.at.After(old) {
			delete(h.m, p)
			h.dropLocked(e.k)
		}
	}
}

// retain forgets the homes on replicas keep rejects.
func (h *homes) retain(keep func(Key) bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for p, e := range h.m {
		if !keep(e.k) {
			delete(h.m, p)
			h.dropLocked(e.k)
		}
	}
}
