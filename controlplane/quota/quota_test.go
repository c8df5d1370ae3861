package quota

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// t0 is the election of every test: a fixed instant, so times are exact.
var t0 = time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)

const (
	rpm         = llmgwv1.LimitKind_LIMIT_KIND_RPM
	concurrency = llmgwv1.LimitKind_LIMIT_KIND_CONCURRENCY
	daily       = llmgwv1.LimitKind_LIMIT_KIND_DAILY_TOKENS
	monthly     = llmgwv1.LimitKind_LIMIT_KIND_MONTHLY_TOKENS
)

func scope(tenant string, kind llmgwv1.LimitKind) *llmgwv1.Scope {
	return &llmgwv1.Scope{Tenant: tenant, Kind: kind}
}

// fakeLimits are the limits by scope, and a roll-up of commits with their
// times, read by period as the FSM's is.
type fakeLimits struct {
	limits  map[scopeKey]uint64
	commits []commit
}

type commit struct {
	k      scopeKey
	at     time.Time
	tokens uint64
}

func limitsOf(kv ...any) *fakeLimits {
	f := &fakeLimits{limits: map[scopeKey]uint64{}}
	for i := 0; i < len(kv); i += 2 {
		f.limits[keyOf(kv[i].(*llmgwv1.Scope))] = uint64(kv[i+1].(int))
	}
	return f
}

func (f *fakeLimits) Limit(s *llmgwv1.Scope) (uint64, bool) {
	l := f.limits[keyOf(s)]
	return l, l > 0
}

func (f *fakeLimits) Committed(tenant, model string, kind llmgwv1.LimitKind, now time.Time) uint64 {
	from, ok := PeriodStart(kind, now)
	if !ok {
		return 0
	}
	var n uint64
	for _, c := range f.commits {
		if c.k == (scopeKey{tenant, model, kind}) && !c.at.Before(from) && !c.at.After(now) {
			n += c.tokens
		}
	}
	return n
}

// accounted is the leader's sum over sessions of what it counts of k.
func (a *Allocator) accounted(k scopeKey, now time.Time) uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var n uint64
	for _, h := range a.scopes[k] {
		if !a.forgotten(h, now) {
			n = satAdd(n, h.accounted(k.kind, now))
		}
	}
	return n
}

// sessionAccounted is what the leader counts of one session in k.
func (a *Allocator) sessionAccounted(router string, k scopeKey, now time.Time) uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	h := a.scopes[k][sessionKey{router, 1}]
	if h == nil || a.forgotten(h, now) {
		return 0
	}
	return h.accounted(k.kind, now)
}

// simRouter is a router as the allocator's contract describes it (session
// 1 of its name): per rate scope, the newest grant it received in force
// until the term from its request ends, then that grant's fallback.
type simRouter struct {
	name   string
	demand map[scopeKey]uint64
	got    map[scopeKey]*simGrant
	// lost are grants issued to it and never received: possibly in force
	// as far as anyone but the test knows, until they expire.
	lost map[scopeKey][]simGrant
}

type simGrant struct {
	seq, share, fallback uint64
	exp                  time.Time
}

func newRouter(name string) *simRouter {
	return &simRouter{name: name, demand: map[scopeKey]uint64{}, got: map[scopeKey]*simGrant{}, lost: map[scopeKey][]simGrant{}}
}

// inForce is the share the router admits at now.
func (r *simRouter) inForce(k scopeKey, now time.Time) uint64 {
	g := r.got[k]
	if g == nil {
		return 0
	}
	if now.Before(g.exp) {
		return g.share
	}
	return g.fallback
}

// possible is the largest share that may be in force at the router at now,
// counting the grants it lost as if it had received them.
func (r *simRouter) possible(k scopeKey, now time.Time) uint64 {
	p := r.inForce(k, now)
	for _, g := range r.lost[k] {
		if now.Before(g.exp) {
			p = max(p, g.share)
		} else {
			p = max(p, g.fallback)
		}
	}
	return p
}

func (r *simRouter) request(now time.Time) *llmgwv1.LeaseRequest {
	req := &llmgwv1.LeaseRequest{Router: r.name, Session: 1}
	for _, k := range sortedKeys(r.demand) {
		c := &llmgwv1.ShareClaim{Scope: &llmgwv1.Scope{Tenant: k.tenant, Model: k.model, Kind: k.kind}, Held: r.inForce(k, now), Demand: r.demand[k]}
		if g := r.got[k]; g != nil {
			c.GrantSeq = g.seq
		}
		req.Claims = append(req.Claims, c)
	}
	return req
}

