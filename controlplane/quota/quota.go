package quota

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sync"
	"time"

	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Config times and bounds the allocator; a field left 0 takes its default.
type Config struct {
	// Term is how long a grant holds, from when the router sent the
	// request (5 s: five renewals of a router, and the longest a dead
	// router's share is withheld from the others but Hold's margin).
	Term time.Duration
	// Settle is how long a newly elected leader grants nothing, while the
	// old leader's leases run out (Term + 2 s: a term, and a margin for an
	// old leader that has not yet noticed it lost office).
	Settle time.Duration
	// Hold is how long a router session that stopped renewing still
	// counts, at its fallback once its lease has ended (Term + 2 s: a
	// dead router's share is given back soon after its lease, and a
	// router cut off from every server for longer may add its fallback,
	// at most its last share, design §7.7).
	Hold time.Duration
	// MaxSessions bounds the router sessions held (1024).
	MaxSessions int
	// MaxClaims bounds the claims of one request and the scopes held for
	// one session (4096).
	MaxClaims int
}

// Defaults of Config.
const (
	DefaultTerm        = 5 * time.Second
	DefaultMaxSessions = 1024
	DefaultMaxClaims   = 4096
)

func (c Config) withDefaults() Config {
	if c.Term <= 0 {
		c.Term = DefaultTerm
	}
	if c.Settle <= 0 {
		c.Settle = c.Term + 2*time.Second
	}
	if c.Hold <= 0 {
		c.Hold = c.Term + 2*time.Second
	}
	if c.MaxSessions <= 0 {
		c.MaxSessions = DefaultMaxSessions
	}
	if c.MaxClaims <= 0 {
		c.MaxClaims = DefaultMaxClaims
	}
	return c
}

// minSlice is the budget slice a router with no demand yet is topped up
// to (at most its equal part of what is free), so its first request can
// pass.
const minSlice = 1000

// pruneEvery is how often Lease sweeps forgotten sessions out of the
// tables (a full table is swept at once).
const pruneEvery = time.Second

// ErrFull refuses what would make the allocator hold more than it may: a
// new router session when MaxSessions are held, or a session's scopes past
// MaxClaims (RESOURCE_EXHAUSTED). Nothing of the request is kept.
var ErrFull = errors.New("the leader holds as many shares as it may")

// Limits is what the allocator reads of the replicated state (StateLimits
// over package fsm).
type Limits interface {
	// Limit is the scope's limit; ok is false when its tenant or model
	// scope is unknown or the limit is 0 (none): nothing is granted.
	Limit(scope *llmgwv1.Scope) (limit uint64, ok bool)
	// Committed is what the roll-up holds against a budget: the tokens of
	// tenant (and model, "" for all) since the start of the UTC day or
	// month holding now; 0 for the other kinds.
	Committed(tenant, model string, kind llmgwv1.LimitKind, now time.Time) uint64
}

// Allocator grants router sessions their shares of the tenants' limits
// (see the package doc). It is safe for concurrent use.
type Allocator struct {
	cfg Config

	mu sync.Mutex
	// elected: this node leads, since electedAt; false, it answers
	// settling and keeps nothing.
	elected   bool
	electedAt time.Time
	// seq is the last grant's seq.
	seq uint64
	// sessions and scopes index the same holdings, by session and by
	// scope.
	sessions map[sessionKey]*session
	scopes   map[scopeKey]map[sessionKey]*holding
	prunedAt time.Time
}

type sessionKey struct {
	router  string
	session uint64
}

type scopeKey struct {
	tenant, model string
	kind          llmgwv1.LimitKind
}

type session struct {
	holdings map[scopeKey]*holding
}

// holding is one session's view of one scope, as the leader keeps it.
type holding struct {
	// heard is when the session last claimed the scope; held and demand
	// are what it said then.
	heard  time.Time
	held   uint64
	demand uint64
	// acked is the newest grant the session acknowledged (seq 0: none).
	acked grant
	// pending aggregates the grants issued since the last acknowledgment
	// of the newest one (seq 0: none): the newest's seq, share, fallback
	// and expiry, and the largest share and fallback and the sum of the
	// shares of them all.
	pending     grant
	shareMax    uint64
	fallbackMax uint64
	shareSum    uint64
	// exp is when the newest grant issued expires.
	exp time.Time
}

type grant struct {
	seq, share, fallback uint64
	exp                  time.Time
}

