package fsm

import (
	"cmp"
	"fmt"
	"math"
	"regexp"
	"slices"

	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Tenants and the usage roll-up (design §7.7). A tenant is a team or an
// application sharing the fleet: the models its keys may use, its limits
// (per-minute rates, a concurrency cap, daily and monthly token budgets),
// per-model limits held in addition to its own, and a shadow flag. Keys
// belong to a tenant; a key without one belongs to the tenant named like
// the key, which has no limits until an operator creates it, so keys made
// before tenants existed keep working unchanged (EffectiveTenant).
//
// The roll-up is per tenant × model × UTC hour. Routers meter requests
// and tokens and send batches through the leader (RECORD_USAGE): one Raft
// write per router and interval, never one per request. Each batch carries
// (router, session, seq), and a session's cursor applies each seq once, so
// a batch sent again after a lost answer or a leader change adds nothing.
//
// Decisions where the design is silent:
//   - A tenant is replaced whole by an update (llmgwctl sends every field
//     it knows); a key's tenant moves only through SET_API_KEY_TENANT.
//   - A tenant's priority classes (design §7.8) are checked for their
//     shape only: the classes are the routers' flow.classes, a list the
//     control plane does not hold, so a name no router knows is stored
//     and each router treats it as its configuration says.
//   - A tenant a key belongs to cannot be deleted: move or revoke the keys
//     first, so no key is left pointing at nothing.
//   - Rows and cursors older than UsageRetentionHours, counted back from
//     the newest hour any batch has carried, are dropped as batches arrive:
//     the roll-up's size is bounded by tenants × models × retention and
//     applying stays a function of the log alone.

// Bounds of a tenant and of a usage batch, so an entry and every copy of
// the state stay small, and a limit cannot be a typo of many digits.
const (
	MaxTenantModelLimits = 256
	// MaxTokensLimit bounds every token limit (a trillion tokens a minute
	// or a month is beyond any fleet); MaxRequestsLimit the request rate
	// and MaxConcurrencyLimit the concurrency.
	MaxTokensLimit      = 1_000_000_000_000
	MaxRequestsLimit    = 100_000_000
	MaxConcurrencyLimit = 1_000_000
	// MaxWeightMilli is a weight of 1000 ×.
	MaxWeightMilli = 1_000_000
	// MaxUsageRows bounds one batch: a router's tenants × models × the
	// hours of one flush interval.
	MaxUsageRows = 8192
	// UsageRetentionHours keeps two full months of hours, for monthly
	// budgets and last month's bill.
	UsageRetentionHours = 62 * 24
	// usageCursorHours drops the cursor of a router session silent for two
	// days.
	usageCursorHours = 48
)

const (
	// ClassPattern is what a priority class's name must match (a tenant's
	// default_class and max_class, the routers' flow.classes): it becomes
	// a metric label and an x-llmgw-priority header's value, so it stays
	// short and plain.
	ClassPattern = `[a-z][a-z0-9_-]*`
	// MaxClassLen bounds a class's name, in bytes.
	MaxClassLen = 32
)

var classRE = regexp.MustCompile(`^` + ClassPattern + `$`)

// EffectiveTenant is the tenant a key's requests count against: its own,
// or the one named like the key. A request without a key (keys not
// required) counts against "", the anonymous tenant, which has no limits.
func EffectiveTenant(k *llmgwv1.ApiKey) string {
	if k == nil {
		return ""
	}
	if k.GetTenant() != "" {
		return k.GetTenant()
	}
	return k.GetName()
}

// ValidateTenant checks a tenant's shape as a create or update gives it:
// a name like a model's, model names each once, limits within bounds,
// per-model limits sorted by model, each once, priority classes empty or
// of the class shape (ValidateClass). Field names are the
// flags' spelling with underscores (input_tpm for --input-tpm), so
// llmgwctl can name the flag. llmgwctl, the AdminService and Apply run it
// alike.
func ValidateTenant(t *llmgwv1.Tenant) error {
	if t == nil {
		return invalid("tenant", "required")
	}
	if err := checkName("name", t.GetName()); err != nil {
		return err
	}
	if err := checkModelList("models", t.GetModels()); err != nil {
		return err
	}
	if err := ValidateLimits("", t.GetLimits()); err != nil {
		return err
	}
	if n := len(t.GetModelLimits()); n > MaxTenantModelLimits {
		return invalid("model_limits", "at most %d, got %d", MaxTenantModelLimits, n)
	}
	for i, ml := range t.GetModelLimits() {
		field := fmt.Sprintf("model_limits[%d]", i)
		if err := checkName(field+".model", ml.GetModel()); err != nil {
			return err
		}
		if i > 0 && t.ModelLimits[i-1].GetModel() >= ml.GetModel() {
			return invalid(field+".model", "must be sorted by model, each once; %q follows %q", ml.GetModel(), t.ModelLimits[i-1].GetModel())
		}
		if err := ValidateLimits(field+".", ml.GetLimits()); err != nil {
			return err
		}
	}
	if w := t.GetWeights(); w != nil {
		for _, f := range []struct {
			name string
			v    uint32
		}{{"weights.input", w.InputMilli}, {"weights.cached", w.CachedMilli}, {"weights.output", w.OutputMilli}} {
			if f.v > MaxWeightMilli {
				return invalid(f.name, "at most %d (1000 ×), got %.3f", MaxWeightMilli/1000, float64(f.v)/1000)
			}
		}
		if w.InputMilli == 0 && w.CachedMilli == 0 && w.OutputMilli == 0 {
			return invalid("weights", "at least one weight must be above 0")
		}
	}
	if err := ValidateClass("default_class", t.GetDefaultClass()); err != nil {
		return err
	}
	return ValidateClass("max_class", t.GetMaxClass())
}

// ValidateClass checks a priority class's name as field gives it: empty
// (the routers' default), or ClassPattern within MaxClassLen bytes. Only
// the shape: which classes exist is the routers' configuration.
func ValidateClass(field, name string) error {
	if name == "" {
		return nil
	}
	if len(name) > MaxClassLen || !classRE.MatchString(name) {
		return invalid(field, "must match %s and be at most %d characters, got %q", ClassPattern, MaxClassLen, name)
	}
	return nil
}

// ValidateLimits checks one scope's limits; prefix goes before each field
// name ("model_limits[0]." for a model's).
func ValidateLimits(prefix string, l *llmgwv1.TenantLimits) error {
	for _, f := range []struct {
		name string
		v    uint64
		max  uint64
	}{
		{"rpm", l.GetRpm(), MaxRequestsLimit},
		{"input_tpm", l.GetInputTpm(), MaxTokensLimit},
		{"output_tpm", l.GetOutputTpm(), MaxTokensLimit},
		{"weighted_tpm", l.GetWeightedTpm(), MaxTokensLimit},
		{"concurrency", l.GetConcurrency(), MaxConcurrencyLimit},
		{"daily_tokens", l.GetDailyTokens(), MaxTokensLimit},
		{"monthly_tokens", l.GetMonthlyTokens(), MaxTokensLimit},
	} {
		if f.v > f.max {
			return invalid(prefix+f.name, "at most %d, got %d", f.max, f.v)
		}
	}
	if d, m := l.GetDailyTokens(), l.GetMonthlyTokens(); d > 0 && m > 0 && d > m {
		return invalid(prefix+"daily_tokens", "%d is above monthly_tokens %d: a day is part of its month", d, m)
	}
	return nil
}

// checkModelList checks a list of model names: the name shape, each once,
// at most MaxAPIKeyModels.
func checkModelList(field string, models []string) error {
	if len(models) > MaxAPIKeyModels {
		return invalid(field, "at most %d, got %d", MaxAPIKeyModels, len(models))
	}
	seen := map[string]bool{}
	for i, m := range models {
		if err := checkName(fmt.Sprintf("%s[%d]", field, i), m); err != nil {
			return err
		}
		if seen[m] {
			return invalid(fmt.Sprintf("%s[%d]", field, i), "%q is listed twice", m)
		}
		seen[m] = true
	}
	return nil
}

// putTenant creates or replaces a tenant.
func (a *applier) putTenant(p *llmgwv1.PutTenantCommand) (any, error) {
	if err := ValidateTenant(p.GetTenant()); err != nil {
		return nil, err
	}
	t := proto.Clone(p.Tenant).(*llmgwv1.Tenant)
	old, exists := a.f.tenants[t.Name]
	switch {
	case p.Create && exists:
		return nil, fmt.Errorf("tenant %q: %w", t.Name, ErrExists)
	case !p.Create && !exists:
		return nil, fmt.Errorf("tenant %q: %w", t.Name, ErrNotFound)
	}
	if exists {
		t.CreatedUnix = old.CreatedUnix
	} else if t.CreatedUnix == 0 {
		t.CreatedUnix = a.at
	}
	t.Revision = a.index
	a.f.tenants[t.Name] = t
	a.put(t)
	return proto.Clone(t), nil
}

// deleteTenant deletes a tenant no key belongs to.
func (a *applier) deleteTenant(p *llmgwv1.DeleteTenantCommand) (any, error) {
	if _, ok := a.f.tenants[p.GetName()]; !ok {
		return nil, fmt.Errorf("tenant %q: %w", p.GetName(), ErrNotFound)
	}
	var keys []string
	for _, k := range sortedValues(a.f.apiKeys, func(k *llmgwv1.ApiKey) string { return k.Name }) {
		if k.GetTenant() == p.Name {
			keys = append(keys, k.Name)
		}
	}
	if len(keys) > 0 {
		return nil, fmt.Errorf("tenant %q: keys %v belong to it; move them (llmgwctl apikey update NAME --tenant T) or revoke them first: %w", p.Name, keys, ErrConflict)
	}
	delete(a.f.tenants, p.Name)
	a.del(&llmgwv1.Tenant{Name: p.Name})
	return nil, nil
}

// setAPIKeyTenant moves a key to a tenant that exists, or to its own ("").
func (a *applier) setAPIKeyTenant(p *llmgwv1.SetApiKeyTenantCommand) (any, error) {
	k, ok := a.f.apiKeys[p.GetName()]
	if !ok {
		return nil, fmt.Errorf("api key %q: %w", p.GetName(), ErrNotFound)
	}
	if err := a.checkKeyTenant(p.GetTenant()); err != nil {
		return nil, err
	}
	k = proto.Clone(k).(*llmgwv1.ApiKey)
	k.Tenant, k.Revision = p.Tenant, a.index
	a.f.apiKeys[k.Name] = k
	a.put(k)
	return proto.Clone(k), nil
}

// checkKeyTenant refuses a key's tenant that does not exist ("" is the
// key's own and always does).
func (a *applier) checkKeyTenant(tenant string) error {
	if tenant == "" {
		return nil
	}
	if _, ok := a.f.tenants[tenant]; !ok {
		return fmt.Errorf("tenant %q: create it first (llmgwctl tenant create): %w", tenant, ErrNotFound)
	}
	return nil
}

// usageKey is a roll-up row's identity.
type usageKey struct {
	tenant, model string
	hour          int64
}

// cursorKey is a router session's.
type cursorKey struct {
	router  string
	session uint64
}

// ValidateUsageBatch checks a batch's shape: its source, a sequence above
// 0, a bounded number of rows, each of a tenant ("" for requests without
// a key) and model of the name shape ("" for a name that resolved to no
// model) on an hour boundary.
func ValidateUsageBatch(p *llmgwv1.RecordUsageCommand) error {
	if p.GetRouter() == "" || len(p.GetRouter()) > MaxNameLen {
		return invalid("router", "required, at most %d characters", MaxNameLen)
	}
	if p.GetSeq() == 0 {
		return invalid("seq", "must be above 0")
	}
	if n := len(p.GetRows()); n > MaxUsageRows {
		return invalid("rows", "at most %d, got %d", MaxUsageRows, n)
	}
	for i, r := range p.GetRows() {
		field := fmt.Sprintf("rows[%d]", i)
		if r.GetTenant() != "" {
			if err := checkName(field+".tenant", r.GetTenant()); err != nil {
				return err
			}
		}
		if r.GetModel() != "" {
			if err := checkName(field+".model", r.GetModel()); err != nil {
				return err
			}
		}
		if r.GetHourUnix() <= 0 || r.GetHourUnix()%3600 != 0 {
			return invalid(field+".hour_unix", "must be a positive multiple of 3600, got %d", r.GetHourUnix())
		}
	}
	return nil
}

// recordUsage adds a batch to the roll-up once. It returns whether it was
// applied (false: the session's cursor was at or past seq already).
func (a *applier) recordUsage(p *llmgwv1.RecordUsageCommand) (any, error) {
	if err := ValidateUsageBatch(p); err != nil {
		return nil, err
	}
	// An hour ahead of the entry's own time (a router with a bad clock)
	// would count as the newest and prune the whole roll-up: refused.
	// The entry's time is the log's, the same on every server.
	if a.at > 0 {
		for i, r := range p.Rows {
			if r.HourUnix > a.at+3600 {
				return nil, invalid(fmt.Sprintf("rows[%d].hour_unix", i), "%d is ahead of the leader's clock (%d): check the router's clock", r.HourUnix, a.at)
			}
		}
	}
	ck := cursorKey{p.Router, p.Session}
	cur := a.f.usageCursors[ck]
	if cur != nil && cur.Seq >= p.Seq {
		return false, nil
	}
	newest := int64(0)
	for _, r := range p.Rows {
		newest = max(newest, r.HourUnix)
	}
	if cur == nil {
		cur = &llmgwv1.UsageCursor{Router: p.Router, Session: p.Session}
		a.f.usageCursors[ck] = cur
	}
	cur.Seq = p.Seq
	cur.HourUnix = max(cur.HourUnix, newest)
	for _, r := range p.Rows {
		k := usageKey{r.Tenant, r.Model, r.HourUnix}
		row := a.f.usage[k]
		if row == nil {
			row = &llmgwv1.UsageRow{Tenant: r.Tenant, Model: r.Model, HourUnix: r.HourUnix, Counts: &llmgwv1.UsageCounts{}}
			a.f.usage[k] = row
		}
		AddUsage(row.Counts, r.GetCounts())
	}
	if newest > a.f.usageNewest {
		a.f.usageNewest = newest
		a.f.pruneUsage()
	}
	return true, nil
}

// AddUsage adds c to into, saturating rather than wrapping.
func AddUsage(into, c *llmgwv1.UsageCounts) {
	into.Requests = satAdd(into.Requests, c.GetRequests())
	into.Refused = satAdd(into.Refused, c.GetRefused())
	into.ShadowRefused = satAdd(into.ShadowRefused, c.GetShadowRefused())
	into.InputTokens = satAdd(into.InputTokens, c.GetInputTokens())
	into.CachedTokens = satAdd(into.CachedTokens, c.GetCachedTokens())
	into.OutputTokens = satAdd(into.OutputTokens, c.GetOutputTokens())
}

func satAdd(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}

// pruneUsage drops rows and cursors past the retention, counted from the
// newest hour applied.
func (f *FSM) pruneUsage() {
	rowsFrom := f.usageNewest - UsageRetentionHours*3600
	for k := range f.usage {
		if k.hour < rowsFrom {
			delete(f.usage, k)
		}
	}
	cursorsFrom := f.usageNewest - usageCursorHours*3600
	for k, c := range f.usageCursors {
		if c.HourUnix < cursorsFrom {
			delete(f.usageCursors, k)
		}
	}
}

// Tenants returns copies of every tenant, sorted by name.
func (f *FSM) Tenants() []*llmgwv1.Tenant {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return cloneSorted(f.tenants, func(t *llmgwv1.Tenant) string { return t.Name })
}

// Tenant returns a copy of the named tenant.
func (f *FSM) Tenant(name string) (*llmgwv1.Tenant, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	t, ok := f.tenants[name]
	if !ok {
		return nil, false
	}
	return proto.Clone(t).(*llmgwv1.Tenant), true
}

// Usage returns copies of the roll-up's rows of tenant and model ("" for
// every one) from the hour holding sinceUnix on, sorted by tenant, model
// and hour.
func (f *FSM) Usage(tenant, model string, sinceUnix int64) []*llmgwv1.UsageRow {
	f.mu.RLock()
	defer f.mu.RUnlock()
	from := sinceUnix - sinceUnix%3600
	var out []*llmgwv1.UsageRow
	for k, r := range f.usage {
		if (tenant == "" || k.tenant == tenant) && (model == "" || k.model == model) && k.hour >= from {
			out = append(out, proto.Clone(r).(*llmgwv1.UsageRow))
		}
	}
	sortUsage(out)
	return out
}

// UsageTokens sums a tenant's input + output tokens over the hours from
// fromUnix (an hour boundary) on, model "" for every model: what its
// budgets have spent in a period.
func (f *FSM) UsageTokens(tenant, model string, fromUnix int64) uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	var n uint64
	for k, r := range f.usage {
		if k.tenant == tenant && (model == "" || k.model == model) && k.hour >= fromUnix {
			n = satAdd(n, satAdd(r.Counts.GetInputTokens(), r.Counts.GetOutputTokens()))
		}
	}
	return n
}

