package leader

import (
	"sync"
	"time"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// adapterUseKeep is how long a router's report counts: a router sends one
// at least every second (router/director), so one that stops reporting —
// gone, cut off, or stopped — drops out after three missed.
const adapterUseKeep = 3 * time.Second

// maxUseSessions bounds the router sessions kept; maxSessionsPerRouter
// the sessions of one router name: a router restarting in a loop replaces
// its oldest session rather than filling the table.
const (
	maxUseSessions       = 1024
	maxSessionsPerRouter = 4
)

// adapterUse is the routers' requests in flight per adapter and replica,
// as each router last reported them (design §7.6). The router sends its
// request and counts it in the same goroutine, so its count is exact —
// unlike the agents' readings of the engines, a second apart and, for
// some engines, stuck busy. The leader's eviction reads it: an adapter
// any router has a request in flight for on a replica is busy there.
type adapterUse struct {
	mu       sync.Mutex
	sessions map[useSession]*useReport
}

type useSession struct {
	router  string
	session uint64
}

type useReport struct {
	seq uint64
	at  time.Time // the leader's clock when it arrived
	// uses by adapter and replica; times are on the leader's clock.
	uses map[adapterKey]useEntry
}

type useEntry struct {
	uid    uint64
	active uint32
	last   time.Time
}

func newAdapterUse() *adapterUse { return &adapterUse{sessions: map[useSession]*useReport{}} }

// report keeps r as its session's newest (an older seq is dropped) and
// returns how many sessions are live; ok is false when r is of a new
// session and maxUseSessions are kept: a bound on what callers can make
// the leader hold. Entry times are moved from the
// router's clock to the leader's by the difference between r's send time
// and now, so the two clocks need not agree; the transit only makes a use
// look later, never earlier.
func (u *adapterUse) report(r *llmgwv1.AdapterUseReport, now time.Time) (n int, ok bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.pruneLocked(now)
	k := useSession{router: r.GetRouter(), session: r.GetSession()}
	old := u.sessions[k]
	if old != nil && r.GetSeq() <= old.seq {
		return len(u.sessions), true
	}
	if old == nil && !u.makeRoomLocked(k.router) {
		return len(u.sessions), false
	}
	var offset time.Duration
	if r.GetSentUnixNano() > 0 {
		offset = now.Sub(time.Unix(0, r.GetSentUnixNano()))
	}
	rep := &useReport{seq: r.GetSeq(), at: now, uses: make(map[adapterKey]useEntry, len(r.GetUses()))}
	for _, s := range r.GetUses() {
		last := now
		if at := time.Unix(0, s.GetLastActiveUnixNano()).Add(offset); s.GetActive() == 0 && at.Before(now) {
			last = at
		}
		k := adapterKey{s.GetAdapter(), s.GetReplicaId()}
		e := rep.uses[k]
		// Duplicates (several incarnations of one replica) add up.
		e.uid, e.active = s.GetUid(), e.active+s.GetActive()
		if last.After(e.last) {
			e.last = last
		}
		rep.uses[k] = e
	}
	u.sessions[k] = rep
	return len(u.sessions), true
}

// makeRoomLocked makes room for a new session of router: the router's
// oldest session goes when it has maxSessionsPerRouter; false when the
// table is full.
func (u *adapterUse) makeRoomLocked(router string) bool {
	var oldest *useSession
	n := 0
	for k, rep := range u.sessions {
		if k.router != router {
			continue
		}
		n++
		if oldest == nil || rep.at.Before(u.sessions[*oldest].at) {
			oldest = &k
		}
	}
	if n >= maxSessionsPerRouter {
		delete(u.sessions, *oldest)
		return true
	}
	return len(u.sessions) < maxUseSessions
}

func (u *adapterUse) pruneLocked(now time.Time) {
	for k, rep := range u.sessions {
		if now.Sub(rep.at) >= adapterUseKeep {
			delete(u.sessions, k)
		}
	}
}

// routerUse is what the live reports say of adapter on replica (of uid):
// the requests in flight summed over routers, and the latest use. covered
// is false when no router has reported within adapterUseKeep — a leader
// just elected, or routers that do not report — and the agents' readings
// are then all there is.
type routerUse struct {
	active  uint32
	last    time.Time
	covered bool
}

func (u *adapterUse) of(adapter, replica string, uid uint64, now time.Time) routerUse {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out routerUse
	for _, rep := range u.sessions {
		if now.Sub(rep.at) >= adapterUseKeep {
			continue
		}
		out.covered = true
		e, ok := rep.uses[adapterKey{adapter, replica}]
		if !ok || (e.uid != 0 && uid != 0 && e.uid != uid) {
			continue // another replica under the same id
		}
		out.active += e.active
		if e.last.After(out.last) {
			out.last = e.last
		}
	}
	return out
}

// ReportAdapterUse keeps a router's report of its requests in flight per
// adapter and replica (design §7.6) and answers how long it counts and the
// adapter_min_idle its uses keep adapters busy for; ok is false when it is
// of a new router session and maxUseSessions are kept. It runs on the
// leader; the AdapterService has checked r's bounds.
//
// It takes adapterMu, as the eviction decisions do from reading the uses
// to committing: a report is kept either before a decision reads the uses
// (which then see it) or after its eviction is committed. A router that
// waits for this answer before sending a request for an adapter it has
// not used lately therefore never sends it where an eviction was decided
// without it in view.
func (l *Leader) ReportAdapterUse(r *llmgwv1.AdapterUseReport) (_ *llmgwv1.AdapterUseReportResponse, ok bool) {
	l.adapterMu.Lock()
	n, ok := l.use.report(r, l.now())
	l.adapterMu.Unlock()
	l.metrics.adapterUseRouters.Set(float64(n))
	return &llmgwv1.AdapterUseReportResponse{KeepMs: adapterUseKeep.Milliseconds(), MinIdleMs: l.cfg.AdapterMinIdle.Milliseconds()}, ok
}