func sortedKeys(m map[scopeKey]uint64) []scopeKey {
	var ks []scopeKey
	for k := range m {
		ks = append(ks, k)
	}
	for i := 1; i < len(ks); i++ {
		for j := i; j > 0 && fmt.Sprint(ks[j]) < fmt.Sprint(ks[j-1]); j-- {
			ks[j], ks[j-1] = ks[j-1], ks[j]
		}
	}
	return ks
}

// lease sends the router's renewal at now; drop loses the answer.
func (r *simRouter) lease(t *testing.T, a *Allocator, l Limits, now time.Time, drop bool) *llmgwv1.LeaseResponse {
	t.Helper()
	resp, err := a.Lease(now, r.request(now), l)
	if err != nil {
		t.Fatalf("%s at %v: %v", r.name, now.Sub(t0), err)
	}
	for _, g := range resp.Grants {
		k := keyOf(g.Scope)
		sg := simGrant{g.Seq, g.Share, g.Fallback, now.Add(time.Duration(resp.TermMs) * time.Millisecond)}
		if drop {
			r.lost[k] = append(r.lost[k], sg)
			continue
		}
		if old := r.got[k]; old != nil && g.Seq <= old.seq {
			t.Fatalf("%s: seq %d after %d", r.name, g.Seq, old.seq)
		}
		r.got[k] = &sg
		r.lost[k] = nil // a later grant received supersedes the lost ones
	}
	return resp
}

// checkRates asserts the invariant after a call: the shares that may be in
// force at the routers never sum past the limit, and the leader counts at
// least what is in force.
func checkRates(t *testing.T, a *Allocator, routers []*simRouter, k scopeKey, limit uint64, now time.Time) {
	t.Helper()
	var possible, inForce uint64
	for _, r := range routers {
		possible += r.possible(k, now)
		inForce += r.inForce(k, now)
	}
	if possible > limit {
		t.Fatalf("at %v: shares possibly in force sum to %d, above the limit %d", now.Sub(t0), possible, limit)
	}
	if acc := a.accounted(k, now); acc < inForce {
		t.Fatalf("at %v: the leader counts %d, less than the %d in force", now.Sub(t0), acc, inForce)
	}
}

// settled is an allocator elected at t0 with the default config, and the
// instant it grants from.
// settled is an allocator past its settle wait, with the times the tests
// were written for (a 10 s term, a 30 s hold) unless cfg sets its own.
func settled(cfg Config) (*Allocator, time.Time) {
	if cfg.Term == 0 {
		cfg.Term = 10 * time.Second
	}
	if cfg.Hold == 0 {
		cfg.Hold = 3 * cfg.Term
	}
	a := New(cfg)
	a.Elected(t0)
	return a, t0.Add(a.Config().Settle)
}

