package quota

import (
	"slices"
	"strings"
	"time"

	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// State is the replicated state the limits are read from (*fsm.FSM):
// copies of tenants, and the roll-up's token sums.
type State interface {
	Tenant(name string) (*llmgwv1.Tenant, bool)
	UsageTokens(tenant, model string, fromUnix int64) uint64
}

var _ State = (*fsm.FSM)(nil)

// StateLimits are the Limits of the replicated state: a tenant's own
// limits for model "", a model's for a model it lists in model_limits.
type StateLimits struct{ State State }

// Limit is the scope's limit; ok is false for an unknown tenant, a model
// without limits of its own, or a limit of 0.
func (s StateLimits) Limit(scope *llmgwv1.Scope) (uint64, bool) {
	t, ok := s.State.Tenant(scope.GetTenant())
	if !ok {
		return 0, false
	}
	l := t.GetLimits()
	if scope.GetModel() != "" {
		i, found := slices.BinarySearchFunc(t.GetModelLimits(), scope.GetModel(), func(ml *llmgwv1.TenantModelLimits, m string) int {
			return strings.Compare(ml.GetModel(), m)
		})
		if !found {
			return 0, false
		}
		l = t.ModelLimits[i].GetLimits()
	}
	v := LimitOf(l, scope.GetKind())
	return v, v > 0
}

// Committed is the tokens of the roll-up since the start of the budget's
// UTC period holding now; 0 for a rate or the concurrency.
func (s StateLimits) Committed(tenant, model string, kind llmgwv1.LimitKind, now time.Time) uint64 {
	from, ok := PeriodStart(kind, now)
	if !ok {
		return 0
	}
	return s.State.UsageTokens(tenant, model, from.Unix())
}

// LimitOf is the limit of kind in l (0: none).
func LimitOf(l *llmgwv1.TenantLimits, kind llmgwv1.LimitKind) uint64 {
	switch kind {
	case llmgwv1.LimitKind_LIMIT_KIND_RPM:
		return l.GetRpm()
	case llmgwv1.LimitKind_LIMIT_KIND_INPUT_TPM:
		return l.GetInputTpm()
	case llmgwv1.LimitKind_LIMIT_KIND_OUTPUT_TPM:
		return l.GetOutputTpm()
	case llmgwv1.LimitKind_LIMIT_KIND_WEIGHTED_TPM:
		return l.GetWeightedTpm()
	case llmgwv1.LimitKind_LIMIT_KIND_CONCURRENCY:
		return l.GetConcurrency()
	case llmgwv1.LimitKind_LIMIT_KIND_DAILY_TOKENS:
		return l.GetDailyTokens()
	case llmgwv1.LimitKind_LIMIT_KIND_MONTHLY_TOKENS:
		return l.GetMonthlyTokens()
	}
	return 0
}

// PeriodStart is the start of the budget period holding now: the UTC day
// for DAILY_TOKENS, the UTC month for MONTHLY_TOKENS; ok is false for any
// other kind.
func PeriodStart(kind llmgwv1.LimitKind, now time.Time) (time.Time, bool) {
	y, m, d := now.UTC().Date()
	switch kind {
	case llmgwv1.LimitKind_LIMIT_KIND_DAILY_TOKENS:
		return time.Date(y, m, d, 0, 0, 0, 0, time.UTC), true
	case llmgwv1.LimitKind_LIMIT_KIND_MONTHLY_TOKENS:
		return time.Date(y, m, 1, 0, 0, 0, 0, time.UTC), true
	}
	return time.Time{}, false
}
