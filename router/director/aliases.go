package director

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/endpoint"
	"github.com/llmgw/llmgw/router/openai"
	"github.com/llmgw/llmgw/router/prefix"
)

// Model aliases (design §7.9). An alias is a name clients send as `model`
// that stands for weighted targets — models or adapters — and an ordered
// list of fallbacks. Stage 2 resolves it per request:
//
//  1. draw a target among those that exist with weight above 0: by weight
//     with the injected randomness, or — sticky by key or session — by
//     weighted rendezvous hashing of the key's name or the X-Session-ID
//     over the targets' names, which every router computes alike and
//     which moves only the keys a weight change must move (a target's
//     share of keys follows its weight; raising one target takes keys
//     only from the others, lowering it gives only its own away);
//  2. line up the candidates: the drawn target, then the fallbacks in
//     order (not the drawn target again);
//  3. take the first candidate that can serve now: one that exists, with
//     a routable replica that is not overloaded (every reading stale or
//     its KV cache past 0.95); if none can, the first overloaded one, and
//     failing that the first that exists, whose 503 the client gets.
//
// When the target answers 429 or 503 (from its last replica tried), or
// refuses the context length (vLLM's and llama.cpp's 400), before any
// byte reached the client, or every replica tried failed, the request is
// served again from the next candidate (Fallback). The body's `model` is
// rewritten to the target's name, as the engine serves it; the answer's
// `model` is the engine's, the target's name, as OpenAI's own aliases
// answer with the snapshot they resolved to.

// overloadedKV is the KV-cache use past which a replica counts as
// overloaded for an alias: flow control's default kv_ceiling (§7.8).
const overloadedKV = 0.95

// WithAliases turns model aliases on (design §7.9): aliases returns the
// aliases in force now, by name (the watch client's current state; the
// map is never modified), and rnd draws a non-sticky request's target, a
// value in [0, 1) (nil: math/rand/v2; tests pass a seeded source).
func WithAliases(aliases func() map[string]*llmgwv1.Alias, rnd func() float64) Option {
	return func(o *options) {
		if rnd == nil {
			rnd = rand.Float64
		}
		o.aliases = &aliasOptions{table: aliases, rnd: rnd}
	}
}

type aliasOptions struct {
	table func() map[string]*llmgwv1.Alias
	rnd   func() float64
}

// Caller is who sent a request, for an alias's stickiness: its API key's
// name ("" without a key) and its X-Session-ID ("" without one). A sticky
// alias draws the request of a caller without the key or session it is
// sticky by as a non-sticky one.
type Caller struct {
	Key, Session string
}

// ResolveFor is Resolve for a request from caller: a sticky alias sends
// all of a key's (or a session's) requests to one target.
func (d *Director) ResolveFor(ctx context.Context, name string, c Caller, log *slog.Logger) (Target, *openai.Error) {
	if d.res.aliases != nil {
		if a := d.res.aliases.lookup(name); a != nil {
			return d.res.resolveAlias(ctx, a, c, log)
		}
	}
	return d.res.resolve(ctx, name, log)
}

// Reasons an alias's request moved on from a candidate, the label of
// llmgw_router_alias_fallbacks_total.
const (
	reasonUnknown       = "unknown_target"
	reasonNoReplica     = "no_replica"
	reasonOverloaded    = "overloaded"
	reasonUnavailable   = "unavailable"
	reasonRateLimited   = "rate_limited"
	reasonContextLength = "context_length"
	reasonUpstream      = "upstream_error"
	reasonResolve       = "resolve_failed"
)