func sortUsage(rows []*llmgwv1.UsageRow) {
	slices.SortFunc(rows, func(a, b *llmgwv1.UsageRow) int {
		return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Model, b.Model), cmp.Compare(a.HourUnix, b.HourUnix))
	})
}

// usageState is the roll-up and the cursors as the snapshot lists them.
func (f *FSM) usageState() ([]*llmgwv1.UsageRow, []*llmgwv1.UsageCursor) {
	rows := make([]*llmgwv1.UsageRow, 0, len(f.usage))
	for _, r := range f.usage {
		rows = append(rows, proto.Clone(r).(*llmgwv1.UsageRow))
	}
	sortUsage(rows)
	curs := make([]*llmgwv1.UsageCursor, 0, len(f.usageCursors))
	for _, c := range f.usageCursors {
		curs = append(curs, proto.Clone(c).(*llmgwv1.UsageCursor))
	}
	slices.SortFunc(curs, func(a, b *llmgwv1.UsageCursor) int {
		return cmp.Or(cmp.Compare(a.Router, b.Router), cmp.Compare(a.Session, b.Session))
	})
	return rows, curs
}

// restoreUsage loads the roll-up and cursors of a snapshot.
func (f *FSM) restoreUsage(st *llmgwv1.State) {
	for _, r := range st.Usage {
		if r.Counts == nil {
			r.Counts = &llmgwv1.UsageCounts{}
		}
		f.usage[usageKey{r.Tenant, r.Model, r.HourUnix}] = r
	}
	for _, c := range st.UsageCursors {
		f.usageCursors[cursorKey{c.Router, c.Session}] = c
		f.usageNewest = max(f.usageNewest, c.HourUnix)
	}
}
