// Package waitroom holds the requests of an autoscaled model that has no
// routable replica, instead of answering them 503, until its autoscaler
// brings one up (design §5.7 "From zero: the waiting room").
//
// A model at zero replicas (autoscale.min 0) would otherwise refuse every
// request for as long as a cold start takes — minutes for a large model —
// and a client's retries would only add load. The room holds them, each
// with its body, and the router counts them in its demand report (held),
// which is what makes the leader start a replica at all. Holding is
// bounded per model by autoscale.max_held and autoscale.hold_timeout_s, and
// across models by the bytes of the held bodies (hold_max_bytes); past a
// bound, a request gets 503 with Retry-After and a message naming the bound,
// never a silent wait. A client that goes away is dropped at once.
//
// A replica that has just loaded is not handed the whole backlog at once:
// while every routable replica of the model is in its first Warmup (10 s)
// after it became routable, this router lets at most Limits.Warm (the
// engine's --max-num-seqs) requests per replica through at a time, held
// ones first in arrival order, new ones behind them. Once any replica is
// past its warm-up, requests go through at once and normal scheduling and
// flow control (design §7.8) take over. The bound is per router and per
// model: the requests let through spread over the warm replicas as the
// scheduler places them, which with one replica — the case from zero — is
// exactly the bound.
//
// The room decides from the routing table it is handed and its own
// counts; it never waits on the network. Run releases and expires held
// requests; Enter lets a request through or holds it.
package waitroom

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/endpoint"
	"github.com/llmgw/llmgw/router/openai"
	"github.com/llmgw/llmgw/vllm"
)

// The room's defaults: per model when the spec leaves them 0 (design §5.7),
// and the room's own.
const (
	DefaultMaxHeld     = 1000
	DefaultHoldTimeout = 300 * time.Second
	// DefaultWarm is vLLM's default --max-num-seqs, the warm bound of a
	// model whose extra_args do not set it.
	DefaultWarm = 256
	// DefaultMaxBytes bounds the bodies held across models.
	DefaultMaxBytes = 256 << 20
	// DefaultWarmup is how long after it became routable a replica is
	// given at most Limits.Warm requests at a time by this router.
	DefaultWarmup = 10 * time.Second
	// DefaultTick is how often held requests are looked at while any is
	// held: their timeouts and the warm-ups' ends. A routing-table change
	// and a request's end are looked at at once.
	DefaultTick = 100 * time.Millisecond
)

// Reasons of a refusal, the refused counter's label.
const (
	ReasonMaxHeld  = "max_held"
	ReasonMaxBytes = "max_bytes"
	ReasonTimeout  = "hold_timeout"
)

// retryAfter is the Retry-After of the room's 503s, seconds: a replica
// from zero takes a while, and a client retrying every second would only
// find the room full again.
const retryAfter = 5

// Table is the routing table as the room reads it (endpoint.Registry).
// Safe for concurrent use; never blocks.
type Table interface {
	// Lookup returns the model's routable endpoints; the slice is not
	// modified.
	Lookup(model string) (eps []*endpoint.Endpoint, known bool)
	// Changed is closed once the table is rebuilt; a caller that got it
	// before reading Lookup misses no change.
	Changed() <-chan struct{}
}

// Config is the room's; zero values take the defaults.
type Config struct {
	// MaxBytes bounds the bodies held at once, over every model
	// (DefaultMaxBytes).
	MaxBytes int64
	// Warmup is a new replica's warm-up (DefaultWarmup).
	Warmup time.Duration
	// Tick is how often held requests are looked at (DefaultTick).
	Tick time.Duration
	// Now is the clock (time.Now).
	Now func() time.Time
}

// Limits are one model's bounds, from its autoscale spec (LimitsOf).
type Limits struct {
	// MaxHeld bounds the model's held requests at this router.
	MaxHeld int
	// Timeout is how long a request is held before it gets 503.
	Timeout time.Duration
	// Warm is the requests a replica in its warm-up is given at a time.
	Warm int
}

