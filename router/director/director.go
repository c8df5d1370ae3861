// Package director is the middle of the router's request pipeline (design
// §7.3, §7.5, §7.6): between the HTTP surface that decoded a request
// (router/api) and the proxy that forwards it (router/proxy), it decides
// everything about where the request goes. It
//
//   - resolves the name in `model` to a model, or to one of its adapters
//     and the replicas holding it, waiting for a cold adapter to load
//     (design §7.6), or an alias to one of its targets, and to the next
//     of its fallbacks when that target refuses (design §7.9);
//   - prepares what the scheduler reads: tier 1's prefix hashes, and tier
//     2's tokens, block hashes and index matches (design §7.5), with the
//     body edited as the engine must get it;
//   - chooses the replica for each attempt, never one already tried
//     (design §7.3, §7.4), and records where the request went once a
//     replica accepted it — where it went, never what was proposed;
//   - records each tier-2 attempt as it is made: the prompt's blocks as
//     speculative entries on its replica (design §7.5 step 6) and its
//     prefill in the ledger the cost score reads, withdrawn when the
//     attempt fails;
//   - holds tier 2's prediction against the cached tokens the engine then
//     reported, the one measure of whether the index is exact in practice.
//
// It is the director of the Gateway API Inference Extension's request
// flow (handler → director → scheduler → proxy): it knows requests and
// replicas, not connections. Each stage holds only the interfaces it reads,
// so each can be tested, and reasoned about, alone.
package director

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/breaker"
	"github.com/llmgw/llmgw/router/endpoint"
	"github.com/llmgw/llmgw/router/kvindex"
	"github.com/llmgw/llmgw/router/openai"
	"github.com/llmgw/llmgw/router/scheduler"
)

// Models is desired state as the resolver reads it (endpoint.Registry).
// Safe for concurrent use; it never blocks on the control plane.
type Models interface {
	// Lookup returns a model's routable endpoints and whether the model is
	// in desired state. The caller does not modify the slice.
	Lookup(model string) (eps []*endpoint.Endpoint, known bool)
	// Models returns the desired models, sorted by name.
	Models() []*llmgwv1.Model
	// Adapter resolves an adapter name to its base model (design §7.6).
	Adapter(name string) (endpoint.AdapterRef, bool)
}

// Holdings say which replicas hold which adapters now (endpoint.Registry).
// Safe for concurrent use.
type Holdings interface {
	// Holds reports whether an endpoint can serve the adapter now.
	Holds(e *endpoint.Endpoint, adapter string) bool
	// Changed is closed once the routing table is rebuilt; a caller that
	// got it before reading Holds misses no change.
	Changed() <-chan struct{}
}

// Loads give each endpoint's current load (endpoint.Registry). Safe for
// concurrent use; cheap (no I/O).
type Loads interface {
	LoadOf(e *endpoint.Endpoint) endpoint.Load
}

// Table is the whole routing table the director reads; its stages each
// take the part they need.
type Table interface {
	Models
	Holdings
	Loads
}

// Profiles give each model its scheduling profile (scheduler.Scheduler).
// Called concurrently.
type Profiles interface {
	ProfileFor(m *llmgwv1.Model) *scheduler.Profile
}

// Picker chooses replicas and remembers where requests went
// (scheduler.Scheduler). Called concurrently.
type Picker interface {
	// Pick returns an index into cands, or -1 when none may take r now.
	// It does not modify cands.
	Pick(p *scheduler.Profile, r *scheduler.Request, cands []scheduler.Candidate) int
	// Observe records where r was sent, once the replica accepted it.
	Observe(p *scheduler.Profile, r *scheduler.Request, chosen scheduler.Candidate)
}

// Scheduler is the scheduler as the director uses it: profiles to
// prepare with, picks and observations to schedule with.
type Scheduler interface {
	Profiles
	Picker
}

// BreakerViews show the per-replica circuit breakers to the scheduler
// (breaker.Set). The director only reads them; the proxy drives them.
type BreakerViews interface {
	// Peek returns the replica's breaker, or nil when it never failed
	// (closed). It creates nothing.
	Peek(k scheduler.Key) *breaker.Breaker
}

// Option turns on an optional stage: tier 2 (WithKV), cold adapters
// (WithAdapters).
type Option func(*options)

