package flow

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/router/endpoint"
	"github.com/llmgw/llmgw/router/openai"
)

// Loads is the router's view of a model's replicas, as flow control reads
// it: the same loads the scheduler scores (design §7.2), a stale reading
// marked Saturated.
type Loads interface {
	// Loads appends the load of every routable replica of model to dst.
	Loads(model string, dst []endpoint.Load) []endpoint.Load
}

// Request is what flow control knows of a request: the base model whose
// replicas serve it, its tenant, its class (Resolve) and its size.
type Request struct {
	Model  string
	Tenant string
	Rank   int
	// Bytes is the body's size, counted against the queue's byte bound.
	Bytes int
	// Cost is the request's expected weighted tokens (input + output ×
	// OutputWeight), charged to the tenant's attained service when it is
	// dispatched and corrected by Grant.Done.
	Cost float64
}

// Refusal is why a request was not dispatched: Err is the 429 to send,
// with Reason for the x-llmgw-flow-reason header; nil Err means the client
// left while it waited.
type Refusal struct {
	Reason string
	Err    *openai.Error
}

// Reasons of a refusal.
const (
	ReasonQueueFull    = "queue_full"
	ReasonQueueBytes   = "queue_bytes"
	ReasonQueueTimeout = "queue_timeout"
)

// Controller is one router's flow control: it lets a request go on to be
// scheduled at once while its model has room for its class, and otherwise
// holds it in a queue per model and class until room frees, its TTL ends
// or its client leaves (design §7.8). Run dispatches the queues; without
// Run, requests are dispatched only as they arrive.
type Controller struct {
	cfg     Config
	loads   Loads
	log     *slog.Logger
	now     func() time.Time
	m       *metrics
	byName  map[string]int
	kick    chan struct{}
	queued  atomic.Int64 // requests waiting, over every model
	loadBuf sync.Pool

	mu     sync.Mutex
	models map[string]*model
	fleet  fleetView
}

// model is one model's flow state: its queues by rank and the attained
// service of its tenants.
type model struct {
	name     string
	queues   []*queue
	inflight int // dispatched here and not Done
	service  map[string]*attained
}

// queue is one class's waiting requests of one model, by tenant (FIFO
// within a tenant, least attained service between them).
type queue struct {
	tenants map[string][]*waiter
	n       int
	bytes   int64
}

// attained is a tenant's service, decaying with Config.HalfLife.
type attained struct {
	v  float64
	at time.Time
}

type waiter struct {
	req      Request
	enqueued time.Time
	ready    chan struct{} // closed when decided
	grant    *Grant
	refusal  *Refusal
}

// New builds a Controller over loads; reg receives its metrics (nil: none).
func New(cfg Config, loads Loads, log *slog.Logger, reg prometheus.Registerer, now func() time.Time) (*Controller, error) {
	cfg = cfg.filled()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	c := &Controller{cfg: cfg, loads: loads, log: log, now: now, byName: map[string]int{},
		kick: make(chan struct{}, 1), models: map[string]*model{}}
	for i, cl := range cfg.Classes {
		c.byName[cl.Name] = i
	}
	c.m = newMetrics(reg)
	c.loadBuf.New = func() any { s := make([]endpoint.Load, 0, 16); return &s }
	return c, nil
}

// Enabled reports whether flow control holds requests at all.
func (c *Controller) Enabled() bool { return c != nil && c.cfg.Enabled }

// Class is the name of the class of rank r.
func (c *Controller) Class(r int) string { return c.cfg.Classes[r].Name }

// Resolve is the rank of a request's class: the one its header asks for
// (x-llmgw-priority, "" none), never above its tenant's maximum; else its
// tenant's default. A tenant's class the routers do not configure counts
// as flow.default_class; a tenant with no maximum may not rise above its
// default. A header naming no class is the 400 to send.
func (c *Controller) Resolve(header, tenantDefault, tenantMax string) (int, *openai.Error) {
	def, ok := c.byName[tenantDefault]
	if !ok {
		def = c.byName[c.cfg.DefaultClass]
	}
	highest := def
	if r, ok := c.byName[tenantMax]; ok {
		highest = r
	}
	if def < highest { // a default above the maximum is clamped to it
		def = highest
	}
	if header == "" {
		return def, nil
	}
	r, ok := c.byName[strings.ToLower(strings.TrimSpace(header))]
	if !ok {
		names := make([]string, len(c.cfg.Classes))
		for i, cl := range c.cfg.Classes {
			names[i] = cl.Name
		}
		return 0, &openai.Error{Status: 400, Type: "invalid_request_error", Code: "invalid_priority",
			Param: "x-llmgw-priority", Message: fmt.Sprintf("x-llmgw-priority: %q is not a priority class; the classes are %s", header, strings.Join(names, ", "))}
	}
	return max(r, highest), nil
}