// TestRatesConverge: routers renewing every second converge to shares of
// their demands, and again when the demands shift, with the shares that
// may be in force never above the limit after any call.
func TestRatesConverge(t *testing.T) {
	tests := []struct {
		name    string
		kind    llmgwv1.LimitKind
		limit   uint64
		demands [][]uint64 // per phase, per router
		want    [][]uint64 // the shares at each phase's end
	}{
		{name: "two routers", kind: rpm, limit: 100,
			demands: [][]uint64{{70, 30}, {30, 70}}, want: [][]uint64{{70, 30}, {30, 70}}},
		{name: "three routers, 70/20/10, then shifted", kind: rpm, limit: 100,
			demands: [][]uint64{{70, 20, 10}, {10, 20, 70}}, want: [][]uint64{{70, 20, 10}, {10, 20, 70}}},
		{name: "demand above the limit: max-min fair", kind: rpm, limit: 100,
			demands: [][]uint64{{140, 40, 20}}, want: [][]uint64{{40, 40, 20}}},
		{name: "demand below the limit: the rest spread equally", kind: rpm, limit: 100,
			demands: [][]uint64{{35, 10, 5}}, want: [][]uint64{{51, 26, 21}}},
		{name: "concurrency, 70/20/10 of 10", kind: concurrency, limit: 10,
			demands: [][]uint64{{7, 2, 1}, {1, 1, 8}}, want: [][]uint64{{7, 2, 1}, {1, 1, 8}}},
		{name: "concurrency in whole requests: 10 over three equal demands", kind: concurrency, limit: 10,
			demands: [][]uint64{{5, 5, 5}}, want: [][]uint64{{3, 3, 3}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sc := scope("acme", tt.kind)
			k := keyOf(sc)
			l := limitsOf(sc, int(tt.limit))
			a, now := settled(Config{})
			var routers []*simRouter
			for i := range tt.demands[0] {
				routers = append(routers, newRouter(fmt.Sprintf("r%d", i+1)))
			}
			for p, demands := range tt.demands {
				for i, r := range routers {
					r.demand[k] = demands[i]
				}
				for range 8 {
					for i, r := range routers {
						r.lease(t, a, l, now.Add(time.Duration(i)*100*time.Millisecond), false)
						checkRates(t, a, routers, k, tt.limit, now.Add(time.Duration(i)*100*time.Millisecond))
					}
					now = now.Add(time.Second)
				}
				for i, r := range routers {
					if got := r.got[k].share; got != tt.want[p][i] {
						t.Errorf("phase %d: %s holds %d, want %d", p, r.name, got, tt.want[p][i])
					}
					if got, want := r.got[k].fallback, min(tt.want[p][i], tt.limit/uint64(len(routers))); got != want {
						t.Errorf("phase %d: %s's fallback %d, want %d", p, r.name, got, want)
					}
				}
			}
		})
	}
}

// TestShrinkNotAcked: a router whose smaller grant is lost is counted at
// its old share until it acknowledges a newer one; only then does another
// router get what it gave up.
func TestShrinkNotAcked(t *testing.T) {
	sc := scope("acme", rpm)
	k := keyOf(sc)
	l := limitsOf(sc, 100)
	a, now := settled(Config{})
	r1, r2 := newRouter("r1"), newRouter("r2")
	routers := []*simRouter{r1, r2}
	r1.demand[k], r2.demand[k] = 70, 30
	for range 5 {
		for _, r := range routers {
			r.lease(t, a, l, now, false)
			checkRates(t, a, routers, k, 100, now)
		}
		now = now.Add(time.Second)
	}
	if r1.got[k].share != 70 || r2.got[k].share != 30 {
		t.Fatalf("not converged: %d/%d", r1.got[k].share, r2.got[k].share)
	}
	r1.demand[k], r2.demand[k] = 10, 90
	if g := r2.lease(t, a, l, now, false).Grants[0]; g.Share != 30 {
		t.Fatalf("r2 granted %d while r1 holds 70, want 30", g.Share)
	}
	// r1's grant of 10 is lost: it still admits 70.
	if g := r1.lease(t, a, l, now, true).Grants[0]; g.Share != 10 {
		t.Fatalf("r1 granted %d, want 10", g.Share)
	}
	checkRates(t, a, routers, k, 100, now)
	if got := a.sessionAccounted("r1", k, now); got != 70 {
		t.Errorf("r1 counted at %d with its grant of 10 not acknowledged, want 70", got)
	}
	if g := r2.lease(t, a, l, now, false).Grants[0]; g.Share != 30 {
		t.Errorf("r2 granted %d while r1 may hold 70, want 30", g.Share)
	}
	checkRates(t, a, routers, k, 100, now)
	// r1 renews acknowledging the older grant only: still 70.
	now = now.Add(time.Second)
	r1.lease(t, a, l, now, false)
	checkRates(t, a, routers, k, 100, now)
	if g := r2.lease(t, a, l, now, false).Grants[0]; g.Share != 30 {
		t.Errorf("r2 granted %d before r1 acknowledged its grant of 10, want 30", g.Share)
	}
	// r1 acknowledges 10: r2 gets the rest.
	now = now.Add(time.Second)
	r1.lease(t, a, l, now, false)
	checkRates(t, a, routers, k, 100, now)
	if got := a.sessionAccounted("r1", k, now); got != 10 {
		t.Errorf("r1 counted at %d once it acknowledged 10, want 10", got)
	}
	if g := r2.lease(t, a, l, now, false).Grants[0]; g.Share != 90 {
		t.Errorf("r2 granted %d once r1 acknowledged, want 90", g.Share)
	}
	checkRates(t, a, routers, k, 100, now)
}