type options struct {
	kv       *kvOptions
	adapters *adapterOptions
	use      *useOptions
	aliases  *aliasOptions
}

type kvOptions struct {
	idx       KVIndex
	tok       Tokenizer
	minBlocks int
	weights   *kvindex.Weights
}

type adapterOptions struct {
	ctl      AdapterControl
	wait     time.Duration
	queueLen int
	clock    Clock
}

// WithKV turns tier 2 on for models with kv_events (design §7.5): requests
// are tokenized through tok, hashed as vLLM does and looked up in idx; a
// replica must hold minBlocks leading blocks to be preferred. Without it
// every request is routed by tiers 0 and 1.
func WithKV(idx KVIndex, tok Tokenizer, minBlocks int) Option {
	return func(o *options) { o.kv = &kvOptions{idx: idx, tok: tok, minBlocks: minBlocks} }
}

// WithKVCredit credits blocks an engine holds in an offload tier by w
// (design §7.5 "Offload tiers"), when WithKV's index knows tiers
// (TieredKVIndex). Without it tier 2 credits GPU blocks only. It applies
// after WithKV.
func WithKVCredit(w kvindex.Weights) Option {
	return func(o *options) {
		if o.kv != nil {
			o.kv.weights = &w
		}
	}
}

// WithAdapters lets a request for a cold adapter wait up to wait for it to
// load, asking ctl to place it (design §7.6); wait <= 0 takes
// DefaultAdapterWait. Without it such requests get 503 at once.
func WithAdapters(ctl AdapterControl, wait time.Duration) Option {
	return func(o *options) {
		if o.adapters == nil {
			o.adapters = &adapterOptions{}
		}
		o.adapters.ctl, o.adapters.wait = ctl, wait
	}
}

// WithAdapterQueue bounds the requests waiting for cold adapters to n per
// model (DefaultAdapterQueue when n <= 0), timed by clock (nil: RealClock;
// tests pass their own). It applies with WithAdapters.
func WithAdapterQueue(n int, clock Clock) Option {
	return func(o *options) {
		if o.adapters == nil {
			o.adapters = &adapterOptions{}
		}
		o.adapters.queueLen, o.adapters.clock = n, clock
	}
}

// Director runs the resolve, prepare and schedule stages of each request.
// Safe for concurrent use; Close stops the adapter loads requests wait on.
type Director struct {
	res  *resolver
	prep *preparer
	pick *chooser
	kv   *tier2      // nil: tier 2 off
	use  *adapterUse // nil: adapter use not counted
}

// New builds a director over the routing table, the scheduler and the
// breakers; reg receives its metrics (nil for none).
func New(table Table, sched Scheduler, breakers BreakerViews, reg prometheus.Registerer, opts ...Option) *Director {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	adm := newAdapterMetrics(reg)
	var kv *tier2
	if o.kv != nil {
		kv = &tier2{idx: o.kv.idx, tok: o.kv.tok, loads: table, minBlocks: o.kv.minBlocks, m: newKVMetrics(reg),
			prefill: newPrefillLedger(time.Now)}
		if tx, ok := o.kv.idx.(TieredKVIndex); ok && o.kv.weights != nil {
			kv.tiers, kv.weights = tx, *o.kv.weights
		}
	}
	res := &resolver{models: table, holdings: table, loads: table, m: adm}
	if o.aliases != nil && o.aliases.table != nil {
		res.aliases = &aliases{table: o.aliases.table, rnd: o.aliases.rnd, m: newAliasMetrics(reg)}
	}
	if o.adapters != nil && o.adapters.ctl != nil {
		res.ad = newAdapters(o.adapters.ctl, o.adapters.wait, o.adapters.queueLen, o.adapters.clock, adm)
	}
	var use *adapterUse
	if o.use != nil && o.use.rep != nil {
		use = newAdapterUse(o.use, table, adm)
	}
	var am *aliasMetrics
	if res.aliases != nil {
		am = res.aliases.m
	}
	return &Director{
		res:  res,
		prep: &preparer{profiles: sched, kv: kv, use: use, aliasM: am},
		pick: &chooser{loads: table, holdings: table, breakers: breakers, sched: sched},
		kv:   kv,
		use:  use,
	}
}