// LimitsOf is the model's limits, false when it is not autoscaled: its
// autoscale's max_held (DefaultMaxHeld when 0), hold_timeout_s
// (DefaultHoldTimeout) and warm_concurrency — when 0, the engine's own
// batch bound, --max-num-seqs in extra_args, else DefaultWarm.
func LimitsOf(m *llmgwv1.Model) (Limits, bool) {
	a := m.GetAutoscale()
	if a == nil {
		return Limits{}, false
	}
	l := Limits{MaxHeld: int(a.GetMaxHeld()), Timeout: time.Duration(a.GetHoldTimeoutS()) * time.Second, Warm: int(a.GetWarmConcurrency())}
	if l.MaxHeld == 0 {
		l.MaxHeld = DefaultMaxHeld
	}
	if l.Timeout == 0 {
		l.Timeout = DefaultHoldTimeout
	}
	if l.Warm == 0 {
		l.Warm = DefaultWarm
		if n, ok := vllm.MaxNumSeqs(m.GetExtraArgs()); ok {
			l.Warm = n
		}
	}
	return l, true
}

// Request is what the room knows of a request: its base model, the
// model's limits and the body's size.
type Request struct {
	Model  string
	Limits Limits
	Bytes  int
}

// Refusal is why a request was not let through: Err is the 503 to send,
// Reason the refused counter's label; nil Err means the client left while
// it was held.
type Refusal struct {
	Reason string
	Err    *openai.Error
}

// Pass is a request let through; Done must be called once when the
// request ends (safe on nil).
type Pass struct {
	room *Room
	m    *model
	// Waited is how long the request was held (0: let through as it
	// arrived).
	Waited time.Duration
	done   atomic.Bool
}

// Room is one router's waiting room. Create it with New; Run releases
// what it holds.
type Room struct {
	cfg   Config
	table Table
	m     *metrics
	kick  chan struct{}
	held  atomic.Int64 // requests held, over every model

	mu     sync.Mutex
	models map[string]*model
	bytes  int64 // bodies held, over every model
}

// model is one model's state: what is held, in arrival order, and its
// requests let through and not yet Done.
type model struct {
	name     string
	limits   Limits
	held     []*waiter
	inflight int
}

type waiter struct {
	bytes    int
	enqueued time.Time
	deadline time.Time
	ready    chan struct{} // closed when decided
	pass     *Pass
	refusal  *Refusal
}