// New returns an allocator of a node that does not lead yet: it answers
// settling until Elected.
func New(cfg Config) *Allocator {
	return &Allocator{cfg: cfg.withDefaults(), sessions: map[sessionKey]*session{}, scopes: map[scopeKey]map[sessionKey]*holding{}}
}

// Config is the allocator's configuration, defaults filled in.
func (a *Allocator) Config() Config { return a.cfg }

// Elected is called when this node becomes leader: it forgets every
// session (leases of an earlier term of its own included) and grants
// nothing until Settle has passed.
func (a *Allocator) Elected(now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.elected, a.electedAt = true, now
	a.sessions, a.scopes = map[sessionKey]*session{}, map[scopeKey]map[sessionKey]*holding{}
	a.prunedAt = now
	if base := now.UnixNano(); base > 0 {
		a.seq = max(a.seq, uint64(base))
	}
}

// Resigned is called when this node's term as leader ends: it forgets
// every session and answers settling until the next Elected.
func (a *Allocator) Resigned() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.elected = false
	a.sessions, a.scopes = map[sessionKey]*session{}, map[scopeKey]map[sessionKey]*holding{}
}

// Settling reports whether a Lease at now would grant nothing: the node
// does not lead, or was elected less than Settle ago.
func (a *Allocator) Settling(now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.settlingLocked(now)
}

func (a *Allocator) settlingLocked(now time.Time) bool {
	return !a.elected || now.Before(a.electedAt.Add(a.cfg.Settle))
}

// Leading reports whether the allocator is between Elected and Resigned.
func (a *Allocator) Leading() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.elected
}

// Sessions is the number of router sessions held.
func (a *Allocator) Sessions() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.sessions)
}

// Lease answers a router's renewal at now: a grant for every claimed scope
// whose limit exists (see the package doc), none while settling. A
// request out of bounds is refused with an *fsm.ValidationError naming
// the field, one the allocator may not hold with ErrFull; either changes
// nothing.
func (a *Allocator) Lease(now time.Time, req *llmgwv1.LeaseRequest, limits Limits) (*llmgwv1.LeaseResponse, error) {
	if err := a.check(req); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	resp := &llmgwv1.LeaseResponse{TermMs: a.cfg.Term.Milliseconds(), Settling: a.settlingLocked(now)}
	if !a.elected {
		return resp, nil
	}
	if now.Sub(a.prunedAt) >= pruneEvery || now.Before(a.prunedAt) {
		a.pruneLocked(now)
	}

	// Which claims count, and room for what they add, before anything
	// changes.
	sk := sessionKey{req.GetRouter(), req.GetSession()}
	s := a.sessions[sk]
	type counted struct {
		claim *llmgwv1.ShareClaim
		key   scopeKey
		limit uint64
	}
	claims := make([]counted, 0, len(req.GetClaims()))
	added := 0
	for _, c := range req.GetClaims() {
		limit, ok := limits.Limit(c.GetScope())
		if !ok {
			continue
		}
		k := keyOf(c.GetScope())
		if s == nil || s.holdings[k] == nil {
			added++
		}
		claims = append(claims, counted{c, k, limit})
	}
	if len(claims) == 0 {
		return resp, nil
	}
	if s == nil && len(a.sessions) >= a.cfg.MaxSessions {
		a.pruneLocked(now)
		if len(a.sessions) >= a.cfg.MaxSessions {
			return nil, fmt.Errorf("router %s: %w: the shares of %d router sessions, the most it may; this one's are not kept", sk.router, ErrFull, a.cfg.MaxSessions)
		}
	}
	if s != nil && len(s.holdings)+added > a.cfg.MaxClaims {
		return nil, fmt.Errorf("router %s: %w: this session's shares of %d scopes, and %d more claimed; at most %d", sk.router, ErrFull, len(s.holdings), added, a.cfg.MaxClaims)
	}
	if s == nil {
		s = &session{holdings: make(map[scopeKey]*holding, len(claims))}
		a.sessions[sk] = s
	}

	for _, c := range claims {
		h := s.holdings[c.key]
		if h == nil {
			h = &holding{}
			s.holdings[c.key] = h
			if a.scopes[c.key] == nil {
				a.scopes[c.key] = map[sessionKey]*holding{}
			}
			a.scopes[c.key][sk] = h
		}
		h.observe(c.claim, now)
		if resp.Settling {
			continue
		}
		var share, fallback uint64
		if isBudget(c.key.kind) {
			share = a.budgetShare(c.key, h, c.limit, limits.Committed(c.key.tenant, c.key.model, c.key.kind, now), now)
		} else {
			share, fallback = a.rateShare(c.key, h, c.limit, now)
		}
		a.seq++
		h.issue(grant{seq: a.seq, share: share, fallback: fallback, exp: now.Add(a.cfg.Term)})
		resp.Grants = append(resp.Grants, &llmgwv1.ShareGrant{Scope: c.claim.GetScope(), Seq: a.seq, Share: share, Fallback: fallback, Limit: c.limit})
	}
	return resp, nil
}