// Fallback is stage 2 again for an alias's request whose target refused
// it before any byte reached the client (design §7.9): code is the status
// of the refusal, diverted whether it was the engine's own answer (the
// plan's Divert claimed it) rather than the router's (no replica took it,
// 503; every replica tried failed, 502). It returns the next candidate
// that can serve, or false when t is not an alias's, the refusal is not
// one an alias falls back on, or no candidate left can serve; the caller
// then answers with the refusal it has.
func (d *Director) Fallback(ctx context.Context, t Target, code int, diverted bool, log *slog.Logger) (Target, bool) {
	ch := t.chain
	if ch == nil || d.res.aliases == nil {
		return Target{}, false
	}
	var reason string
	switch {
	case diverted && code == http.StatusBadRequest:
		reason = reasonContextLength
	case diverted && code == http.StatusTooManyRequests:
		reason = reasonRateLimited
	case diverted && code == http.StatusServiceUnavailable:
		reason = reasonUnavailable
	case !diverted && code == http.StatusServiceUnavailable:
		reason = reasonNoReplica
	case !diverted && code == http.StatusBadGateway:
		reason = reasonUpstream
	default:
		return Target{}, false
	}
	if ch.next >= len(ch.names) || ctx.Err() != nil {
		return Target{}, false
	}
	next, _, ok := d.res.fromChain(ctx, ch, false, log)
	if !ok {
		return Target{}, false
	}
	d.res.aliases.m.fallbacks.WithLabelValues(ch.alias, t.ServedName(), reason).Inc()
	log.Info("router: alias falls back", "alias", ch.alias, "from", t.ServedName(), "to", next.ServedName(), "reason", reason, "status", code)
	return next, true
}

// ServedName is the name the target's engine serves the request under:
// the adapter's, or the model's.
func (t Target) ServedName() string {
	if t.Adapter != "" {
		return t.Adapter
	}
	return t.Base
}

// aliasChain is an alias's request's candidates: the drawn target, then
// the fallbacks not yet tried. It belongs to the request.
type aliasChain struct {
	alias string
	names []string
	next  int // the candidate to try next
}

// aliases is stage 2's alias table, its randomness and its metrics.
type aliases struct {
	table func() map[string]*llmgwv1.Alias
	rnd   func() float64
	m     *aliasMetrics
}

func (a *aliases) lookup(name string) *llmgwv1.Alias {
	if a.table == nil {
		return nil
	}
	return a.table()[name]
}

// resolveAlias draws a's target for caller c and resolves the first
// candidate that can serve (see the package's alias notes, steps 1–3).
func (r *resolver) resolveAlias(ctx context.Context, a *llmgwv1.Alias, c Caller, log *slog.Logger) (Target, *openai.Error) {
	drawn := r.draw(a, c)
	ch := &aliasChain{alias: a.GetName(), names: make([]string, 0, 1+len(a.GetFallbacks()))}
	label := drawn
	if drawn != "" {
		ch.names = append(ch.names, drawn)
	} else {
		label = "_none" // every target is gone or weighs 0: the fallbacks alone
	}
	r.aliases.m.requests.WithLabelValues(a.GetName(), label).Inc()
	for _, f := range a.GetFallbacks() {
		if f != drawn {
			ch.names = append(ch.names, f)
		}
	}
	t, err, ok := r.fromChain(ctx, ch, true, log)
	switch {
	case ok:
		return t, nil
	case err != nil: // the client went away, or the last candidate's own refusal
		return Target{Name: a.GetName(), Alias: a.GetName()}, err
	}
	return Target{Name: a.GetName(), Alias: a.GetName()}, &openai.Error{Status: http.StatusServiceUnavailable, Type: "server_error",
		Code: "no_replica_available", RetryAfter: 1,
		Message: fmt.Sprintf("the alias %q has no target or fallback that exists now; retry shortly", a.GetName())}
}

// exists reports whether name is a model, or an adapter of one, in
// desired state.
func (r *resolver) exists(name string) bool {
	if _, ok := r.models.Lookup(name); ok {
		return true
	}
	ref, ok := r.models.Adapter(name)
	if !ok {
		return false
	}
	_, ok = r.models.Lookup(ref.Model)
	return ok
}

