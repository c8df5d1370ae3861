// Package quota is the router's side of tenants' limits, budgets and
// metering (design §7.7): admission with reserve and settle against
// shares of each limit leased from the control plane's leader, and the
// usage the router meters, sent to the replicated roll-up in batches.
//
// No request waits on the control plane or on another router: a request
// is decided against this router's share alone, under its tenant's lock;
// the shares are renewed in the background (lease.go) and the usage is
// flushed in the background (meter.go). A router that has lost the
// control plane keeps its shares until the lease ends, then uses the
// fallback the leader gave with them (the limit divided by the routers
// it knew, rounded down), so the fleet's sum never passes the limit.
package quota

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/openai"
)

// Client is the control plane as the quota needs it: QuotaService's two
// calls on any control server (followers forward them to the leader).
// Calls fail, never block past ctx.
type Client interface {
	Lease(ctx context.Context, req *llmgwv1.LeaseRequest) (*llmgwv1.LeaseResponse, error)
	RecordUsage(ctx context.Context, b *llmgwv1.RecordUsageCommand) (*llmgwv1.RecordUsageResponse, error)
}

// Config is the quota's. Zero values take the defaults.
type Config struct {
	// Router is the router's --id; the session is picked at New.
	Router string
	// Renew is how often shares are renewed (the leader's term is ten
	// times longer), Flush how often metered usage is sent.
	Renew time.Duration
	Flush time.Duration
	// DefaultOutput is the output reservation of a request without
	// max_tokens before the model's mean is learned.
	DefaultOutput int
	// Now is the clock (time.Now); tests inject theirs.
	Now func() time.Time
}