// Admit decides r: dispatched at once when its model has room for its
// class and nothing of its class or above waits before it; otherwise
// queued until the dispatcher (Run) lets it go, its TTL ends, or ctx ends.
// The Grant must be Done when the request ends. Disabled, every request is
// dispatched with a nil Grant.
func (c *Controller) Admit(ctx context.Context, r Request) (*Grant, *Refusal) {
	if !c.Enabled() {
		return nil, nil
	}
	now := c.now()
	cl := c.cfg.Classes[r.Rank]
	c.mu.Lock()
	m := c.model(r.Model)
	if !m.waitingAtOrAbove(r.Rank) && !c.fleet.holds(m.name, r.Rank, now, c.cfg.InversionWait/2) {
		room, capacity, serves := c.room(m)
		if !serves || room >= 1+reserve(cl, capacity) {
			g := c.dispatch(m, r, now, false)
			c.mu.Unlock()
			return g, nil
		}
	}
	q := m.queues[r.Rank]
	if q.n >= cl.MaxQueued {
		c.mu.Unlock()
		return nil, c.refuse(m.name, r.Rank, ReasonQueueFull, fmt.Sprintf("the %s queue for %s is full (%d requests waiting at this router); try again shortly", cl.Name, m.name, cl.MaxQueued))
	}
	if q.bytes+int64(r.Bytes) > cl.MaxQueuedBytes {
		c.mu.Unlock()
		return nil, c.refuse(m.name, r.Rank, ReasonQueueBytes, fmt.Sprintf("the %s queue for %s holds its most bytes (%d); try again shortly", cl.Name, m.name, cl.MaxQueuedBytes))
	}
	w := &waiter{req: r, enqueued: now, ready: make(chan struct{})}
	q.tenants[r.Tenant] = append(q.tenants[r.Tenant], w)
	q.n++
	q.bytes += int64(r.Bytes)
	c.queued.Add(1)
	c.m.queued(m.name, cl.Name, 1)
	c.mu.Unlock()
	c.wake()

	select {
	case <-w.ready:
		return w.grant, w.refusal
	case <-ctx.Done():
	}
	c.mu.Lock()
	select {
	case <-w.ready: // decided as the client left: give back a dispatch
		c.mu.Unlock()
		w.grant.Done(0, false)
	default:
		c.unqueue(m, r.Rank, w)
		c.mu.Unlock()
		c.m.dropped.WithLabelValues(m.name, cl.Name).Inc()
		c.m.waited(m.name, cl.Name, now, c.now())
	}
	return nil, &Refusal{}
}

// refuse counts and builds a 429 of reason.
func (c *Controller) refuse(model string, rank int, reason, msg string) *Refusal {
	c.m.refused.WithLabelValues(model, c.cfg.Classes[rank].Name, reason).Inc()
	return &Refusal{Reason: reason, Err: &openai.Error{Status: 429, Type: "requests",
		Code: "rate_limit_exceeded", Message: msg, RetryAfter: 1}}
}

// model returns m's state, made on first use. Called with c.mu held.
func (c *Controller) model(name string) *model {
	m := c.models[name]
	if m == nil {
		m = &model{name: name, service: map[string]*attained{}}
		for _, cl := range c.cfg.Classes {
			m.queues = append(m.queues, &queue{tenants: map[string][]*waiter{}})
			// Series from 0, so a class's first dispatch is an increase.
			c.m.dispatched.WithLabelValues(name, cl.Name, "direct")
			c.m.dispatched.WithLabelValues(name, cl.Name, "queued")
		}
		c.models[name] = m
	}
	return m
}

// waitingAtOrAbove reports whether a request of rank or higher waits.
func (m *model) waitingAtOrAbove(rank int) bool {
	for _, q := range m.queues[:rank+1] {
		if q.n > 0 {
			return true
		}
	}
	return false
}

