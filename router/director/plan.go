package director

import (
	"context"
	"errors"
	"io"
	"slices"

	"github.com/llmgw/llmgw/router/breaker"
	"github.com/llmgw/llmgw/router/endpoint"
	"github.com/llmgw/llmgw/router/kvindex"
	"github.com/llmgw/llmgw/router/openai"
	"github.com/llmgw/llmgw/router/prefix"
	"github.com/llmgw/llmgw/router/scheduler"
	"github.com/llmgw/llmgw/router/tokenize"
	"github.com/llmgw/llmgw/vllm"
)

// maxPrefixChunks bounds the prompt text the prefix tree keys on: the
// sniffed prompt's bound in chunks (128 of 64 bytes).
const maxPrefixChunks = openai.MaxPromptBytes / prefix.DefaultChunk

// Input is what Prepare reads of a request besides its target.
type Input struct {
	// ID is the request's X-Request-ID; Session its X-Session-ID.
	ID, Session string
	// Kind is the endpoint's prompt form (chat or completion), for tier
	// 2's tokenization; tokenize.None skips tier 2.
	Kind tokenize.Kind
	// API is the API the request was sent to: which body edits apply and
	// how its answer's usage reads (design §7.1).
	API openai.API
	// Body is the request body as the client sent it, Stream and Prompt
	// what openai.Sniff read of it.
	Body   []byte
	Stream bool
	Prompt string
}

// Plan is one request ready for the proxy: the body to send, and the
// route that chooses a replica for each attempt and learns where the
// request went. It belongs to the request's goroutine.
type Plan struct {
	Target
	// Body is what goes to the engine: as the client sent it but for a few
	// fields, usage on streams (the router learns cached_tokens from it),
	// llama.cpp's adapter addressing (design §7.1, §7.6) and, for an
	// alias, `model`: the target's name (§7.9).
	Body   []byte
	Stream bool
	// StripUsage is set when the router asked for usage the client did
	// not: the usage chunk is dropped from the client's stream.
	StripUsage bool

	api     openai.API
	pick    *chooser
	kv      *tier2
	profile *scheduler.Profile
	req     *scheduler.Request
	chosen  scheduler.Candidate
	// tail keeps the end of the answer when tier 2 predicted something,
	// so the engine's cached_tokens can be held against the prediction.
	tail *tailBuffer
	// hashes are the prompt's block hashes when tier 2 answered; sent is
	// the current attempt's speculation and queued prefill.
	hashes []uint64
	sent   *attempt
	// use counts the current attempt as the adapter's use of its replica
	// (nil: not an adapter request, or use not counted); stopUse undoes
	// the release at the request context's end, once Done has released.
	use     *adapterUse
	hold    holdSlot
	stopUse func() bool
	ctx     context.Context // the request's, for the use's wait
	// aliasM counts an alias's answers by target (nil: no aliases).
	aliasM *aliasMetrics
}

// attempt is what one attempt recorded: the blocks it speculated on its
// replica and its part of the prefill ledger.
type attempt struct {
	rep        kvindex.Replica
	speculated bool
	ledger     uint64
}

// Prepare is stage 3: it edits the body as the engine must get it, and
// works out the scheduler's request, tier 2's KV query included (design
// §7.5: the scorer must not make a round trip, so it is made here, within
// the tokenize budget). Tier 2 never fails a request: every way it can
// fail is a fallback to tier 1. The error is a body the router cannot
// edit (400).
func (d *Director) Prepare(ctx context.Context, t Target, in Input) (*Plan, *openai.Error) {
	return d.prep.prepare(ctx, t, in, d.pick)
}

// preparer is stage 3: the body's edits, tier 1's hashes, tier 2's query.
type preparer struct {
	profiles Profiles
	kv       *tier2        // nil: tier 2 off
	use      *adapterUse   // nil: adapter use not counted
	aliasM   *aliasMetrics // nil: no aliases
}

