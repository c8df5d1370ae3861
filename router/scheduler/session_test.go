package scheduler

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/llmgw/llmgw/internal/testkit"
)

// order is the session's rendezvous order over cands, by Rendezvous's own
// contract (the highest among those left, repeatedly).
func order(session string, cands []Candidate) []int {
	var out []int
	taken := map[int]bool{}
	for range cands {
		i := Rendezvous(sessionHash(session), cands, func(c *Candidate) bool { return !taken[indexOf(cands, c.Key)] })
		taken[i] = true
		out = append(out, i)
	}
	return out
}

func TestSessionScorer(t *testing.T) {
	// four builds r0..r3 with the given shared loads (as running).
	four := func(loads ...float64) []Candidate {
		var cs []Candidate
		for i, l := range loads {
			cs = append(cs, c(fmt.Sprint("r", i), 0, l, 0))
		}
		return cs
	}
	with := func(cs []Candidate, i int, f func(*Candidate)) []Candidate { f(&cs[i]); return cs }
	tests := []struct {
		name     string
		session  string
		sentTo   string // remembered replica
		cands    []Candidate
		want     string // replica scoring 1; "" none; "rule": SessionReplica's
		decision string
	}{
		{"no session", "", "", four(0, 0, 0, 0), "", ""},
		{"remembered, idle fleet", "s1", "r2", four(0, 0, 0, 0), "r2", SessionHit},
		{"remembered, within the bound", "s1", "r2", four(2, 2, 3, 2), "r2", SessionHit},
		// sum 14 → bound ⌈1.25·15/4⌉ = 5: a replica at 5 keeps its session
		// (the snapshot still counts the session's previous turn there).
		{"remembered, at the bound", "s1", "r2", four(3, 3, 5, 3), "r2", SessionHit},
		// sum 12 → bound ⌈1.25·13/4⌉ = 5: a replica at 6 is over it.
		{"remembered, over the bound", "s1", "r2", four(2, 2, 6, 2), "rule", SessionLoadOverride},
		// The router's own requests are part of the engine's running
		// count once the snapshot catches up: then they change nothing...
		{"own in-flight within the snapshot", "s1", "r2",
			with(four(2, 2, 2, 2), 2, func(c *Candidate) { c.Inflight = 2 }), "r2", SessionHit},
		// ...and while they are ahead of it (a burst just sent), they count.
		{"own in-flight ahead of the snapshot", "s1", "r2",
			with(four(2, 2, 2, 2), 2, func(c *Candidate) { c.Inflight = 20 }), "rule", SessionLoadOverride},
		{"remembered, stale reading", "s1", "r2",
			with(four(0, 0, 0, 0), 2, func(c *Candidate) { c.Saturated = true }), "rule", SessionLoadOverride},
		{"remembered replica gone", "s1", "gone", four(0, 0, 0, 0), "rule", SessionMoved},
		{"unseen goes to the rule", "s1", "", four(0, 0, 0, 0), "rule", SessionNew},
		{"unseen, every reading stale", "s1", "", func() []Candidate {
			cs := four(0, 0, 0, 0)
			for i := range cs {
				cs[i].Saturated = true
			}
			return cs
		}(), "rule", SessionNew},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, reg, _ := newSched(t, 1)
			sc := s.Session(1.25)
			r := &Request{Session: tt.session}
			if tt.sentTo != "" {
				sc.(Observer).Observe(r, &Candidate{Key: Key{ID: tt.sentTo, UID: 1}})
			}
			out := make([]float64, len(tt.cands))
			sc.Score(r, tt.cands, out)
			want := tt.want
			if want == "rule" {
				want = tt.cands[SessionReplica(tt.session, 1.25, tt.cands)].Key.ID
			}
			got := ""
			for i, v := range out {
				if v == 1 {
					got = tt.cands[i].Key.ID
				}
			}
			if got != want {
				t.Fatalf("session replica %q, want %q (scores %v)", got, want, out)
			}
			if tt.decision != "" && testkit.Metric(t, reg, "llmgw_router_session_decisions_total", testkit.Labels{"decision": tt.decision}) != 1 {
				t.Fatalf("decision %s not counted", tt.decision)
			}
		})
	}
}