// TestSilentRouter: a router that stops renewing is counted at its share
// until its lease expires, then at its fallback until Hold has passed
// since it was last heard from, then forgotten.
func TestSilentRouter(t *testing.T) {
	sc := scope("acme", rpm)
	k := keyOf(sc)
	l := limitsOf(sc, 100)
	a, now := settled(Config{})
	r1, r2 := newRouter("r1"), newRouter("r2")
	r1.demand[k], r2.demand[k] = 70, 30
	for range 5 {
		r1.lease(t, a, l, now, false)
		r2.lease(t, a, l, now, false)
		now = now.Add(time.Second)
	}
	last := now.Add(-time.Second) // r1's last renewal
	r2.demand[k] = 100
	tests := []struct {
		after         time.Duration // since r1's last renewal
		wantR1        uint64
		wantShare     uint64
		wantFallback  uint64
		wantForgotten bool
	}{
		// A fallback is never above the share it follows.
		{after: 1 * time.Second, wantR1: 70, wantShare: 30, wantFallback: 30},
		{after: 9*time.Second + 999*time.Millisecond, wantR1: 70, wantShare: 30, wantFallback: 30},
		// Its lease has expired: its fallback, min(70, 100/2).
		{after: 10 * time.Second, wantR1: 50, wantShare: 50, wantFallback: 50},
		{after: 29 * time.Second, wantR1: 50, wantShare: 50, wantFallback: 50},
		// Hold has passed: forgotten.
		{after: 30 * time.Second, wantR1: 0, wantShare: 100, wantFallback: 100, wantForgotten: true},
	}
	for _, tt := range tests {
		at := last.Add(tt.after)
		if got := a.sessionAccounted("r1", k, at); got != tt.wantR1 {
			t.Errorf("+%v: r1 counted at %d, want %d", tt.after, got, tt.wantR1)
		}
		g := r2.lease(t, a, l, at, false).Grants[0]
		if g.Share != tt.wantShare || g.Fallback != tt.wantFallback {
			t.Errorf("+%v: r2 granted %d (fallback %d), want %d (fallback %d)", tt.after, g.Share, g.Fallback, tt.wantShare, tt.wantFallback)
		}
		if got := a.Sessions(); (got == 1) != tt.wantForgotten {
			t.Errorf("+%v: %d sessions held, forgotten %v", tt.after, got, tt.wantForgotten)
		}
	}
}

// TestSettling: nothing is granted before the election nor for Settle
// after it, though what routers say they hold is kept; a new election
// forgets every session and settles again.
func TestSettling(t *testing.T) {
	sc := scope("acme", rpm)
	k := keyOf(sc)
	l := limitsOf(sc, 90)
	a := New(Config{Term: 10 * time.Second, Hold: 30 * time.Second})
	r1, r2 := newRouter("r1"), newRouter("r2")
	r1.demand[k], r2.demand[k] = 90, 90

	resp := r1.lease(t, a, l, t0, false)
	if !resp.Settling || len(resp.Grants) != 0 || resp.TermMs != 10_000 {
		t.Fatalf("before any election: %v, want settling without grants", resp)
	}
	a.Elected(t0)
	// r2 holds the old leader's fallback, 45, and says so.
	r2.got[k] = &simGrant{seq: 5, share: 45, fallback: 45, exp: t0}
	for _, d := range []time.Duration{0, time.Second, 11*time.Second + 999*time.Millisecond} {
		if resp := r1.lease(t, a, l, t0.Add(d), false); !resp.Settling || len(resp.Grants) != 0 {
			t.Errorf("+%v after the election: %v, want settling without grants", d, resp)
		}
		r2.lease(t, a, l, t0.Add(d), false)
	}
	if a.Sessions() != 2 {
		t.Errorf("%d sessions kept while settling, want 2", a.Sessions())
	}
	// Settled: r1 gets what r2's old fallback leaves.
	resp = r1.lease(t, a, l, t0.Add(12*time.Second), false)
	if resp.Settling || len(resp.Grants) != 1 || resp.Grants[0].Share != 45 || resp.Grants[0].Seq <= uint64(t0.UnixNano()) {
		t.Errorf("settled: %v, want a grant of 45 with a seq above the election's nanoseconds", resp)
	}
	checkRates(t, a, []*simRouter{r1, r2}, k, 90, t0.Add(12*time.Second))

	// Elected again: everything forgotten, settling again.
	t1 := t0.Add(time.Minute)
	a.Elected(t1)
	if a.Sessions() != 0 || !a.Settling(t1) {
		t.Errorf("after a new election: %d sessions, settling %v", a.Sessions(), a.Settling(t1))
	}
	if resp := r1.lease(t, a, l, t1.Add(time.Second), false); !resp.Settling || len(resp.Grants) != 0 {
		t.Errorf("after a new election: %v, want settling", resp)
	}
	if a.Settling(t1.Add(12 * time.Second)) {
		t.Error("still settling Settle after the new election")
	}
	a.Resigned()
	if a.Sessions() != 0 || !a.Settling(t1.Add(time.Hour)) {
		t.Errorf("resigned: %d sessions, settling %v", a.Sessions(), a.Settling(t1.Add(time.Hour)))
	}
}