func (c *Config) defaults() {
	if c.Renew <= 0 {
		c.Renew = time.Second
	}
	if c.Flush <= 0 {
		c.Flush = 5 * time.Second
	}
	if c.DefaultOutput <= 0 {
		c.DefaultOutput = 256
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Tenants is the desired state's tenants, by name, as the watch stream
// last published them; a published map is never changed.
type Tenants func() map[string]*llmgwv1.Tenant

// Quota admits requests against tenants' limits and meters their usage.
// Safe for concurrent use; Run renews the shares and flushes the usage.
type Quota struct {
	cfg     Config
	session uint64
	tenants Tenants
	client  Client
	log     *slog.Logger
	m       *metrics

	mu    sync.RWMutex
	state map[string]*tenant

	// means are the learned output means per model (tokens, as
	// float64 bits): the output reservation of a request without
	// max_tokens.
	means sync.Map // model -> *atomic.Uint64
	// perByte are the learned prompt tokens per body byte per model,
	// the same way: the input estimate without tier 2's tokens.
	perByte sync.Map
	// models are the per-model series (model -> *modelSeries).
	models sync.Map

	// kick asks Run for a renewal now: a request met a scope with no
	// share yet.
	kick chan struct{}

	flushMu sync.Mutex // one batch in flight at a time
	seq     uint64
	batch   *llmgwv1.RecordUsageCommand // sent and not yet acknowledged
}

// New returns a quota for router; reg receives its metrics (nil: none).
func New(cfg Config, tenants Tenants, client Client, log *slog.Logger, reg prometheus.Registerer) *Quota {
	cfg.defaults()
	return &Quota{cfg: cfg, session: newSession(), tenants: tenants, client: client, log: log, m: newMetrics(reg),
		state: map[string]*tenant{}, kick: make(chan struct{}, 1)}
}

// tenant is one tenant as this router holds it: its definition, its
// scopes, and the usage metered and not yet flushed. mu guards all of it;
// a request takes it once to admit and once to settle.
type tenant struct {
	name string
	m    *tenantSeries
	mu   sync.Mutex
	def  *llmgwv1.Tenant // nil: a tenant without a definition (no limits)
	// scopes: the tenant's own limits first, then per model, each kind
	// ascending: the order checks run in.
	scopes []*scope
	// usage metered since the last batch, by (model, hour); gen counts
	// the batches that took rows from it.
	usage map[usageKey]*llmgwv1.UsageCounts
	gen   uint64
	// tokens metered and not yet committed, for the budgets' claims:
	// unflushed (not in a batch yet) and inBatch (in the batch in
	// flight), the tenant's and per model.
	unflushed, inBatch           float64
	unflushedModel, inBatchModel map[string]float64
}

type usageKey struct {
	model string
	hour  int64
}

// tenantOf returns the state of name, made on first use; its holder
// brings its definition up to date under its lock (sync).
func (q *Quota) tenantOf(name string) *tenant {
	q.mu.RLock()
	t := q.state[name]
	q.mu.RUnlock()
	if t == nil {
		q.mu.Lock()
		if t = q.state[name]; t == nil {
			t = &tenant{name: name, m: q.m.forTenant(name), usage: map[usageKey]*llmgwv1.UsageCounts{},
				unflushedModel: map[string]float64{}, inBatchModel: map[string]float64{}}
			q.state[name] = t
		}
		q.mu.Unlock()
	}
	return t
}

// sync brings t's definition up to def; t.mu is held.
func (t *tenant) sync(def *llmgwv1.Tenant) {
	if t.def != def {
		t.redefine(def)
	}
}

// redefine rebuilds the scopes from def, keeping the state of scopes that
// stay.
func (t *tenant) redefine(def *llmgwv1.Tenant) {
	type id struct {
		model string
		kind  kind
	}
	old := map[id]*scope{}
	for _, s := range t.scopes {
		old[id{s.model, s.kind}] = s
	}
	t.def, t.scopes = def, nil
	add := func(model string, l *llmgwv1.TenantLimits) {
		for k := range numKinds {
			lim := limitOf(l, k)
			if lim == 0 {
				continue
			}
			s := old[id{model, k}]
			if s == nil {
				s = &scope{model: model, kind: k}
			}
			s.limit = lim
			t.scopes = append(t.scopes, s)
		}
	}
	add("", def.GetLimits())
	for _, ml := range def.GetModelLimits() {
		add(ml.GetModel(), ml.GetLimits())
	}
}

// Request is what admission knows of a request.
type Request struct {
	// Tenant is the key's tenant (fsm.EffectiveTenant); "" without a key.
	Tenant string
	// Model is the name the client asked for (a model or an adapter);
	// Base its base model (the same for a model).
	Model, Base string
	// Input is the prompt's tokens, exact when InputExact (the router
	// tokenized it); otherwise Admit estimates it from Bytes, the body's
	// length, at the model's learned tokens per byte (a quarter before
	// any answer said).
	Input      int
	InputExact bool
	Bytes      int
	// MaxTokens is the request's output bound, 0 when it gave none.
	MaxTokens int
}

// Usage is what the engine reported (or, for a cancelled stream, what
// the router saw: Cut). Known is false when nothing was generated or
// reported: a failed attempt, settled at zero.
type Usage struct {
	Input, Cached, Output int
	Known, Cut            bool
}

// Ticket is an admitted request's reservation, settled once by Settle.
type Ticket struct {
	q      *Quota
	t      *tenant
	req    Request
	hour   int64
	shadow bool // a shadow tenant's request its limits would have refused: nothing reserved
	cut    bool // settled from a cut stream's chunks: not an answer to learn from
	// row is the metered row of the request's model and hour as of
	// admission, valid while the tenant's gen is still gen.
	row *llmgwv1.UsageCounts
	gen uint64
	// reserved per scope, in the order of t.scopes at admission; the
	// arrays hold the usual few without an allocation.
	scopes []*scope
	costs  []float64
	inline [numKinds]*scope
	icosts [numKinds]float64
	in     float64
	out    float64
	// Headers are the x-ratelimit-* headers for the answer.
	Headers Headers
	done    atomic.Bool
}

// Headers are OpenAI's x-ratelimit-* values for the request's tenant:
// the requests and tokens limits that bind it, what remains of them
// fleet-wide as this router sees its share, and when they are full again.
type Headers struct {
	Set                              bool
	LimitRequests, RemainingRequests uint64
	ResetRequests                    time.Duration
	LimitTokens, RemainingTokens     uint64
	ResetTokens                      time.Duration
	HasRequests, HasTokens           bool
}

// Admit decides r against its tenant's scopes and reserves what it may
// use. A refusal is the 429 to send (with the same headers); a shadow
// tenant is never refused, its would-be refusals counted instead.
func (q *Quota) Admit(r Request) (*Ticket, *openai.Error, Headers) {
	now := q.cfg.Now()
	t := q.tenantOf(r.Tenant)
	if !r.InputExact {
		r.Input = max(1, int(math.Ceil(float64(r.Bytes)*q.mean(&q.perByte, r.Base, 0.25))))
	}
	outEst := q.outputEstimate(r)
	tk := &Ticket{q: q, t: t, req: r, hour: now.Unix() / 3600 * 3600, in: float64(r.Input), out: outEst}
	tk.scopes, tk.costs = tk.inline[:0], tk.icosts[:0]

	t.mu.Lock()
	t.sync(q.tenants()[r.Tenant])
	var refusal *openai.Error
	var refusedBy *scope
	var retry time.Duration
	for _, s := range t.scopes {
		if s.model != "" && s.model != r.Model && s.model != r.Base {
			continue
		}
		cost := tk.cost(s)
		s.asked += cost // demand counts what was refused too
		if !s.granted {
			q.wantLease()
		}
		if refusedBy != nil {
			continue
		}
		if v := s.check(now, cost); !v.ok {
			refusedBy, retry = s, v.retry
		}
	}
	h := t.headers(now, r)
	shadow := t.def.GetShadow()
	if refusedBy == nil {
		for _, s := range t.scopes {
			if s.model != "" && s.model != r.Model && s.model != r.Base {
				continue
			}
			c := tk.cost(s)
			s.take(c)
			tk.scopes, tk.costs = append(tk.scopes, s), append(tk.costs, c)
		}
	} else {
		if refusedBy.kind == kindConcurrency {
			refusedBy.peak = max(refusedBy.peak, refusedBy.inflight+1)
		}
		refusal = refusalOf(refusedBy, retry)
	}
	u := t.counts(r.Model, tk.hour)
	tk.row, tk.gen = u, t.gen
	switch {
	case refusal == nil:
	case shadow:
		u.ShadowRefused++
		tk.shadow = true
	default:
		u.Refused++
	}
	t.mu.Unlock()

	switch {
	case refusal == nil:
		t.m.admitted.Inc()
	case shadow:
		t.m.shadowRefused.Inc()
		refusal = nil
	default:
		t.m.refused.Inc()
		return nil, refusal, h
	}
	tk.Headers = h
	return tk, nil, h
}

// Input is the prompt's tokens as admitted (exact or estimated).
func (tk *Ticket) Input() int { return int(tk.in) }

// Expected is the input and output tokens the request is expected to use,
// as admitted: what flow control charges its tenant before the answer.
func (tk *Ticket) Expected() (input, output float64) {
	if tk == nil {
		return 0, 0
	}
	return tk.in, tk.out
}

// cost is what the request reserves of scope s: a request, its input, its
// output estimate, their weighted sum (all input counted uncached: the
// cache is known after), one slot, or for a budget input plus the
// output's bound (max_tokens when given, so settled use cannot pass the
// budget).
func (tk *Ticket) cost(s *scope) float64 {
	switch s.kind {
	case kindRPM, kindConcurrency:
		return 1
	case kindInputTPM:
		return tk.in
	case kindOutputTPM:
		return tk.out
	case kindWeightedTPM:
		return weighted(tk.t.def.GetWeights(), tk.in, 0, tk.out)
	}
	out := tk.out
	if tk.req.MaxTokens > 0 {
		out = float64(tk.req.MaxTokens)
	}
	return tk.in + out
}

// used is what the request used of scope s, by the same measure as cost.
func (tk *Ticket) used(s *scope, u Usage) float64 {
	switch s.kind {
	case kindRPM:
		return 1
	case kindConcurrency:
		return 0
	case kindInputTPM:
		return float64(u.Input)
	case kindOutputTPM:
		return float64(u.Output)
	case kindWeightedTPM:
		return weighted(tk.t.def.GetWeights(), float64(u.Input-u.Cached), float64(u.Cached), float64(u.Output))
	}
	return float64(u.Input + u.Output)
}

// weighted applies w (thousandths; unset: 1, 1, 1) to uncached input,
// cached input and output tokens.
func weighted(w *llmgwv1.TokenWeights, in, cached, out float64) float64 {
	if w == nil {
		return in + cached + out
	}
	return (float64(w.InputMilli)*in + float64(w.CachedMilli)*cached + float64(w.OutputMilli)*out) / 1000
}

// Settle replaces the reservation by what the request used and meters it.
// Call it once, whatever became of the request; later calls do nothing.
func (tk *Ticket) Settle(u Usage) {
	if tk == nil || !tk.done.CompareAndSwap(false, true) {
		return
	}
	q, t := tk.q, tk.t
	var now time.Time // read only for a budget: the clock costs on some machines
	for _, s := range tk.scopes {
		if s.kind.budget() {
			now = q.cfg.Now()
			break
		}
	}
	if !u.Known {
		u = Usage{}
	}
	tk.cut = u.Cut
	t.mu.Lock()
	for i, s := range tk.scopes {
		s.settle(now, tk.costs[i], tk.used(s, u))
	}
	c := tk.row
	if tk.gen != t.gen { // a batch took the row since admission
		c = t.counts(tk.req.Model, tk.hour)
	}
	c.Requests++
	c.InputTokens += uint64(u.Input)
	c.CachedTokens += uint64(u.Cached)
	c.OutputTokens += uint64(u.Output)
	tokens := float64(u.Input + u.Output)
	t.unflushed += tokens
	t.unflushedModel[tk.req.Model] += tokens
	if tk.req.Base != tk.req.Model {
		t.unflushedModel[tk.req.Base] += tokens
	}
	t.mu.Unlock()
	t.m.input.Add(float64(u.Input))
	t.m.cached.Add(float64(u.Cached))
	t.m.output.Add(float64(u.Output))
	ms := q.modelSeries(tk.req.Base)
	ms.input.Add(float64(u.Input))
	ms.output.Add(float64(u.Output))
	if u.Known && u.Output > 0 && tk.req.MaxTokens == 0 && !tk.cut {
		q.learn(&q.means, tk.req.Base, float64(u.Output))
	}
	if u.Known && u.Input > 0 && !tk.req.InputExact && tk.req.Bytes > 0 && !tk.cut {
		q.learn(&q.perByte, tk.req.Base, float64(u.Input)/float64(tk.req.Bytes))
	}
}

// counts is the metered row of (model, hour), made on first use.
func (t *tenant) counts(model string, hour int64) *llmgwv1.UsageCounts {
	k := usageKey{model, hour}
	c := t.usage[k]
	if c == nil {
		c = &llmgwv1.UsageCounts{}
		t.usage[k] = c
	}
	return c
}

// headers reads the tenant's requests and tokens limits for r: the
// tenant's own RPM, and its tightest token rate (remaining scaled from
// this router's bucket to the fleet's limit).
func (t *tenant) headers(now time.Time, r Request) Headers {
	var h Headers
	var tokRatio = math.Inf(1)
	for _, s := range t.scopes {
		if !s.kind.rate() || (s.model != "" && s.model != r.Model && s.model != r.Base) {
			continue
		}
		share := s.inForce(now)
		ratio, reset := 0.0, time.Second // no share yet: nothing remains until the first renewal
		if share > 0 {
			ratio = max(0, s.level) / (share * burst)
			reset = time.Duration(max(0, share*burst-s.level) / (share / 60) * float64(time.Second))
		}
		remaining := uint64(float64(s.limit) * min(1, ratio))
		if s.kind == kindRPM {
			if !h.HasRequests || ratio < 1 {
				h.HasRequests, h.LimitRequests, h.RemainingRequests, h.ResetRequests = true, s.limit, remaining, reset
			}
		} else if ratio < tokRatio {
			tokRatio = ratio
			h.HasTokens, h.LimitTokens, h.RemainingTokens, h.ResetTokens = true, s.limit, remaining, reset
		}
	}
	h.Set = h.HasRequests || h.HasTokens
	return h
}

// refusalOf is the 429 for a request s refused, retrying after retry.
func refusalOf(s *scope, retry time.Duration) *openai.Error {
	secs := int(math.Ceil(retry.Seconds()))
	secs = max(secs, 1)
	scopeName := "the tenant's"
	if s.model != "" {
		scopeName = fmt.Sprintf("the tenant's %q", s.model)
	}
	switch {
	case s.kind.budget():
		b := "daily"
		if s.kind == kindMonthly {
			b = "monthly"
		}
		return openai.QuotaExhausted(b, s.limit, secs)
	case s.kind == kindRPM || s.kind == kindConcurrency:
		return openai.RateLimited("requests", fmt.Sprintf("Rate limit reached for %s limit of %d %s. Please try again in %ds.",
			scopeName, s.limit, s.kind.name(), secs), secs)
	}
	return openai.RateLimited("tokens", fmt.Sprintf("Rate limit reached for %s limit of %d %s. Please try again in %ds.",
		scopeName, s.limit, s.kind.name(), secs), secs)
}

// outputEstimate is the output a request reserves of the rates: its
// max_tokens capped by the model's learned mean (the mean alone without
// one).
func (q *Quota) outputEstimate(r Request) float64 {
	mean := q.mean(&q.means, r.Base, float64(q.cfg.DefaultOutput))
	if r.MaxTokens > 0 {
		return min(float64(r.MaxTokens), mean)
	}
	return mean
}

// mean is model's learned mean in m, or def before any.
func (q *Quota) mean(m *sync.Map, model string, def float64) float64 {
	if v, ok := m.Load(model); ok {
		if bits := v.(*atomic.Uint64).Load(); bits != 0 {
			return math.Float64frombits(bits)
		}
	}
	return def
}

// learn moves model's mean in m towards x (an exponential average over
// about twenty requests).
func (q *Quota) learn(m *sync.Map, model string, x float64) {
	v, ok := m.Load(model)
	if !ok {
		v, _ = m.LoadOrStore(model, new(atomic.Uint64))
	}
	a := v.(*atomic.Uint64)
	for {
		old := a.Load()
		next := x
		if old != 0 {
			mean := math.Float64frombits(old)
			next = mean + (x-mean)/20
		}
		if a.CompareAndSwap(old, math.Float64bits(next)) {
			return
		}
	}
}

// modelSeries are model's counters, resolved on first use.
func (q *Quota) modelSeries(model string) *modelSeries {
	if v, ok := q.models.Load(model); ok {
		return v.(*modelSeries)
	}
	v, _ := q.models.LoadOrStore(model, q.m.forModel(model))
	return v.(*modelSeries)
}

// wantLease asks Run for a renewal now.
func (q *Quota) wantLease() {
	select {
	case q.kick <- struct{}{}:
	default:
	}
}
