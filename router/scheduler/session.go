package scheduler

import (
	"math"

	"github.com/llmgw/llmgw/router/prefix"
)

// Session decisions, as counted in llmgw_router_session_decisions_total.
const (
	// SessionHit: the replica this router remembers for the session is
	// within the bound.
	SessionHit = "hit"
	// SessionNew: this router has no memory of the session; placed by the
	// shared rule.
	SessionNew = "new"
	// SessionMoved: the remembered replica is no longer a candidate (gone,
	// or filtered out); placed by the shared rule.
	SessionMoved = "moved"
	// SessionLoadOverride: the remembered replica is over the bound; placed
	// by the shared rule.
	SessionLoadOverride = "load_override"
)

// SharedLoad is a replica's load as every router sees it: the engine's
// waiting plus running from the agents' load snapshots (plan §7.2). Unlike
// Load it leaves out this router's own in-flight count, which only this
// router knows, so two routers given the same snapshot judge the session
// bound alike (plan §7.3 "Routers agree without talking").
func (c *Candidate) SharedLoad() float64 { return c.Waiting + c.Running }

// sessionBound is bounded-load consistent hashing's limit over the shared
// loads: ⌈f × (Σload + 1) / n⌉. Counting one more request keeps an idle
// fleet from refusing affinity, and the ceiling guarantees that some replica
// is always within it.
func sessionBound(f float64, cands []Candidate) float64 {
	sum := 0.0
	for i := range cands {
		sum += cands[i].SharedLoad()
	}
	return math.Ceil(f * (sum + 1) / float64(len(cands)))
}

// withinBound reports whether a session may be placed on c: a fresh reading
// with shared load at most the bound. At most, not "load + 1": the snapshot
// still counts a session's previous turn for a scrape or two after it ended,
// and a client sends the next turn at once, so the request being placed is
// usually already counted on the replica that served the last one; adding
// it again made a session's own replica look full (measured: 112–124
// overrides in 300 requests against 1–12; docs/benchmarks.md). A stale
// reading counts as saturated (plan §7.2).
func withinBound(c *Candidate, bound float64) bool {
	return !c.Saturated && c.SharedLoad() <= bound
}

// SessionReplica is the shared rule of tier 0: the first replica in the
// session's rendezvous order that is within the bound (the first in that
// order when none is). It depends only on the session id, the replicas'
// identities and the agents' load snapshot, so every router that sees the
// same snapshot computes the same replica — also for a session it has never
// seen, and also when it moves one. Returns -1 for no candidates.
func SessionReplica(session string, f float64, cands []Candidate) int {
	bound := sessionBound(f, cands)
	return sessionReplica(sessionHash(session), bound, cands)
}

func sessionReplica(h uint64, bound float64, cands []Candidate) int {
	if i := Rendezvous(h, cands, func(c *Candidate) bool { return withinBound(c, bound) }); i >= 0 {
		return i
	}
	return Rendezvous(h, cands, nil)
}

// Session keeps a conversation on the replica that holds its history
// (plan §7.5 tier 0). The session's replica scores 1, the others 0:
//
//   - the replica this router last sent the session to, while it is within
//     the bound (f × the mean shared load, see sessionBound and withinBound);
//   - otherwise — a session this router never saw, a remembered replica
//     gone or over the bound — SessionReplica: the first replica in the
//     session's rendezvous order within the bound.
//
// Memory is a hint that keeps a moved session where it went while it fits;
// agreement between routers comes from the shared rule, not from memory:
// the bound is judged on the load every router sees, and a move goes to
// the replica every router would compute, so a router meeting a session
// mid-conversation sends it where the other router did.
// Requests without X-Session-ID score 0 everywhere.
func (s *Scheduler) Session(f float64) Scorer { return &session{f: f, s: s} }

type session struct {
	f float64
	s *Scheduler
}

func (*session) Name() string { return "session" }

func sessionHash(id string) uint64 { return prefix.Mix(hashString(id) ^ 0x5e5510) }

func (ss *session) Score(r *Request, cands []Candidate, out []float64) {
	if r.Session == "" {
		return
	}
	bound := sessionBound(ss.f, cands)
	h := sessionHash(r.Session)
	decision := SessionNew
	if k, depth := ss.s.sessions.Match([]uint64{h}, nil); depth > 0 {
		switch i := indexOf(cands, k); {
		case i < 0:
			decision = SessionMoved
		case withinBound(&cands[i], bound):
			out[i] = 1
			ss.s.m.session.WithLabelValues(SessionHit).Inc()
			return
		default:
			decision = SessionLoadOverride
		}
	}
	ss.s.m.session.WithLabelValues(decision).Inc()
	if i := sessionReplica(h, bound, cands); i >= 0 {
		out[i] = 1
	}
}

func (ss *session) Observe(r *Request, chosen *Candidate) {
	if r.Session != "" {
		ss.s.sessions.Observe([]uint64{sessionHash(r.Session)}, chosen.Key)
	}
}