// budgetRouter spends its budget slices: each before its term ends, at
// its demand, the tokens spent counting as held until committed.
type budgetRouter struct {
	name      string
	demand    uint64 // tokens a minute
	slices    []simGrant
	seq       uint64
	spent     uint64 // not committed yet
	committed uint64
}

func (r *budgetRouter) unspent(now time.Time) uint64 {
	var n uint64
	for _, s := range r.slices {
		if now.Before(s.exp) {
			n += s.share
		}
	}
	return n
}

// spend takes a second's demand from its slices, oldest first.
func (r *budgetRouter) spend(now time.Time) {
	want := r.demand / 60
	for i := range r.slices {
		if !now.Before(r.slices[i].exp) {
			r.slices[i].share = 0 // void at expiry
			continue
		}
		n := min(want, r.slices[i].share)
		r.slices[i].share -= n
		r.spent += n
		want -= n
	}
}

func (r *budgetRouter) lease(t *testing.T, a *Allocator, l Limits, k scopeKey, now time.Time) *llmgwv1.ShareGrant {
	t.Helper()
	req := &llmgwv1.LeaseRequest{Router: r.name, Session: 1, Claims: []*llmgwv1.ShareClaim{{
		Scope: &llmgwv1.Scope{Tenant: k.tenant, Model: k.model, Kind: k.kind}, Held: r.unspent(now) + r.spent, GrantSeq: r.seq, Demand: r.demand,
	}}}
	resp, err := a.Lease(now, req, l)
	if err != nil || len(resp.Grants) != 1 {
		t.Fatalf("%s at %v: %v, %v", r.name, now.Sub(t0), resp, err)
	}
	g := resp.Grants[0]
	if g.Fallback != 0 {
		t.Errorf("a budget's fallback %d, want 0", g.Fallback)
	}
	r.seq = g.Seq
	r.slices = append(r.slices, simGrant{seq: g.Seq, share: g.Share, exp: now.Add(time.Duration(resp.TermMs) * time.Millisecond)})
	return g
}

