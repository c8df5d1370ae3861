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

// sessionBound is bounded-load consistent hashing's limit: ⌈f × (Σload +
// 1) / n⌉ over the replicas' Load (waiting + max(running, own in-flight)).
// Counting one more request keeps an idle fleet from refusing affinity, and
// the ceiling guarantees that some replica is always within it.
//
// Routers share the engines' waiting and running (the agents' snapshot);
// they differ only where a router's own in-flight count is ahead of the
// snapshot — the first few tens of milliseconds after it sent requests. In
// steady state each router's own requests are a part of the engine's
// running count and every router computes the same bound. Leaving the own
// count out entirely (waiting + running alone) was measured and rejected:
// a router then cannot see the requests it placed a moment ago, new
// conversations pile onto their rendezvous homes, and single-router runs
// fell into engine queueing (docs/benchmarks.md, "Scheduler").
func sessionBound(f float64, cands []Candidate) float64 {
	sum := 0.0
	for i := range cands {
		sum += cands[i].Load()
	}
	return math.Ceil(f * (sum + 1) / float64(len(cands)))
}

// withinBound reports whether c, with a fresh reading, has load at most
// limit. A stale reading counts as saturated (design §7.2).
func withinBound(c *Candidate, limit float64) bool {
	return !c.Saturated && c.Load() <= limit
}

// SessionReplica is the shared rule of tier 0, the replica a session
// belongs on: its rendezvous home (the first replica in the session's
// rendezvous order) while the home's load is at most the bound; otherwise
// the next replica in that order with room for one more request (load + 1
// ≤ bound); otherwise the first within the bound; otherwise the home.
//
// The home is allowed the bound itself, not bound − 1, because the engine
// counts a session's previous turn for a scrape or two after it ends and a
// client sends the next turn at once: the request being placed is usually
// already counted there. A replica the session moves to has no turn of it
// yet, so there the request is counted. With "load + 1" at home too, homes
// looked full and sessions moved 112–124 times in 300 requests.
//
// It depends on the session id, the replicas' identities and their loads
// only — never on what a router remembers — so routers that see the same
// loads send a session they have never seen, and a session they move, to
// the same replica. Returns -1 for no candidates.
func SessionReplica(session string, f float64, cands []Candidate) int {
	return sessionReplica(sessionHash(session), sessionBound(f, cands), cands)
}

func sessionReplica(h uint64, bound float64, cands []Candidate) int {
	home := Rendezvous(h, cands, nil)
	if home < 0 || withinBound(&cands[home], bound) {
		return home
	}
	if i := Rendezvous(h, cands, func(c *Candidate) bool {
		return c.Key != cands[home].Key && withinBound(c, bound-1)
	}); i >= 0 {
		return i
	}
	if i := Rendezvous(h, cands, func(c *Candidate) bool { return withinBound(c, bound) }); i >= 0 {
		return i
	}
	return home
}

// Session keeps a conversation on the replica that holds its history
// (design §7.5 tier 0). The session's replica scores 1, the others 0:
//
//   - the replica this router last sent the session to, while its load is
//     at most the bound (f × the mean, see sessionBound; the previous turn
//     is still counted there, see SessionReplica);
//   - otherwise — a session this router never saw, a remembered replica
//     gone, filtered out or over the bound — SessionReplica.
//
// Memory is a hint that keeps a moved session where it went while it fits;
// agreement between routers comes from the shared rule, not from memory: a
// router meeting a session mid-conversation, or moving one, computes the
// replica the other router's rule computed (design §7.3 "Routers agree
// without talking"). Requests without X-Session-ID score 0 everywhere.
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