// room is how many more requests m's replicas take now, and its capacity
// (design §7.8). A replica with a stale reading is full. With
// ReplicaConcurrency, a replica takes what is left of it after its load
// (waiting + max(running, this router's in flight), as the scheduler
// counts it); without, a replica whose engine does not queue takes up to
// MaxWaiting. Requests dispatched here and not yet on a replica are taken
// off. serves is false when m has no routable replica: nothing can serve
// it, so queueing would help no one (the director answers 503).
func (c *Controller) room(m *model) (room, capacity float64, serves bool) {
	bp := c.loadBuf.Get().(*[]endpoint.Load)
	loads := c.loads.Loads(m.name, (*bp)[:0])
	if len(loads) == 0 {
		c.loadBuf.Put(bp)
		return 0, 0, false
	}
	per := float64(c.cfg.ReplicaConcurrency)
	if per == 0 {
		per = float64(c.cfg.MaxWaiting)
	}
	var onReplicas int64
	for _, l := range loads {
		capacity += per
		onReplicas += l.Inflight
		if l.Saturated || l.Waiting >= float64(c.cfg.MaxWaiting) || l.KVUsage >= c.cfg.KVCeiling {
			continue
		}
		if c.cfg.ReplicaConcurrency > 0 {
			room += max(0, per-(l.Waiting+max(l.Running, float64(l.Inflight))))
		} else {
			room += per - l.Waiting
		}
	}
	*bp = loads
	c.loadBuf.Put(bp)
	pending := max(0, int64(m.inflight)-onReplicas)
	return room - float64(pending), capacity, true
}

// reserve is the whole requests of capacity a class leaves to the classes
// above it: floor(headroom × capacity), so that on a fleet too small for a
// share to make a whole request, no class waits for room that cannot be.
func reserve(cl Class, capacity float64) float64 { return math.Floor(cl.Headroom * capacity) }

// dispatch lets r go on, charging its tenant. Called with c.mu held.
func (c *Controller) dispatch(m *model, r Request, now time.Time, queued bool) *Grant {
	m.inflight++
	a := m.service[r.Tenant]
	if a == nil {
		a = &attained{at: now}
		m.service[r.Tenant] = a
	}
	c.decay(a, now)
	a.v += r.Cost
	cl := c.cfg.Classes[r.Rank].Name
	path := "direct"
	if queued {
		path = "queued"
	}
	c.m.dispatched.WithLabelValues(m.name, cl, path).Inc()
	if c.inversion(m, r.Rank, now) {
		c.m.inversions.WithLabelValues(m.name, cl).Inc()
	}
	return &Grant{c: c, m: m, tenant: r.Tenant, cost: r.Cost, Class: cl}
}

// inversion reports whether a class above rank has waited past
// InversionWait, here or (as last reported) at another router. Called with
// c.mu held.
func (c *Controller) inversion(m *model, rank int, now time.Time) bool {
	for hr := range rank {
		if o, ok := m.queues[hr].oldest(); ok && now.Sub(o) > c.cfg.InversionWait {
			return true
		}
	}
	return c.fleet.holds(m.name, rank, now, c.cfg.InversionWait)
}

// decay brings a's service to now.
func (c *Controller) decay(a *attained, now time.Time) {
	if dt := now.Sub(a.at); dt > 0 {
		a.v *= math.Exp2(-float64(dt) / float64(c.cfg.HalfLife))
		a.at = now
	}
}