// TestBudgets: routers spending daily-budget slices never hold with the
// roll-up more than the limit, the slices stop when the budget is spent,
// and a new UTC day grants again.
func TestBudgets(t *testing.T) {
	for _, commitEvery := range []int{1, 3} {
		t.Run(fmt.Sprintf("committed every %d s", commitEvery), func(t *testing.T) {
			sc := scope("acme", daily)
			k := keyOf(sc)
			const limit = 50_000
			l := limitsOf(sc, limit)
			// Elected four minutes before midnight.
			start := time.Date(2026, 3, 10, 23, 56, 0, 0, time.UTC)
			a := New(Config{})
			a.Elected(start)
			now := start.Add(a.Config().Settle)
			routers := []*budgetRouter{{name: "r1", demand: 60_000}, {name: "r2", demand: 12_000}, {name: "r3"}}
			exhausted := false
			var first uint64 // r3's first slice
			for step := 0; now.Before(start.Add(5 * time.Minute)); step++ {
				for _, r := range routers {
					r.spend(now)
					if step%commitEvery == 0 && r.spent > 0 {
						l.commits = append(l.commits, commit{k, now, r.spent})
						r.committed += r.spent
						r.spent = 0
					}
					g := r.lease(t, a, l, k, now)
					if r.name == "r3" && len(r.slices) == 1 {
						first = g.Share
					}
					var held uint64
					for _, r := range routers {
						held += r.unspent(now) + r.spent
					}
					committed := l.Committed("acme", "", daily, now)
					if held+committed > limit {
						t.Fatalf("at %v: routers hold %d with %d committed, above the limit %d", now.Sub(start), held, committed, limit)
					}
					if acc := a.accounted(k, now); acc < held {
						t.Fatalf("at %v: the leader counts %d, less than the %d held", now.Sub(start), acc, held)
					}
					if g.Limit != limit {
						t.Fatalf("grant's limit %d, want %d", g.Limit, limit)
					}
				}
				if l.Committed("acme", "", daily, now) >= limit-2000 && now.Before(start.Add(3*time.Minute+50*time.Second)) {
					exhausted = true
				}
				now = now.Add(time.Second)
			}
			if !exhausted {
				t.Fatalf("the budget was never spent: %d committed", l.Committed("acme", "", daily, start.Add(3*time.Minute)))
			}
			// The budget was spent well before midnight: the last grants
			// before it were empty, and grants came back after it.
			beforeMidnight := start.Add(3*time.Minute + 50*time.Second)
			if got := l.Committed("acme", "", daily, beforeMidnight); got > limit {
				t.Errorf("%d committed in the day, above the limit %d", got, limit)
			}
			if got := l.Committed("acme", "", daily, now); got == 0 {
				t.Error("nothing spent on the new day: no slices granted after midnight")
			}
			if first != minSlice {
				t.Errorf("a router with no demand got a first slice of %d, want %d", first, minSlice)
			}
		})
	}
}

// TestBudgetExhaustedGrantsNothing: with the roll-up at the limit, every
// slice is 0; with it near, slices never pass what is left.
func TestBudgetExhaustedGrantsNothing(t *testing.T) {
	sc := scope("acme", monthly)
	k := keyOf(sc)
	l := limitsOf(sc, 10_000)
	a, now := settled(Config{})
	l.commits = []commit{{k, now, 9_500}}
	r1, r2 := &budgetRouter{name: "r1", demand: 600_000}, &budgetRouter{name: "r2", demand: 600_000}
	g1 := r1.lease(t, a, l, k, now)
	g2 := r2.lease(t, a, l, k, now)
	if g1.Share+g2.Share > 500 || g1.Share == 0 {
		t.Errorf("slices %d + %d of the 500 left", g1.Share, g2.Share)
	}
	l.commits = append(l.commits, commit{k, now, 500})
	now = now.Add(time.Second)
	r1.slices, r2.slices = nil, nil // spent, and committed above
	if g := r1.lease(t, a, l, k, now); g.Share != 0 {
		t.Errorf("a slice of %d with the budget spent", g.Share)
	}
}