func (p *preparer) prepare(ctx context.Context, t Target, in Input, pick *chooser) (*Plan, *openai.Error) {
	pl := &Plan{Target: t, Body: in.Body, Stream: in.Stream, api: in.API, pick: pick, kv: p.kv, aliasM: p.aliasM}
	if t.Alias != "" {
		// The engine serves the target under its own name (design §7.9).
		b, err := openai.WithModel(pl.Body, t.ServedName())
		if err != nil {
			return nil, openai.InvalidField("", err.Error())
		}
		pl.Body = b
	}
	if in.Stream && in.API.StreamOptions() && !openai.WantsUsage(pl.Body) {
		b, err := openai.WithUsage(pl.Body)
		if err != nil {
			var ae *openai.Error
			if errors.As(err, &ae) {
				return nil, ae
			}
			return nil, openai.InvalidField("", err.Error())
		}
		pl.Body, pl.StripUsage = b, true
	}
	if t.Adapter != "" && t.Model.GetEngine() == "llamacpp" {
		b, err := openai.ForLlamaCpp(pl.Body, t.Base, t.AdapterIndex)
		if err != nil {
			return nil, openai.InvalidField("", err.Error())
		}
		pl.Body = b
	}
	pl.req = &scheduler.Request{ID: in.ID, Model: t.Base, Adapter: t.Adapter, Session: in.Session,
		// Sized to the prompt's whole chunks: most prompts need far fewer
		// than the bound's 1 KiB.
		Prefix: prefix.Hashes(make([]uint64, 0, min(len(in.Prompt)/prefix.DefaultChunk, maxPrefixChunks)),
			in.Prompt, prefix.DefaultChunk, maxPrefixChunks)}
	if t.Adapter != "" && p.use != nil {
		// Released by Done or the next attempt; should the request end
		// without either (the client gone), by its context's end.
		pl.use, pl.ctx = p.use, ctx
		pl.stopUse = context.AfterFunc(ctx, pl.hold.release)
	}
	pl.profile = p.profiles.ProfileFor(t.Model)
	pl.req.KV, pl.hashes = p.kv.query(ctx, pl.profile, t.Model, t.Adapter, in.Kind, in.API, pl.Body, t.Endpoints)
	switch {
	case pl.req.KV != nil && pl.req.KV.Fallback == "":
		pl.tail = &tailBuffer{max: 256 << 10}
		if in.Stream {
			pl.tail.max = 16 << 10 // the usage chunk is the last event
		}
	default:
		// Only the output tokens are read (Done): usage is the end of the
		// answer.
		pl.tail = &tailBuffer{max: usageTail}
	}
	return pl, nil
}

// Next is stage 4, run for each attempt: it asks the scheduler for a
// replica among the plan's endpoints not in tried, and returns it with its
// key; nil when none is left or the scheduler's filters leave none.
//
// With tier 2's answer, each attempt is recorded as it is made (design
// §7.5 step 6): the prompt's blocks as speculative entries on the replica
// (when the profile speculates) and its prefill in the router's ledger. At
// the attempt rather than at Accepted, because a non-streamed answer's
// headers come only at its end, when the engine's events are already on
// their way; a next attempt means this one failed, so its record is
// withdrawn first.
//
// For an adapter, each attempt counts as the adapter's use of its replica
// in the reports to the control plane (design §7.6) until the next
// attempt, Done, or the request's end — an adapter not used there lately
// only once the control plane has acknowledged it (adapterUse.acquire, at
// most 200 ms) — and only replicas the table still shows holding it are
// chosen (choose).
func (p *Plan) Next(tried []*endpoint.Endpoint) (*endpoint.Endpoint, scheduler.Key) {
	p.settle(true)
	p.hold.release() // the previous attempt failed
	ep, cand := p.pick.choose(p.profile, p.req, p.Endpoints, tried, p.Adapter)
	if ep == nil {
		return nil, scheduler.Key{}
	}
	p.chosen = cand
	if p.hashes != nil {
		p.record(ep)
	}
	if p.use != nil {
		p.hold.set(p.use.acquire(p.ctx, p.Adapter, ep))
		if p.ctx.Err() != nil {
			p.hold.release() // the context ended before the hold was set
		}
	}
	return ep, cand.Key
}

// record is the attempt's speculation and prefill (see Next).
func (p *Plan) record(ep *endpoint.Endpoint) {
	q := p.req.KV
	a := &attempt{rep: kvindex.Replica{ID: ep.ReplicaID, UID: ep.UID, Incarnation: ep.Incarnation}}
	if p.profile.Speculation {
		a.speculated = p.kv.idx.Speculate(a.rep, p.hashes) > 0
	}
	own := max(q.Tokens-min(q.Matched[ep.ReplicaID], q.Total)*q.BlockSize, 0)
	a.ledger = p.kv.prefill.add(ep.ReplicaID, own)
	p.sent = a
	p.tail.first = p.prefilled
}

// prefilled is the answer's first byte: its prefill is done.
func (p *Plan) prefilled() { p.settle(false) }

// settle closes the current attempt's record: its prefill leaves the
// ledger, and when failed its speculative entries are withdrawn.
func (p *Plan) settle(failed bool) {
	a := p.sent
	if a == nil {
		return
	}
	p.sent = nil
	p.kv.prefill.done(a.rep.ID, a.ledger)
	if failed && a.speculated {
		p.kv.idx.Withdraw(a.rep, p.hashes)
	}
}

// Accepted records that the replica Next returned last accepted the
// request (design §7.5: where it went, never what was proposed). Call it
// before the answer reaches the client, so the next request with the same
// prefix sees it.
func (p *Plan) Accepted() { p.pick.sched.Observe(p.profile, p.req, p.chosen) }

// Tail is where the proxy copies the accepted answer's end for Done to
// read: its usage, and tier 2's cached tokens.
func (p *Plan) Tail() io.Writer {
	if p.tail == nil {
		return nil
	}
	return p.tail
}