// check checks a request's shape; the error names the field.
func (a *Allocator) check(req *llmgwv1.LeaseRequest) error {
	if req.GetRouter() == "" {
		return invalid("router", "required")
	}
	if n := len(req.GetClaims()); n > a.cfg.MaxClaims {
		return invalid("claims", "at most %d, got %d", a.cfg.MaxClaims, n)
	}
	seen := make(map[scopeKey]int, len(req.GetClaims()))
	for i, c := range req.GetClaims() {
		sc := c.GetScope()
		if sc == nil {
			return invalid(fmt.Sprintf("claims[%d].scope", i), "required")
		}
		if sc.GetKind() <= llmgwv1.LimitKind_LIMIT_KIND_UNSPECIFIED || sc.GetKind() > llmgwv1.LimitKind_LIMIT_KIND_MONTHLY_TOKENS {
			return invalid(fmt.Sprintf("claims[%d].scope.kind", i), "a limit kind is required, got %v", sc.GetKind())
		}
		k := keyOf(sc)
		if j, dup := seen[k]; dup {
			return invalid(fmt.Sprintf("claims[%d].scope", i), "the same scope as claims[%d]", j)
		}
		seen[k] = i
	}
	return nil
}

func invalid(field, format string, args ...any) error {
	return &fsm.ValidationError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

func keyOf(s *llmgwv1.Scope) scopeKey {
	return scopeKey{tenant: s.GetTenant(), model: s.GetModel(), kind: s.GetKind()}
}

// isBudget tells the budgets (slices of tokens added to what the router
// holds) from the rates and the concurrency (shares in force).
func isBudget(k llmgwv1.LimitKind) bool {
	return k == llmgwv1.LimitKind_LIMIT_KIND_DAILY_TOKENS || k == llmgwv1.LimitKind_LIMIT_KIND_MONTHLY_TOKENS
}

// observe takes a claim: a grant_seq equal to the newest grant's
// acknowledges it, and with it every grant issued before.
func (h *holding) observe(c *llmgwv1.ShareClaim, now time.Time) {
	if g := c.GetGrantSeq(); h.pending.seq != 0 && g == h.pending.seq {
		h.acked = h.pending
		h.pending, h.shareMax, h.fallbackMax, h.shareSum = grant{}, 0, 0, 0
	}
	h.heard, h.held, h.demand = now, c.GetHeld(), c.GetDemand()
}

// issue records a grant given to the session.
func (h *holding) issue(g grant) {
	h.pending = g
	h.shareMax = max(h.shareMax, g.share)
	h.fallbackMax = max(h.fallbackMax, g.fallback)
	h.shareSum = satAdd(h.shareSum, g.share)
	h.exp = g.exp
}

// rateAccounted is the largest rate or concurrency share that may be in
// force at the session at now.
func (h *holding) rateAccounted(now time.Time) uint64 {
	var acc uint64
	if h.acked.seq != 0 {
		if now.Before(h.acked.exp) {
			acc = h.acked.share
		} else {
			acc = h.acked.fallback
		}
	}
	switch {
	case h.pending.seq != 0 && now.Before(h.pending.exp):
		// It may have the newest grant or not: the larger.
		acc = max(acc, h.held, h.shareMax)
	case h.pending.seq != 0:
		acc = max(acc, h.fallbackMax)
		if h.acked.seq == 0 {
			acc = max(acc, h.held)
		}
	case h.acked.seq == 0:
		// No grant of this leader: what it says it holds.
		acc = max(acc, h.held)
	}
	return acc
}

// budgetAccounted is what the session may hold of a budget: what it said
// it holds, and every slice issued it has not acknowledged.
func (h *holding) budgetAccounted() uint64 { return satAdd(h.held, h.shareSum) }

func (h *holding) accounted(kind llmgwv1.LimitKind, now time.Time) uint64 {
	if isBudget(kind) {
		return h.budgetAccounted()
	}
	return h.rateAccounted(now)
}

// live: the session claimed the scope within a term, so its lease may be
// renewed; its demand counts.
func (a *Allocator) live(h *holding, now time.Time) bool { return now.Before(h.heard.Add(a.cfg.Term)) }

// heardWithin: within Hold, the session counts for the fallback.
func (a *Allocator) heardWithin(h *holding, now time.Time) bool {
	return now.Before(h.heard.Add(a.cfg.Hold))
}

// forgotten: its newest grant has expired and Hold has passed since the
// session was last heard from: nothing of it counts any more.
func (a *Allocator) forgotten(h *holding, now time.Time) bool {
	return !a.heardWithin(h, now) && !now.Before(h.exp)
}

// rateShare is the caller's grant of a rate or the concurrency: its
// max-min fair part of the limit left by the sessions that are not live,
// over the live sessions' demands, capped by what the accounting of the
// others leaves; and the fallback, the limit over the sessions heard from
// within Hold, at most the share.
func (a *Allocator) rateShare(k scopeKey, self *holding, limit uint64, now time.Time) (share, fallback uint64) {
	var others, fixed uint64
	wants := []uint64{self.demand}
	heard := uint64(1)
	for _, h := range a.scopes[k] {
		if h == self || a.forgotten(h, now) {
			continue
		}
		if a.heardWithin(h, now) {
			heard++
		}
		acc := h.rateAccounted(now)
		others = satAdd(others, acc)
		if a.live(h, now) {
			wants = append(wants, h.demand)
		} else {
			fixed = satAdd(fixed, acc)
		}
	}
	target := fairPart(satSub(limit, fixed), wants, self.demand, true)
	share = min(target, satSub(limit, others))
	// The fallback never exceeds the share it follows: the others' leases
	// were granted against that share, and run on for up to a term after
	// this one's ended.
	return share, min(share, limit/heard)
}

// budgetShare is the caller's new slice of a budget: what it needs for two
// terms at its demand less what it holds, at most its max-min fair part of
// what is free.
func (a *Allocator) budgetShare(k scopeKey, self *holding, limit, committed uint64, now time.Time) uint64 {
	var outstanding uint64
	live := []*holding{self}
	for _, h := range a.scopes[k] {
		if a.forgotten(h, now) && h != self {
			continue
		}
		outstanding = satAdd(outstanding, h.budgetAccounted())
		if h != self && a.live(h, now) {
			live = append(live, h)
		}
	}
	free := satSub(satSub(limit, committed), outstanding)
	least := min(minSlice, free/uint64(len(live)))
	want := func(h *holding) uint64 {
		need := max(mulDiv(h.demand, uint64(2*a.cfg.Term), uint64(time.Minute)), least)
		return satSub(need, h.held)
	}
	wants := make([]uint64, len(live))
	for i, h := range live {
		wants[i] = want(h)
	}
	return fairPart(free, wants, wants[0], false)
}

// pruneLocked forgets the holdings and sessions that count no more.
func (a *Allocator) pruneLocked(now time.Time) {
	a.prunedAt = now
	for sk, s := range a.sessions {
		for k, h := range s.holdings {
			if a.forgotten(h, now) {
				delete(s.holdings, k)
				delete(a.scopes[k], sk)
				if len(a.scopes[k]) == 0 {
					delete(a.scopes, k)
				}
			}
		}
		if len(s.holdings) == 0 {
			delete(a.sessions, sk)
		}
	}
}

// fairPart is the part of total that a want of self gets in the max-min
// fair division of total over wants (self's want among them), in whole
// units, rounded down. With spread, what the wants leave is divided
// equally over them all. The parts of all wants never sum past total.
func fairPart(total uint64, wants []uint64, self uint64, spread bool) uint64 {
	sorted := slices.Clone(wants)
	slices.Sort(sorted)
	left := total
	for j, w := range sorted {
		level := left / uint64(len(sorted)-j)
		if w > level {
			// Every want from here on is capped at the level.
			return min(self, level)
		}
		left -= w
	}
	if spread {
		return satAdd(self, left/uint64(len(sorted)))
	}
	return self
}

func satAdd(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}

func satSub(a, b uint64) uint64 {
	if b >= a {
		return 0
	}
	return a - b
}

// mulDiv is a × b / c rounded down, saturating.
func mulDiv(a, b, c uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	if hi >= c {
		return math.MaxUint64
	}
	q, _ := bits.Div64(hi, lo, c)
	return q
}