// draw is step 1: the target for this request, "" when none exists with
// weight above 0.
func (r *resolver) draw(a *llmgwv1.Alias, c Caller) string {
	var small [maxDrawTargets]int
	live := small[:0]
	total := 0.0
	for i, t := range a.GetTargets() {
		if t.GetWeight() > 0 && r.exists(t.GetTarget()) {
			live = append(live, i)
			total += float64(t.GetWeight())
		}
	}
	if len(live) == 0 {
		return ""
	}
	key := ""
	switch a.GetSticky() {
	case "key":
		key = c.Key
	case "session":
		key = c.Session
	}
	targets := a.GetTargets()
	if key != "" {
		return targets[stickyPick(key, targets, live)].GetTarget()
	}
	x := r.aliases.rnd() * total
	for _, i := range live {
		x -= float64(targets[i].GetWeight())
		if x < 0 {
			return targets[i].GetTarget()
		}
	}
	return targets[live[len(live)-1]].GetTarget() // rounding at the top end
}

// maxDrawTargets is the targets a draw holds without allocating: the
// FSM's bound on an alias's targets (fsm.MaxAliasTargets; the router may
// not import fsm).
const maxDrawTargets = 16

// stickyPick is weighted rendezvous hashing: of targets[live...], the one
// whose -ln(u) / weight is least, u uniform in (0, 1) from a hash of key
// and the target's name. Each target wins a share of keys equal to its
// share of the weight (the least of exponential draws of rates w_i); the
// hash is FNV-1a with splitmix64's finalizer, the same on every router.
// A weight change moves only the keys it must: a target whose weight
// grows wins keys from the others and loses none.
func stickyPick(key string, targets []*llmgwv1.AliasTarget, live []int) int {
	kh := prefix.Mix(fnv64(key))
	best, bestScore := live[0], math.Inf(1)
	for _, i := range live {
		h := prefix.Mix(kh ^ prefix.Mix(fnv64(targets[i].GetTarget())))
		u := (float64(h>>11) + 0.5) / (1 << 53)
		if s := -math.Log(u) / float64(targets[i].GetWeight()); s < bestScore {
			best, bestScore = i, s
		}
	}
	return best
}