// TestLeaseBounds: what the allocator refuses, naming the field or saying
// it is full, and that a refused request changes nothing.
func TestLeaseBounds(t *testing.T) {
	sc := scope("acme", rpm)
	l := limitsOf(sc, 100, scope("acme", concurrency), 10, scope("acme", daily), 1000,
		scope("acme", llmgwv1.LimitKind_LIMIT_KIND_INPUT_TPM), 1000, scope("acme", llmgwv1.LimitKind_LIMIT_KIND_OUTPUT_TPM), 1000)
	claim := func(s *llmgwv1.Scope) *llmgwv1.ShareClaim { return &llmgwv1.ShareClaim{Scope: s, Demand: 1} }
	req := func(router string, session uint64, cs ...*llmgwv1.ShareClaim) *llmgwv1.LeaseRequest {
		return &llmgwv1.LeaseRequest{Router: router, Session: session, Claims: cs}
	}
	var five []*llmgwv1.ShareClaim
	for range 5 {
		five = append(five, claim(sc))
	}
	tests := []struct {
		name      string
		req       *llmgwv1.LeaseRequest
		wantField string
		wantFull  bool
	}{
		{name: "no router", req: req("", 1, claim(sc)), wantField: "router"},
		{name: "too many claims", req: req("r1", 1, five...), wantField: "claims"},
		{name: "a claim without a scope", req: req("r1", 1, &llmgwv1.ShareClaim{}), wantField: "claims[0].scope"},
		{name: "a claim without a kind", req: req("r1", 1, claim(scope("acme", 0))), wantField: "claims[0].scope.kind"},
		{name: "a claim of an unknown kind", req: req("r1", 1, claim(scope("acme", 99))), wantField: "claims[0].scope.kind"},
		{name: "a scope claimed twice", req: req("r1", 1, claim(sc), claim(scope("acme", daily)), claim(sc)), wantField: "claims[2].scope"},
		{name: "a third session with two held", req: req("r3", 1, claim(sc)), wantFull: true},
		{name: "a session's scopes past MaxClaims", req: req("r1", 1, claim(scope("acme", daily)), claim(scope("acme", llmgwv1.LimitKind_LIMIT_KIND_INPUT_TPM)),
			claim(scope("acme", llmgwv1.LimitKind_LIMIT_KIND_OUTPUT_TPM))), wantFull: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, now := settled(Config{MaxSessions: 2, MaxClaims: 4})
			for _, r := range []string{"r1", "r2"} {
				if _, err := a.Lease(now, req(r, 1, claim(sc), claim(scope("acme", concurrency))), l); err != nil {
					t.Fatal(err)
				}
			}
			before := a.accounted(keyOf(sc), now)
			_, err := a.Lease(now, tt.req, l)
			var ve *fsm.ValidationError
			switch {
			case tt.wantField != "" && (!errors.As(err, &ve) || ve.Field != tt.wantField):
				t.Errorf("got %v, want a validation error of %s", err, tt.wantField)
			case tt.wantFull && !errors.Is(err, ErrFull):
				t.Errorf("got %v, want ErrFull", err)
			}
			if a.Sessions() != 2 || a.accounted(keyOf(sc), now) != before {
				t.Errorf("a refused request changed the tables: %d sessions, %d counted (was %d)", a.Sessions(), a.accounted(keyOf(sc), now), before)
			}
		})
	}
	t.Run("unknown scopes are left out, and keep nothing", func(t *testing.T) {
		a, now := settled(Config{MaxSessions: 2, MaxClaims: 4})
		resp, err := a.Lease(now, req("r1", 1, claim(scope("other", rpm)), claim(sc)), l)
		if err != nil || len(resp.Grants) != 1 || resp.Grants[0].Scope.Tenant != "acme" {
			t.Fatalf("got %v, %v: want acme's grant alone", resp, err)
		}
		if _, err := a.Lease(now, req("r2", 1, claim(scope("other", rpm))), l); err != nil || a.Sessions() != 1 {
			t.Errorf("a session of unknown scopes only: %v, %d sessions held, want 1", err, a.Sessions())
		}
	})
	t.Run("a session forgotten makes room", func(t *testing.T) {
		a, now := settled(Config{MaxSessions: 1})
		if _, err := a.Lease(now, req("r1", 1, claim(sc)), l); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Lease(now.Add(time.Second), req("r2", 1, claim(sc)), l); !errors.Is(err, ErrFull) {
			t.Fatalf("got %v, want ErrFull", err)
		}
		if _, err := a.Lease(now.Add(30*time.Second), req("r2", 1, claim(sc)), l); err != nil {
			t.Errorf("after Hold: %v", err)
		}
	})
}

// TestSaturating: limits, demands and holdings at the top of uint64 never
// wrap: shares stay within the limit.
func TestSaturating(t *testing.T) {
	for _, kind := range []llmgwv1.LimitKind{rpm, concurrency, daily} {
		sc := scope("acme", kind)
		l := &fakeLimits{limits: map[scopeKey]uint64{keyOf(sc): math.MaxUint64}}
		l.commits = []commit{{keyOf(sc), t0, math.MaxUint64}, {keyOf(sc), t0.Add(time.Second), math.MaxUint64}}
		a, now := settled(Config{})
		for i := range 3 {
			for _, r := range []string{"r1", "r2"} {
				resp, err := a.Lease(now.Add(time.Duration(i)*time.Second), &llmgwv1.LeaseRequest{Router: r, Session: 1, Claims: []*llmgwv1.ShareClaim{
					{Scope: sc, Held: math.MaxUint64, Demand: math.MaxUint64, GrantSeq: uint64(i)}}}, l)
				if err != nil {
					t.Fatal(err)
				}
				if g := resp.Grants[0]; g.Share > g.Limit {
					t.Errorf("%v: a share of %d above the limit %d", kind, g.Share, g.Limit)
				}
			}
		}
	}
}

