package quota

import (
	"math"
	"time"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// kind is one limit of llmgwv1.TenantLimits, as the scope's index.
type kind uint8

const (
	kindRPM kind = iota
	kindInputTPM
	kindOutputTPM
	kindWeightedTPM
	kindConcurrency
	kindDaily
	kindMonthly
	numKinds
)

func (k kind) proto() llmgwv1.LimitKind { return llmgwv1.LimitKind(k + 1) }

func kindOf(k llmgwv1.LimitKind) (kind, bool) {
	if k <= llmgwv1.LimitKind_LIMIT_KIND_UNSPECIFIED || k > llmgwv1.LimitKind_LIMIT_KIND_MONTHLY_TOKENS {
		return 0, false
	}
	return kind(k - 1), true
}

func (k kind) rate() bool   { return k <= kindWeightedTPM }
func (k kind) budget() bool { return k == kindDaily || k == kindMonthly }

// name is the limit as the tenant's flags and OpenAI's messages call it.
func (k kind) name() string {
	return [...]string{"requests per minute", "input tokens per minute", "output tokens per minute",
		"weighted tokens per minute", "concurrent requests", "daily tokens", "monthly tokens"}[k]
}

// limitOf reads kind k of l (0: none).
func limitOf(l *llmgwv1.TenantLimits, k kind) uint64 {
	switch k {
	case kindRPM:
		return l.GetRpm()
	case kindInputTPM:
		return l.GetInputTpm()
	case kindOutputTPM:
		return l.GetOutputTpm()
	case kindWeightedTPM:
		return l.GetWeightedTpm()
	case kindConcurrency:
		return l.GetConcurrency()
	case kindDaily:
		return l.GetDailyTokens()
	case kindMonthly:
		return l.GetMonthlyTokens()
	}
	return 0
}

// burst is how much of a rate's share a bucket holds when full: two
// seconds of it, so a minute admits its share within a couple of seconds'
// worth, and a request larger than that still passes on a full bucket
// (into debt, paid back before the next).
const burst = 2.0 / 60

// scope is one limit of one tenant (model "" for the tenant's own) as this
// router holds it: its share of the fleet's limit, leased from the
// leader, and what it has used of it. Guarded by its tenant's mutex.
type scope struct {
	model string
	kind  kind
	// limit is the fleet's limit as the tenant's definition says.
	limit uint64

	// The lease: share in force until expires, then fallback. seq is the
	// newest grant's; granted false until the first.
	granted  bool
	share    float64
	fallback float64
	expires  time.Time
	seq      uint64

	// Rates: a token bucket refilled at share per minute.
	level  float64
	filled time.Time
	// Concurrency: requests in flight here.
	inflight float64
	// Budgets: the slices' unspent tokens (void at expires), the period
	// they are of, and reservations in flight.
	remaining float64
	period    int64
	reserved  float64

	// Demand since the last claim: units asked (admitted or refused), or
	// for concurrency the peak of in flight plus refused.
	asked   float64
	peak    float64
	claimed time.Time
	// exhausted: the last grant of a budget was empty while it was asked
	// for, so a refusal waits for the period's end rather than a second.
	exhausted bool
}

// inForce is the share that holds at now: the lease's, its fallback once
// it ended, nothing before the first grant.
func (s *scope) inForce(now time.Time) float64 {
	switch {
	case !s.granted:
		return 0
	case now.Before(s.expires):
		return s.share
	}
	return s.fallback
}

// refill brings a rate's bucket to now.
func (s *scope) refill(now time.Time, share float64) {
	capacity := share * burst
	if !s.filled.IsZero() {
		if dt := now.Sub(s.filled).Seconds(); dt > 0 {
			s.level += share / 60 * dt
		}
	} else {
		s.level = capacity
	}
	s.level = min(s.level, capacity)
	s.filled = now
}

// budgetValid drops a budget's slices once expired or of another period.
func (s *scope) budgetValid(now time.Time) {
	p := periodOf(s.kind, now)
	if p != s.period || !now.Before(s.expires) {
		s.remaining = 0
		s.period = p
	}
}

// verdict is one scope's answer to a request costing cost units.
type verdict struct {
	ok    bool
	retry time.Duration
}

// check decides cost against the scope at now without changing it.
func (s *scope) check(now time.Time, cost float64) verdict {
	share := s.inForce(now)
	switch {
	case s.kind.rate():
		s.refill(now, share)
		capacity := share * burst
		if share > 0 && (s.level >= cost || s.level >= capacity) {
			return verdict{ok: true}
		}
		need := min(cost, capacity)
		if share <= 0 {
			return verdict{retry: time.Second}
		}
		return verdict{retry: time.Duration((need - s.level) / (share / 60) * float64(time.Second))}
	case s.kind == kindConcurrency:
		if s.inflight+cost <= math.Floor(share) {
			return verdict{ok: true}
		}
		return verdict{retry: time.Second}
	default:
		s.budgetValid(now)
		if s.remaining >= cost {
			return verdict{ok: true}
		}
		if s.exhausted {
			return verdict{retry: periodEnd(s.kind, now).Sub(now)}
		}
		return verdict{retry: time.Second}
	}
}

// take reserves cost (after every scope's check passed).
func (s *scope) take(cost float64) {
	switch {
	case s.kind.rate():
		s.level -= cost
	case s.kind == kindConcurrency:
		s.inflight += cost
		s.peak = max(s.peak, s.inflight)
	default:
		s.remaining -= cost
		s.reserved += cost
	}
}

// settle replaces a reservation of reserved units by what was used.
func (s *scope) settle(now time.Time, reserved, used float64) {
	switch {
	case s.kind.rate():
		s.level -= used - reserved // into debt, or back into the bucket
	case s.kind == kindConcurrency:
		s.inflight = max(0, s.inflight-reserved)
	default:
		s.reserved = max(0, s.reserved-reserved)
		if p := periodOf(s.kind, now); p == s.period && now.Before(s.expires) {
			s.remaining += reserved - used
		} else if used > reserved {
			// The slices it came from are gone; the overrun is owed to
			// the next one.
			s.remaining = -(used - reserved)
			s.period = p
		}
	}
}

// periodOf is a budget's UTC day or month at now, as a number.
func periodOf(k kind, now time.Time) int64 {
	u := now.UTC()
	if k == kindDaily {
		return u.Unix() / 86400
	}
	return int64(u.Year())*12 + int64(u.Month())
}

// periodEnd is when the budget's period at now ends.
func periodEnd(k kind, now time.Time) time.Time {
	u := now.UTC()
	if k == kindDaily {
		return time.Date(u.Year(), u.Month(), u.Day()+1, 0, 0, 0, 0, time.UTC)
	}
	return time.Date(u.Year(), u.Month()+1, 1, 0, 0, 0, 0, time.UTC)
}