// Close ends the adapter loads requests were waiting on and the adapter
// use reports, and waits for them. Call it once no request runs.
func (d *Director) Close() {
	d.res.ad.close()
	d.use.close()
}

// AdapterMissing tells the director that eps answered 404 for adapter
// although the table says they hold it (evicted and unloaded before the
// table caught up): they are not given it again on the table's word for a
// couple of seconds (missingFor), so Resolve then waits for another
// holder, or the reload (design §7.6). Without on-demand adapters it does
// nothing.
func (d *Director) AdapterMissing(adapter string, eps []*endpoint.Endpoint) {
	if d.res.ad != nil {
		d.res.ad.markMissing(adapter, eps)
	}
}

// Key is an endpoint's identity for per-replica state (design §4): what
// the scheduler's memory and the breakers are keyed by.
func Key(e *endpoint.Endpoint) scheduler.Key {
	return scheduler.Key{ID: e.ReplicaID, UID: e.UID, Incarnation: e.Incarnation}
}

// Target is what a request's model name resolved to.
type Target struct {
	// Name is the request's `model`, as the client sent it.
	Name string
	// Base is the model that serves the request. Adapter is the adapter
	// Name named ("" for the base model itself) and AdapterIndex its place
	// in the model's list, which llama.cpp addresses it by.
	Base, Adapter string
	AdapterIndex  int
	// Model is Base's desired state: an empty one (the default profile)
	// if it vanished since the lookup.
	Model *llmgwv1.Model
	// Endpoints are the replicas the request may go to: the model's
	// routable ones, or for an adapter those holding it. Empty when none
	// is ready (the request then gets 503).
	Endpoints []*endpoint.Endpoint
	// Alias is the alias Name named, "" when Name is a model or an
	// adapter (design §7.9); the target it resolved to is Base, or
	// Adapter when set (ServedName), and the engine gets the request
	// under that name.
	Alias string
	// chain is an alias's request's candidates (aliases.go).
	chain *aliasChain
}

// Resolve is stage 2: it maps name, the request's `model`, to a model
// or one of its adapters (as vLLM does, design §7.6), and for an adapter
// narrows the endpoints to those holding it, waiting up to the adapter
// wait for a cold one. On error the target's Base is set when name did
// resolve (the wait for its adapter failed), so the caller can label the
// refusal with the model; an error while ctx is done means the client
// went away. log receives the wait's progress.
func (d *Director) Resolve(ctx context.Context, name string, log *slog.Logger) (Target, *openai.Error) {
	return d.ResolveFor(ctx, name, Caller{}, log)
}

// resolver is stage 2: names to models, adapters to their holders,
// aliases to one of their targets (aliases.go).
type resolver struct {
	models   Models
	holdings Holdings
	loads    Loads     // an alias's candidates' overload
	ad       *adapters // nil: cold adapters are refused
	aliases  *aliases  // nil: no aliases
	m        *adapterMetrics
}

func (r *resolver) resolve(ctx context.Context, name string, log *slog.Logger) (Target, *openai.Error) {
	t := Target{Name: name, Base: name}
	eps, known := r.models.Lookup(name)
	if !known {
		ref, isAdapter := r.models.Adapter(name)
		if !isAdapter {
			return Target{Name: name}, openai.ModelNotFound(name)
		}
		t.Base, t.Adapter, t.AdapterIndex = ref.Model, name, ref.Index
		if eps, known = r.models.Lookup(t.Base); !known {
			return Target{Name: name}, openai.ModelNotFound(name)
		}
	}
	if t.Adapter != "" {
		var err *openai.Error
		if eps, err = r.holders(ctx, t.Adapter, t.Base, eps, log.With("model", t.Base, "adapter", t.Adapter)); err != nil {
			return t, err
		}
	}
	t.Endpoints = eps
	t.Model = r.model(t.Base)
	return t, nil
}

// model returns the desired-state model named name, or an empty one (the
// default profile) if it vanished since Lookup.
func (r *resolver) model(name string) *llmgwv1.Model {
	ms := r.models.Models()
	if i, ok := slices.BinarySearchFunc(ms, name, func(m *llmgwv1.Model, n string) int { return strings.Compare(m.GetName(), n) }); ok {
		return ms[i]
	}
	return &llmgwv1.Model{Name: name}
}