// New returns a room over the routing table; its metrics are registered
// with reg (nil: not registered).
func New(cfg Config, table Table, reg prometheus.Registerer) *Room {
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.Warmup <= 0 {
		cfg.Warmup = DefaultWarmup
	}
	if cfg.Tick <= 0 {
		cfg.Tick = DefaultTick
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Room{cfg: cfg, table: table, m: newMetrics(reg), kick: make(chan struct{}, 1), models: map[string]*model{}}
}

// Held is how many requests of model the room holds now: its part of the
// router's demand report (design §5.7).
func (r *Room) Held(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m := r.models[name]; m != nil {
		return len(m.held)
	}
	return 0
}

// Enter lets req through at once when its model may take it now — a
// routable replica, nothing held before it, and room within the warm
// bound while every replica warms up — and otherwise holds it until Run
// releases it, its model's timeout passes (503) or ctx ends (the client
// left: nil Err). A request past a bound (max_held, the bytes) gets 503 at
// once. The Pass must be Done when the request ends.
func (r *Room) Enter(ctx context.Context, req Request) (*Pass, *Refusal) {
	now := r.cfg.Now()
	eps, _ := r.table.Lookup(req.Model)
	r.mu.Lock()
	m := r.model(req.Model)
	m.limits = req.Limits
	if len(m.held) == 0 && r.open(m, eps, now) {
		m.inflight++
		r.mu.Unlock()
		return &Pass{room: r, m: m}, nil
	}
	if len(m.held) >= req.Limits.MaxHeld {
		r.forget(m)
		r.mu.Unlock()
		return nil, r.refuse(req.Model, ReasonMaxHeld, fmt.Sprintf(
			"the model %q has no replica ready to take this request and this router already holds %d requests for it (autoscale.max_held); retry shortly",
			req.Model, req.Limits.MaxHeld))
	}
	if r.bytes+int64(req.Bytes) > r.cfg.MaxBytes {
		r.forget(m)
		r.mu.Unlock()
		return nil, r.refuse(req.Model, ReasonMaxBytes, fmt.Sprintf(
			"the model %q has no replica ready to take this request and the requests this router holds for models without one already take its %d bytes (hold_max_bytes); retry shortly",
			req.Model, r.cfg.MaxBytes))
	}
	w := &waiter{bytes: req.Bytes, enqueued: now, deadline: now.Add(req.Limits.Timeout), ready: make(chan struct{})}
	m.held = append(m.held, w)
	r.bytes += int64(req.Bytes)
	r.held.Add(1)
	r.m.held.WithLabelValues(m.name).Inc()
	r.m.bytes.Set(float64(r.bytes))
	r.mu.Unlock()
	r.wake()

	select {
	case <-w.ready:
		return w.pass, w.refusal
	case <-ctx.Done():
	}
	r.mu.Lock()
	select {
	case <-w.ready: // decided as the client left: give the place back
		r.mu.Unlock()
		w.pass.Done()
		return nil, &Refusal{}
	default:
	}
	r.unhold(m, w)
	r.forget(m)
	r.mu.Unlock()
	r.m.dropped.WithLabelValues(m.name).Inc()
	return nil, &Refusal{}
}

// open reports whether m may take a request now: it has a routable
// replica, and one of them is past its warm-up or the warm bound has room.
// Called with r.mu held.
func (r *Room) open(m *model, eps []*endpoint.Endpoint, now time.Time) bool {
	if len(eps) == 0 {
		return false
	}
	for _, e := range eps {
		if e.RoutableSince.IsZero() || now.Sub(e.RoutableSince) >= r.cfg.Warmup {
			return true
		}
	}
	return m.inflight < m.limits.Warm*len(eps)
}

// model returns name's state, made on first use. Called with r.mu held.
func (r *Room) model(name string) *model {
	m := r.models[name]
	if m == nil {
		m = &model{name: name}
		r.models[name] = m
	}
	return m
}

// forget drops m's state once nothing of it is held or running, so the
// map holds only models in use. Called with r.mu held.
func (r *Room) forget(m *model) {
	if len(m.held) == 0 && m.inflight == 0 {
		delete(r.models, m.name)
	}
}

// unhold takes w out of m's held requests. Called with r.mu held.
func (r *Room) unhold(m *model, w *waiter) {
	for i, x := range m.held {
		if x == w {
			m.held = append(m.held[:i:i], m.held[i+1:]...)
			break
		}
	}
	r.bytes -= int64(w.bytes)
	r.held.Add(-1)
	r.m.held.WithLabelValues(m.name).Dec()
	r.m.bytes.Set(float64(r.bytes))
}

// refuse counts and builds a 503 of reason.
func (r *Room) refuse(model, reason, msg string) *Refusal {
	r.m.refused.WithLabelValues(model, reason).Inc()
	return &Refusal{Reason: reason, Err: &openai.Error{Status: 503, Type: "server_error", Code: "no_replica_available",
		Message: msg, RetryAfter: retryAfter}}
}

// Done ends the request's place: a warming replica has room for the next.
func (p *Pass) Done() {
	if p == nil || !p.done.CompareAndSwap(false, true) {
		return
	}
	r := p.room
	r.mu.Lock()
	p.m.inflight--
	if r.models[p.m.name] == p.m {
		r.forget(p.m)
	}
	r.mu.Unlock()
	if r.held.Load() > 0 {
		r.wake()
	}
}

func (r *Room) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Run releases held requests as their models' replicas appear and their
// warm bounds free, and refuses those past their timeout — every Tick
// while any is held, and at once when the routing table changes, a
// request is held or one let through ends — until ctx ends. It returns
// nil; requests still held then wait for their timeout or their clients
// (the router stops taking requests first).
func (r *Room) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.Tick)
	defer t.Stop()
	for {
		changed := r.table.Changed()
		// Idle, only a held request wakes the loop.
		var tick <-chan time.Time
		if r.held.Load() > 0 {
			tick = t.C
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-r.kick:
		case <-tick:
		}
		if r.held.Load() > 0 {
			r.pass()
		}
	}
}