func fnv64(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// skipped is a candidate passed over, and why.
type skipped struct{ name, reason string }

// fromChain is step 3 from ch's next candidate on: the first that can
// serve now. first is set for a request's first resolution, which also
// settles for an overloaded candidate or one with no replica (whose 503
// the client then gets, naming the alias); a fallback settles only for an
// overloaded one, as the refusal it falls back from is the better answer
// than a 503. Candidates passed over are counted as fallbacks. When none
// is taken, err is the last candidate's own refusal (a cold adapter's),
// or the resolution's while the client went away; nil when every
// candidate is gone.
func (r *resolver) fromChain(ctx context.Context, ch *aliasChain, first bool, log *slog.Logger) (_ Target, err *openai.Error, _ bool) {
	var passed []skipped
	var overloaded, noReplica *Target
	overloadedAt, noReplicaAt := 0, 0
	for ch.next < len(ch.names) {
		name := ch.names[ch.next]
		ch.next++
		t, rerr := r.resolve(ctx, name, log)
		switch {
		case rerr != nil && ctx.Err() != nil:
			return Target{}, rerr, false
		case rerr != nil && rerr.Status == http.StatusNotFound:
			passed = append(passed, skipped{name, reasonUnknown})
			continue
		case rerr != nil:
			// A cold adapter that did not load within the wait, or its
			// queue full: the next candidate may serve.
			passed = append(passed, skipped{name, reasonResolve})
			err = rerr
			continue
		}
		t.Name, t.Alias, t.chain = ch.alias, ch.alias, ch
		switch {
		case len(t.Endpoints) == 0:
			if noReplica == nil {
				noReplica, noReplicaAt = &t, len(passed)
			}
			passed = append(passed, skipped{name, reasonNoReplica})
		case r.overloaded(t.Endpoints):
			if overloaded == nil {
				overloaded, overloadedAt = &t, len(passed)
			}
			passed = append(passed, skipped{name, reasonOverloaded})
		default:
			r.countPassed(ch.alias, passed)
			return t, nil, true
		}
	}
	// None can serve now: the first overloaded one (its queue beats a
	// refusal), else for a first resolution the first that exists. The
	// candidates before it count as passed over; the chain stays used up.
	switch {
	case overloaded != nil:
		r.countPassed(ch.alias, passed[:overloadedAt])
		return *overloaded, nil, true
	case first && noReplica != nil:
		r.countPassed(ch.alias, passed[:noReplicaAt])
		return *noReplica, nil, true
	}
	return Target{}, err, false
}

func (r *resolver) countPassed(alias string, passed []skipped) {
	for _, p := range passed {
		r.aliases.m.fallbacks.WithLabelValues(alias, p.name, p.reason).Inc()
	}
}

// overloaded reports whether no endpoint can take a request now: every
// reading stale (saturated, design §7.2) or its KV cache past
// overloadedKV.
func (r *resolver) overloaded(eps []*endpoint.Endpoint) bool {
	if r.loads == nil {
		return false
	}
	for _, e := range eps {
		if l := r.loads.LoadOf(e); !l.Saturated && l.KVUsage < overloadedKV {
			return false
		}
	}
	return true
}

// contextLengthMarks are how engines word a request longer than the
// model's context: vLLM's (its several releases: "This model's maximum
// context length is N tokens…", "… the model's context length is only
// N…"), OpenAI's code, and llama.cpp's server.
var contextLengthMarks = [][]byte{
	[]byte("maximum context length"), []byte("context length is only"), []byte("context_length_exceeded"),
	[]byte("exceed_context_size"), []byte("exceeds the available context size"),
}

// divertable is what an alias falls back on from an engine's answer
// (design §7.9): 429, 503, and a 400 refusing the context length.
func divertable(code int, body []byte) bool {
	switch code {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return true
	case http.StatusBadRequest:
		for _, m := range contextLengthMarks {
			if bytes.Contains(body, m) {
				return true
			}
		}
	}
	return false
}

// Divert is the proxy's question for this plan (proxy.Request.Divert): for
// an alias's request with a candidate left, claim an engine's answer the
// alias falls back on; nil otherwise, so every answer passes on.
func (p *Plan) Divert() func(code int, body []byte) bool {
	if p.chain == nil || p.chain.next >= len(p.chain.names) {
		return nil
	}
	return divertable
}

// served counts an alias's answer by the target that gave it.
func (p *Plan) served(code int) {
	if p.Alias != "" && p.aliasM != nil {
		p.aliasM.served.WithLabelValues(p.Alias, p.ServedName(), strconv.Itoa(code)).Inc()
	}
}

// aliasMetrics are the aliases' series; aliases and their targets come
// from the replicated state, so the labels are bounded.
type aliasMetrics struct {
	requests  *prometheus.CounterVec
	fallbacks *prometheus.CounterVec
	served    *prometheus.CounterVec
}

func newAliasMetrics(reg prometheus.Registerer) *aliasMetrics {
	m := &aliasMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_alias_requests_total",
			Help: "Requests naming an alias, by the target drawn for them (by weight, or sticky); _none when no target exists with weight above 0.",
		}, []string{"alias", "target"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_alias_fallbacks_total",
			Help: "Requests of an alias moved off a target to the next candidate, by why: unknown_target, no_replica, overloaded, resolve_failed, unavailable (503), rate_limited (429), context_length, upstream_error.",
		}, []string{"alias", "target", "reason"}),
		served: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_alias_served_total",
			Help: "Answers to requests naming an alias, by the target that gave them and their status.",
		}, []string{"alias", "target", "code"}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.fallbacks, m.served)
	}
	return m
}