// unqueue removes w from its queue. Called with c.mu held.
func (c *Controller) unqueue(m *model, rank int, w *waiter) {
	q := m.queues[rank]
	ws := q.tenants[w.req.Tenant]
	for i, x := range ws {
		if x == w {
			ws = append(ws[:i:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(q.tenants, w.req.Tenant)
	} else {
		q.tenants[w.req.Tenant] = ws
	}
	q.n--
	q.bytes -= int64(w.req.Bytes)
	c.queued.Add(-1)
	c.m.queued(m.name, c.cfg.Classes[rank].Name, -1)
}

// oldest is when the longest-waiting request of q arrived.
func (q *queue) oldest() (time.Time, bool) {
	var o time.Time
	for _, ws := range q.tenants {
		if at := ws[0].enqueued; o.IsZero() || at.Before(o) {
			o = at
		}
	}
	return o, !o.IsZero()
}

// Grant is a dispatched request's place in its model's flow; Done must be
// called once when the request ends.
type Grant struct {
	c      *Controller
	m      *model
	tenant string
	cost   float64
	// Class is the request's class; Waited how long it was queued (0:
	// dispatched as it arrived).
	Class  string
	Waited time.Duration
	done   atomic.Bool
}

// Done ends the request's dispatch; cost, when known, is the weighted
// tokens it used, and corrects what was charged at dispatch. Safe on nil.
func (g *Grant) Done(cost float64, known bool) {
	if g == nil || !g.done.CompareAndSwap(false, true) {
		return
	}
	c := g.c
	c.mu.Lock()
	g.m.inflight--
	if a := g.m.service[g.tenant]; a != nil && known {
		c.decay(a, c.now())
		a.v = max(0, a.v+cost-g.cost)
	}
	c.mu.Unlock()
	if c.queued.Load() > 0 {
		c.wake()
	}
}

// Weighted is the weighted tokens of input and output tokens.
func (c *Controller) Weighted(input, output float64) float64 {
	return input + c.cfg.OutputWeight*output
}

func (c *Controller) wake() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Run dispatches queued requests as room frees — every Tick while any
// wait, and at once when a request ends or is queued — and refuses those
// past their TTL, until ctx ends. It returns nil; requests still queued then wait
// for their TTL or their clients (the router stops taking requests first).
func (c *Controller) Run(ctx context.Context) error {
	if !c.Enabled() {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(c.cfg.Tick)
	defer t.Stop()
	for {
		// Idle, only a request queued (or a fleet view) wakes the loop:
		// below saturation it costs the router nothing.
		var tick <-chan time.Time
		if c.queued.Load() > 0 || c.m.shown {
			tick = t.C
		}
		select {
		case <-ctx.Done():
			return nil
		case <-c.kick:
		case <-tick:
		}
		if c.queued.Load() > 0 {
			c.pass()
		}
		c.m.observe(c)
	}
}

// pass dispatches what the queues' models have room for, highest class
// first and within a class the tenant with least attained service, and
// refuses requests past their TTL.
func (c *Controller) pass() {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.models {
		c.expire(m, now)
		if !m.waitingAtOrAbove(len(m.queues) - 1) {
			continue
		}
		room, capacity, serves := c.room(m)
		for rank, q := range m.queues {
			cl := c.cfg.Classes[rank]
			for q.n > 0 {
				if c.fleet.holds(m.name, rank, now, c.cfg.InversionWait/2) || (serves && room < 1+reserve(cl, capacity)) {
					break
				}
				w := c.next(m, q, now)
				c.unqueue(m, rank, w)
				w.grant = c.dispatch(m, w.req, now, true)
				w.grant.Waited = now.Sub(w.enqueued)
				c.m.waited(m.name, cl.Name, w.enqueued, now)
				close(w.ready)
				room--
			}
			if q.n > 0 {
				break // strict priority: nothing below a class that waits
			}
		}
	}
}

// next is the head of the queued tenant with least attained service now.
func (c *Controller) next(m *model, q *queue, now time.Time) *waiter {
	var best *waiter
	bestV := math.Inf(1)
	for tenant, ws := range q.tenants {
		v := 0.0
		if a := m.service[tenant]; a != nil {
			c.decay(a, now)
			v = a.v
		}
		if v < bestV || (v == bestV && ws[0].enqueued.Before(best.enqueued)) {
			best, bestV = ws[0], v
		}
	}
	return best
}

// expire refuses the requests of m that have waited their class's TTL.
// Called with c.mu held.
func (c *Controller) expire(m *model, now time.Time) {
	for rank, q := range m.queues {
		cl := c.cfg.Classes[rank]
		for _, ws := range q.tenants {
			for _, w := range ws {
				if now.Sub(w.enqueued) < cl.TTL {
					break // FIFO within a tenant: the rest came later
				}
				c.unqueue(m, rank, w)
				c.m.waited(m.name, cl.Name, w.enqueued, now)
				w.refusal = c.refuse(m.name, rank, ReasonQueueTimeout,
					fmt.Sprintf("the %s queue for %s: waited %s for capacity; try again later", cl.Name, m.name, cl.TTL))
				close(w.ready)
			}
		}
	}
	// Forget tenants whose service has decayed to nothing and who wait
	// nowhere, so the map holds only the recently served.
	if len(m.service) > 64 {
		for t, a := range m.service {
			c.decay(a, now)
			if a.v < 1 && !m.queuedTenant(t) {
				delete(m.service, t)
			}
		}
	}
}

func (m *model) queuedTenant(t string) bool {
	for _, q := range m.queues {
		if len(q.tenants[t]) > 0 {
			return true
		}
	}
	return false
}
