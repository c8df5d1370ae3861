package console

import (
	"context"
	"math"
	"net/http"
	"time"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// The tenants page (design §7.7, §9): each tenant's limits, shadow flag
// and priority classes (design §7.8) from ListTenants, and what it used this hour, today and this month
// from the usage roll-up (Usage, the rows `llmgwctl usage` reads), with
// its budgets left. The roll-up is hourly and the routers send it in
// batches every few seconds, so "this hour" is the current rate's
// nearest figure the control plane holds; the live per-minute rates are
// the routers' own.

// Counts are usage summed over a period: the roll-up's UsageCounts.
type Counts struct {
	Requests      uint64 `json:"requests"`
	Refused       uint64 `json:"refused"`
	ShadowRefused uint64 `json:"shadow_refused"`
	InputTokens   uint64 `json:"input_tokens"`
	CachedTokens  uint64 `json:"cached_tokens"`
	OutputTokens  uint64 `json:"output_tokens"`
}

func (c *Counts) add(u *llmgwv1.UsageCounts) {
	c.Requests += u.GetRequests()
	c.Refused += u.GetRefused()
	c.ShadowRefused += u.GetShadowRefused()
	c.InputTokens += u.GetInputTokens()
	c.CachedTokens += u.GetCachedTokens()
	c.OutputTokens += u.GetOutputTokens()
}

// TenantUsage is one scope's use — a tenant, or one model of it — in the
// current UTC hour, day and month, and the budgets left.
type TenantUsage struct {
	Hour  Counts `json:"hour"`
	Today Counts `json:"today"`
	Month Counts `json:"month"`
	// DailyLeft and MonthlyLeft are the scope's daily (monthly) budget
	// minus today's (this month's) input + output tokens: negative when
	// spent beyond it (an output reservation's debt, paid back), nil
	// without a budget.
	DailyLeft   *int64 `json:"daily_left"`
	MonthlyLeft *int64 `json:"monthly_left"`
	// Models is the tenant's use by model (a scope's own has none).
	Models map[string]*TenantUsage `json:"models,omitempty"`
}

// TenantsUsage is the page's usage: by tenant name ("" for requests
// without a key), every tenant with a row this month or with limits.
type TenantsUsage struct {
	HourUnix  int64                   `json:"hour_unix"`
	DayUnix   int64                   `json:"day_unix"`
	MonthUnix int64                   `json:"month_unix"`
	Tenants   map[string]*TenantUsage `json:"tenants"`
}

// monthStart is the start of now's UTC month: what the roll-up is read
// from, as it holds the day and the hour too.
func monthStart(now time.Time) time.Time {
	now = now.UTC()
	return time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
}

// SumTenantsUsage sums rows (the roll-up from the month's start on) into
// each tenant's and each of its models' hour, day and month at now, and
// sets the budgets left of tenants' limits and per-model limits.
func SumTenantsUsage(tenants []*llmgwv1.Tenant, rows []*llmgwv1.UsageRow, now time.Time) TenantsUsage {
	now = now.UTC()
	month := monthStart(now).Unix()
	day := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC).Unix()
	hour := now.Truncate(time.Hour).Unix()
	out := TenantsUsage{HourUnix: hour, DayUnix: day, MonthUnix: month, Tenants: map[string]*TenantUsage{}}
	tenantOf := func(name string) *TenantUsage {
		t := out.Tenants[name]
		if t == nil {
			t = &TenantUsage{Models: map[string]*TenantUsage{}}
			out.Tenants[name] = t
		}
		return t
	}
	modelOf := func(t *TenantUsage, model string) *TenantUsage {
		m := t.Models[model]
		if m == nil {
			m = &TenantUsage{}
			t.Models[model] = m
		}
		return m
	}
	for _, r := range rows {
		if r.GetHourUnix() < month {
			continue
		}
		t := tenantOf(r.GetTenant())
		for _, u := range []*TenantUsage{t, modelOf(t, r.GetModel())} {
			u.Month.add(r.GetCounts())
			if r.GetHourUnix() >= day {
				u.Today.add(r.GetCounts())
			}
			if r.GetHourUnix() == hour {
				u.Hour.add(r.GetCounts())
			}
		}
	}
	for _, t := range tenants {
		u := tenantOf(t.GetName())
		u.setBudgets(t.GetLimits())
		for _, ml := range t.GetModelLimits() {
			modelOf(u, ml.GetModel()).setBudgets(ml.GetLimits())
		}
	}
	return out
}

// setBudgets sets the budgets left of a scope with limits l.
func (u *TenantUsage) setBudgets(l *llmgwv1.TenantLimits) {
	left := func(budget uint64, c Counts) *int64 {
		if budget == 0 {
			return nil
		}
		spent := c.InputTokens + c.OutputTokens
		if spent < c.InputTokens { // wrapped: beyond any budget
			spent = math.MaxUint64
		}
		var v int64
		if spent <= budget {
			v = int64(budget - spent) // budgets are at most fsm.MaxTokensLimit
		} else {
			v = -int64(min(spent-budget, math.MaxInt64))
		}
		return &v
	}
	u.DailyLeft = left(l.GetDailyTokens(), u.Today)
	u.MonthlyLeft = left(l.GetMonthlyTokens(), u.Month)
}

func (c *Console) tenants(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), c.timeout)
	defer cancel()
	p := newPage()
	list, err := c.admin.ListTenants(ctx, &llmgwv1.ListRequest{})
	p.add("tenants", list, err)
	now := c.now()
	usage, uerr := c.admin.Usage(ctx, &llmgwv1.UsageRequest{SinceUnix: monthStart(now).Unix()})
	if uerr != nil {
		p.add("usage", nil, uerr)
	} else {
		p.set("usage", SumTenantsUsage(list.GetTenants(), usage.GetRows(), now))
	}
	p.write(w, c.log)
}
