package scheduler

import (
	"math"

	"github.com/llmgw/llmgw/router/prefix"
)

// sessionBound reports whether a replica of load l may take one more
// request of a session: bounded-load consistent hashing's rule, l + 1 ≤
// ⌈f × (sum + 1) / n⌉. Counting the request being placed keeps an idle
// fleet from refusing affinity (a replica at 1 over a mean of 0.25 is not
// overloaded), and the ceiling guarantees some replica always qualifies.
func sessionBound(f float64, cands []Candidate) float64 {
	sum := 0.0
	for i := range cands {
		sum += cands[i].Load()
	}
	return math.Ceil(f * (sum + 1) / float64(len(cands)))
}

// Session keeps a conversation on the replica that holds its history
// (plan §7.5 tier 0): 1 for the session's replica while its load stays
// within f × the mean (see sessionBound); a session this router has not
// seen — or whose replica is gone or over the bound — is placed by
// rendezvous hashing of its id among the replicas within the bound.
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
	within := func(c *Candidate) bool { return c.Load()+1 <= bound }
	h := []uint64{sessionHash(r.Session)}
	if k, depth := ss.s.sessions.Match(h, nil); depth > 0 {
		if i := indexOf(cands, k); i >= 0 {
			if within(&cands[i]) {
				out[i] = 1
				ss.s.m.session.WithLabelValues("hit").Inc()
				return
			}
			ss.s.m.session.WithLabelValues("load_override").Inc()
		} else {
			ss.s.m.session.WithLabelValues("moved").Inc()
		}
	} else {
		ss.s.m.session.WithLabelValues("new").Inc()
	}
	if i := Rendezvous(h[0], cands, within); i >= 0 {
		out[i] = 1
	}
}

func (ss *session) Observe(r *Request, chosen *Candidate) {
	if r.Session != "" {
		ss.s.sessions.Observe([]uint64{sessionHash(r.Session)}, chosen.Key)
	}
}