// pass refuses the held requests past their timeout and releases, in
// arrival order, what each model may take now.
func (r *Room) pass() {
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.models {
		if len(m.held) == 0 {
			continue
		}
		// Deadlines follow arrivals unless the model's timeout changed
		// in between: every held request is looked at.
		for i := 0; i < len(m.held); {
			w := m.held[i]
			if now.Before(w.deadline) {
				i++
				continue
			}
			r.unhold(m, w)
			r.m.wait.WithLabelValues(m.name).Observe(now.Sub(w.enqueued).Seconds())
			r.m.timeouts.WithLabelValues(m.name).Inc()
			w.refusal = r.refuse(m.name, ReasonTimeout, fmt.Sprintf(
				"the model %q had no replica ready to take this request within %s (autoscale.hold_timeout_s); retry later",
				m.name, w.deadline.Sub(w.enqueued)))
			close(w.ready)
		}
		eps, _ := r.table.Lookup(m.name)
		for len(m.held) > 0 && r.open(m, eps, now) {
			w := m.held[0]
			r.unhold(m, w)
			m.inflight++
			w.pass = &Pass{room: r, m: m, Waited: max(now.Sub(w.enqueued), time.Nanosecond)}
			r.m.wait.WithLabelValues(m.name).Observe(now.Sub(w.enqueued).Seconds())
			r.m.released.WithLabelValues(m.name).Inc()
			close(w.ready)
		}
		r.forget(m)
	}
}

type metrics struct {
	held     *prometheus.GaugeVec
	bytes    prometheus.Gauge
	released *prometheus.CounterVec
	timeouts *prometheus.CounterVec
	refused  *prometheus.CounterVec
	dropped  *prometheus.CounterVec
	wait     *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "llmgw_router_held_requests",
			Help: "Requests held by the waiting room: their autoscaled model has no replica ready to take them yet (design §5.7).",
		}, []string{"model"}),
		bytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmgw_router_held_bytes",
			Help: "Bodies of the requests the waiting room holds, over every model; bounded by hold_max_bytes.",
		}),
		released: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_hold_released_total",
			Help: "Held requests released to be served once their model had a replica ready to take them.",
		}, []string{"model"}),
		timeouts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_hold_timeouts_total",
			Help: "Held requests answered 503 after their model's autoscale.hold_timeout_s without a replica.",
		}, []string{"model"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_hold_refused_total",
			Help: "Requests the waiting room answered 503, by reason: max_held, max_bytes (at once) and hold_timeout.",
		}, []string{"model", "reason"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_hold_dropped_total",
			Help: "Held requests whose client went away before a replica was ready.",
		}, []string{"model"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "llmgw_router_hold_wait_seconds",
			Help:    "Time requests were held by the waiting room, released or timed out.",
			Buckets: prometheus.ExponentialBuckets(0.1, 2, 13),
		}, []string{"model"}),
	}
	if reg != nil {
		reg.MustRegister(m.held, m.bytes, m.released, m.timeouts, m.refused, m.dropped, m.wait)
	}
	return m
}