// PromptTokens is the prompt's length in tokens when tier 2 tokenized it
// (ok false otherwise): the exact input a tenant's admission reserves.
func (p *Plan) PromptTokens() (int, bool) {
	if q := p.req.KV; q != nil && q.Tokens > 0 {
		return q.Tokens, true
	}
	return 0, false
}

// Blocks are the prompt's chained block hashes, for a capture of the
// traffic (router/capture): tier 2's, size tokens each, when it answered;
// else tier 1's chunks of the prompt's leading text, size bytes each
// (tokens false). The slice is the plan's: a caller keeping it copies it.
func (p *Plan) Blocks() (hashes []uint64, size int, tokens bool) {
	if q := p.req.KV; q != nil && q.Fallback == "" && len(p.hashes) > 0 {
		return p.hashes, q.BlockSize, true
	}
	return p.req.Prefix, prefix.DefaultChunk, false
}

// TextChunks are tier 1's chunk hashes of the prompt's leading text, size
// bytes each, whether or not tier 2 answered: a capture keeps them beside
// tier 2's blocks so that a replay can tell which tier-2 blocks a request
// only tier 1 saw (a tokenize timeout) shared with the others. The slice
// is the plan's.
func (p *Plan) TextChunks() (hashes []uint64, size int) {
	return p.req.Prefix, prefix.DefaultChunk
}

// Usage is the usage block of the accepted answer's end, read before Done
// (which clears it); ok false when the answer carried none.
func (p *Plan) Usage() (vllm.Usage, bool) {
	if p.tail == nil {
		return vllm.Usage{}, false
	}
	return openai.UsageFor(p.api, p.Stream, p.tail.b)
}

// usageTail is how much of an answer's end is kept without a tier-2
// prediction to check: enough for the usage object (or a stream's usage
// chunk) and what follows it.
const usageTail = 4 << 10

// Done is the director's part of stage 6: once replica answered with
// code, tier 2's prediction is held against the cached tokens it reported.
// It returns the answer's output tokens (usage.completion_tokens; ok false
// when the answer carried none, or did not succeed).
func (p *Plan) Done(replica string, code int) (outputTokens int, ok bool) {
	p.settle(code >= 500)
	if replica != "" {
		p.served(code)
	}
	if p.use != nil {
		p.hold.release()
		p.stopUse()
	}
	if p.tail == nil || code != 200 {
		return 0, false
	}
	outputTokens, ok = openai.CompletionTokensFor(p.api, p.Stream, p.tail.b)
	p.kv.observe(p.req.KV, replica, p.api, p.Stream, p.tail.b)
	p.tail.b = p.tail.b[:0]
	return outputTokens, ok
}

// chooser is stage 4: each attempt's candidates and the scheduler's pick.
type chooser struct {
	loads    Loads
	holdings Holdings
	breakers BreakerViews
	sched    Picker
}

// choose asks the scheduler among the endpoints not yet tried. For an
// adapter, among those the table still shows holding it: the plan's
// endpoints were its holders at Resolve, and one the control plane has
// evicted the adapter from since is about to unload it (design §7.6: once
// its placement no longer lists a replica, no request goes there, so its
// requests drain and the agent unloads it). When none of them holds it any
// more the plan's own are tried: the agent unloads only an idle adapter,
// and a 404 is resolved again, never the client's answer.
func (c *chooser) choose(prof *scheduler.Profile, sreq *scheduler.Request, eps, tried []*endpoint.Endpoint, adapter string) (*endpoint.Endpoint, scheduler.Candidate) {
	var small, holding [8]*endpoint.Endpoint // most models have few replicas: no allocation
	left, held := small[:0], holding[:0]
	for _, e := range eps {
		if !slices.Contains(tried, e) {
			left = append(left, e)
			if adapter != "" && c.holdings.Holds(e, adapter) {
				held = append(held, e)
			}
		}
	}
	if len(held) > 0 {
		left = held
	}
	if len(left) == 0 {
		return nil, scheduler.Candidate{}
	}
	cands := make([]scheduler.Candidate, len(left))
	for i, e := range left {
		l := c.loads.LoadOf(e)
		k := Key(e)
		cands[i] = scheduler.Candidate{Key: k, Waiting: l.Waiting, Running: l.Running, KVUsage: l.KVUsage,
			Inflight: l.Inflight, Weight: e.Weight, Saturated: l.Saturated, Breaker: c.breakerView(k),
			HasAdapter: adapter != "" && c.holdings.Holds(e, adapter)}
	}
	i := c.sched.Pick(prof, sreq, cands)
	if i < 0 || i >= len(left) {
		return nil, scheduler.Candidate{}
	}
	return left[i], cands[i]
}

func (c *chooser) breakerView(k scheduler.Key) scheduler.BreakerView {
	b := c.breakers.Peek(k)
	if b == nil {
		return scheduler.BreakerClosed
	}
	switch st, due := b.View(); {
	case st == breaker.Closed:
		return scheduler.BreakerClosed
	case due:
		return scheduler.BreakerProbeDue
	default:
		return scheduler.BreakerCoolingDown
	}
}