// TestSessionReplica: the shared rule is the first replica in the session's
// rendezvous order within the bound — not wherever load is lowest.
func TestSessionReplica(t *testing.T) {
	cands := make([]Candidate, 4)
	for i := range cands {
		cands[i] = c(fmt.Sprint("r", i), 0, 3, 0)
	}
	ord := order("s", cands)
	tests := []struct {
		name  string
		loads map[int]float64 // by rendezvous rank
		stale map[int]bool
		want  int // rendezvous rank
	}{
		{"first choice within", nil, nil, 0},
		// sum 3+3+3+9 = 18 → bound ⌈1.25·19/4⌉ = 6.
		{"first over, second within", map[int]float64{0: 9}, nil, 1},
		{"first two over, third within though busier than the fourth",
			map[int]float64{0: 9, 1: 9, 2: 4, 3: 0}, nil, 2},
		// sum 20 → bound 7: the session's own replica may be at the bound
		// (its snapshot still counts the session's last turn)...
		{"home at the bound stays", map[int]float64{0: 7, 1: 4, 2: 4, 3: 5}, nil, 0},
		// ...a replica it moves to must have room for it.
		{"move target at the bound is passed over", map[int]float64{0: 10, 1: 7, 2: 2, 3: 1}, nil, 2},
		{"first stale", nil, map[int]bool{0: true}, 1},
		{"all stale: plain rendezvous", nil, map[int]bool{0: true, 1: true, 2: true, 3: true}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cs := append([]Candidate(nil), cands...)
			for rank, l := range tt.loads {
				cs[ord[rank]].Running = l
			}
			for rank := range tt.stale {
				cs[ord[rank]].Saturated = true
			}
			if got := SessionReplica("s", 1.25, cs); got != ord[tt.want] {
				t.Fatalf("SessionReplica = %d, want %d (rendezvous rank %d of order %v)", got, ord[tt.want], tt.want, ord)
			}
		})
	}
	if got := SessionReplica("s", 1.25, nil); got != -1 {
		t.Fatalf("no candidates: %d, want -1", got)
	}
}

// TestSessionRoutersAgreeUnderLoad: two routers that share the agents'
// snapshot but not their memory, randomness or own in-flight counts (each
// a part of the engine's running count, as in steady state) make the same
// session decision — for sessions neither has seen, and when one of them
// moves a session it remembers on an overloaded replica and the other
// meets the session for the first time.
func TestSessionRoutersAgreeUnderLoad(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	chosen := func(s *Scheduler, r *Request, cands []Candidate) int {
		out := make([]float64, len(cands))
		s.Session(1.25).Score(r, cands, out)
		for i, v := range out {
			if v == 1 {
				return i
			}
		}
		return -1
	}
	moves := 0
	for round := range 500 {
		a, _, _ := newSched(t, 1)
		b, _, _ := newSched(t, 2)
		n := 2 + rng.IntN(7)
		ca, cb := make([]Candidate, n), make([]Candidate, n)
		for i := range n {
			ca[i] = Candidate{Key: Key{ID: fmt.Sprint("demo-", i), UID: uint64(100 + i)},
				Waiting: float64(rng.IntN(3)), Running: float64(rng.IntN(8)), Saturated: rng.IntN(20) == 0}
			cb[i] = ca[i]
			// Each router's own requests: different, both within the
			// engine's count.
			run := int(ca[i].Running)
			ca[i].Inflight, cb[i].Inflight = int64(rng.IntN(run+1)), int64(rng.IntN(run+1))
		}
		r := &Request{Session: fmt.Sprint("session-", round)}
		// a remembers the session on a random replica; b never saw it.
		home := rng.IntN(n)
		a.Session(1.25).(Observer).Observe(r, &ca[home])
		ia, ib := chosen(a, r, ca), chosen(b, r, cb)
		if ia != home {
			moves++
			if ia != ib {
				t.Fatalf("round %d: a moved the session from %d to %d, b placed it on %d (%+v)", round, home, ia, ib, ca)
			}
		}
		// Neither remembers: the same answer.
		r2 := &Request{Session: fmt.Sprint("unseen-", round)}
		if ja, jb := chosen(a, r2, ca), chosen(b, r2, cb); ja != jb {
			t.Fatalf("round %d: unseen session placed on %d by a, %d by b", round, ja, jb)
		}
	}
	if moves < 50 {
		t.Fatalf("only %d of 500 rounds moved a session: the test does not exercise moves", moves)
	}
}