// TestFairPart: the max-min fair division, whole units rounded down.
func TestFairPart(t *testing.T) {
	tests := []struct {
		total  uint64
		wants  []uint64
		spread bool
		want   []uint64
	}{
		{100, []uint64{70, 20, 10}, false, []uint64{70, 20, 10}},
		{100, []uint64{140, 40, 20}, false, []uint64{40, 40, 20}},
		{100, []uint64{35, 10, 5}, true, []uint64{51, 26, 21}},
		{100, []uint64{35, 10, 5}, false, []uint64{35, 10, 5}},
		{10, []uint64{5, 5, 5}, true, []uint64{3, 3, 3}},
		{0, []uint64{5, 5}, true, []uint64{0, 0}},
		{7, []uint64{0}, true, []uint64{7}},
		{math.MaxUint64, []uint64{math.MaxUint64, math.MaxUint64}, true, []uint64{math.MaxUint64 / 2, math.MaxUint64 / 2}},
	}
	for _, tt := range tests {
		var sum uint64
		for i, w := range tt.wants {
			got := fairPart(tt.total, tt.wants, w, tt.spread)
			if got != tt.want[i] {
				t.Errorf("fairPart(%d, %v, %d, %v) = %d, want %d", tt.total, tt.wants, w, tt.spread, got, tt.want[i])
			}
			sum = satAdd(sum, got)
		}
		if sum > tt.total {
			t.Errorf("fairPart(%d, %v): parts sum to %d", tt.total, tt.wants, sum)
		}
	}
}

// BenchmarkLease: one renewal of one of three routers claiming 20 scopes.
func BenchmarkLease(b *testing.B) {
	l := &fakeLimits{limits: map[scopeKey]uint64{}}
	var claims []*llmgwv1.ShareClaim
	kinds := []llmgwv1.LimitKind{rpm, llmgwv1.LimitKind_LIMIT_KIND_INPUT_TPM, llmgwv1.LimitKind_LIMIT_KIND_OUTPUT_TPM, concurrency, daily}
	for i := range 20 {
		sc := &llmgwv1.Scope{Tenant: fmt.Sprintf("t%d", i/5), Kind: kinds[i%5]}
		l.limits[keyOf(sc)] = 1_000_000
		claims = append(claims, &llmgwv1.ShareClaim{Scope: sc, Demand: uint64(1000 * (i + 1))})
	}
	a, now := settled(Config{})
	routers := []string{"r1", "r2", "r3"}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		req := &llmgwv1.LeaseRequest{Router: routers[i%3], Session: 1, Claims: claims}
		if _, err := a.Lease(now.Add(time.Duration(i)*time.Millisecond), req, l); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRatesRandomized: routers whose demands change at random and whose
// answers are lost one time in five never hold, with what they may hold of
// the grants they lost, more than the limit, for rates and the
// concurrency alike.
func TestRatesRandomized(t *testing.T) {
	for _, kind := range []llmgwv1.LimitKind{rpm, concurrency} {
		for seed := range uint64(20) {
			t.Run(fmt.Sprintf("%v seed %d", kind, seed), func(t *testing.T) {
				rnd := rand.New(rand.NewPCG(seed, 1))
				const limit = 97
				sc := scope("acme", kind)
				k := keyOf(sc)
				l := limitsOf(sc, limit)
				a, now := settled(Config{})
				routers := []*simRouter{newRouter("r1"), newRouter("r2"), newRouter("r3")}
				for step := range 300 {
					if step%10 == 0 {
						for _, r := range routers {
							r.demand[k] = rnd.Uint64N(2 * limit)
						}
					}
					for i, r := range routers {
						at := now.Add(time.Duration(i*300+rnd.IntN(300)) * time.Millisecond)
						r.lease(t, a, l, at, rnd.IntN(5) == 0)
						checkRates(t, a, routers, k, limit, at)
					}
					now = now.Add(time.Second)
				}
			})
		}
	}
}

// TestDefaults: a 5 s term; a new leader and a silent router's fallback
// both wait the term and 2 s more (design §7.7).
func TestDefaults(t *testing.T) {
	c := New(Config{}).Config()
	if c.Term != 5*time.Second || c.Settle != 7*time.Second || c.Hold != 7*time.Second || c.MaxSessions != 1024 || c.MaxClaims != 4096 {
		t.Errorf("defaults %+v", c)
	}
}
