package director

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/endpoint"
	"github.com/llmgw/llmgw/router/kvindex"
	"github.com/llmgw/llmgw/router/openai"
	"github.com/llmgw/llmgw/router/scheduler"
	"github.com/llmgw/llmgw/router/tokenize"
	"github.com/llmgw/llmgw/vllm"
)

// KVIndex is the precise index tier 2 asks (kvindex.Index). Safe for
// concurrent use.
type KVIndex interface {
	// Lookup appends how many of hashes' leading blocks each replica holds.
	Lookup(hashes []uint64, dst []kvindex.Match) []kvindex.Match
	// LookupPending is Lookup counting this router's pending speculative
	// entries as held.
	LookupPending(hashes []uint64, dst []kvindex.Match) []kvindex.Match
	// Speculate records hashes as pending on the replica an attempt goes
	// to; Withdraw drops them again when the attempt failed.
	Speculate(r kvindex.Replica, hashes []uint64) int
	Withdraw(r kvindex.Replica, hashes []uint64)
	// Status says what the index holds for a replica; false: nothing yet.
	Status(id string) (kvindex.Status, bool)
}

// TieredKVIndex is a KVIndex that knows the engines' offload tiers
// (kvindex.Index): tier 2 then credits a block by the best tier holding it
// (design §7.5 "Offload tiers").
type TieredKVIndex interface {
	LookupTiers(hashes []uint64, w kvindex.Weights, pending bool, dst []kvindex.TierMatch) []kvindex.TierMatch
}

// Tokenizer tokenizes through an engine within its budget
// (tokenize.Client). Safe for concurrent use; the returned tokens are not
// modified.
type Tokenizer interface {
	Tokenize(ctx context.Context, addr string, req tokenize.Request) ([]int, error)
}

// tier2 works out a request's KVQuery before scheduling (design §7.5 tier
// 2, steps 4–5). It reads the loads only to choose the replica to tokenize
// on.
type tier2 struct {
	idx       KVIndex
	tok       Tokenizer
	loads     Loads
	minBlocks int
	// tiers, when set, is idx's tiered lookup and weights its credits;
	// nil looks up the GPU tier alone.
	tiers   TieredKVIndex
	weights kvindex.Weights
	m       *kvMetrics
	prefill *prefillLedger
}

// query returns the KVQuery for a request to model m over eps, or nil
// when tier 2 is off or the model does not use it. Every way it can fail
// is a Fallback reason: tier 1 then routes, and the request itself never
// fails for it.
//
// An adapter request is tokenized under the base model's name (adapters
// share its tokenizer) and hashed with the adapter's name in the extra
// keys, as vLLM hashes its blocks (design §7.6).
//
// It also returns the prompt's block hashes (the low 64 bits), for the
// speculative entries of each attempt; nil with a fallback. prof says
// whether this router's pending entries count as held.
func (t *tier2) query(ctx context.Context, prof *scheduler.Profile, m *llmgwv1.Model, adapter string, kind tokenize.Kind, api openai.API, body []byte, eps []*endpoint.Endpoint) (*scheduler.KVQuery, []uint64) {
	if t == nil || !m.GetKvEvents() || len(eps) == 0 || kind == tokenize.None {
		return nil, nil
	}
	fallback := func(why string) (*scheduler.KVQuery, []uint64) { return &scheduler.KVQuery{Fallback: why}, nil }
	// No replica has reported yet: no point tokenizing.
	known := false
	for _, e := range eps {
		if st, ok := t.idx.Status(e.ReplicaID); ok && st.UID == e.UID && st.Incarnation == e.Incarnation {
			known = true
			break
		}
	}
	if !known {
		return fallback(scheduler.KVNoData)
	}
	req, err := tokenize.Prepare(kind, m.GetName(), body)
	switch {
	case errors.Is(err, tokenize.ErrMultimodal):
		return fallback(scheduler.KVMultimodal)
	case err != nil:
		return fallback(scheduler.KVUnsupported)
	}
	toks, err := t.tok.Tokenize(ctx, t.leastLoaded(eps).Address, req)
	if sp := trace.SpanFromContext(ctx); sp.IsRecording() {
		sp.AddEvent("llmgw.tokenized", trace.WithAttributes(attribute.Int("llmgw.prompt_tokens", len(toks)),
			attribute.Bool("llmgw.tokenize_failed", err != nil)))
	}
	switch {
	case errors.Is(err, tokenize.ErrTimeout):
		return fallback(scheduler.KVTokenizeTimeout)
	case err != nil:
		return fallback(scheduler.KVTokenizeError)
	}
	bs := int(m.GetBlockSize())
	if bs == 0 {
		bs = 16 // vLLM's default, as the agent starts it (fsm fills it in for kv_events models)
	}
	salt := ""
	if api != openai.Messages { // vLLM's Messages API takes no cache_salt
		salt = openai.CacheSalt(body)
	}
	hs, err := vllm.BlockHashes(vllm.NoneHash(m.GetHashSeed()), toks, bs, vllm.RequestExtraKeys(adapter, salt))
	if err != nil {
		return fallback(scheduler.KVUnsupported)
	}
	if len(hs) == 0 {
		return fallback(scheduler.KVShortPrompt)
	}
	low := make([]uint64, len(hs))
	for i, h := range hs {
		low[i] = h.Uint64()
	}
	q := &scheduler.KVQuery{Total: len(low), Matched: map[string]int{}, MinBlocks: t.minBlocks, Tokens: len(toks),
		Queued: t.prefill.queued(eps)}
	byID := make(map[string]*endpoint.Endpoint, len(eps))
	for _, e := range eps {
		byID[e.ReplicaID] = e
		st, ok := t.idx.Status(e.ReplicaID)
		ok = ok && st.UID == e.UID && st.Incarnation == e.Incarnation
		// Untrusted replicas holding nothing of this prompt are untrusted
		// too: "holds nothing" is exactly what cannot be believed.
		if ok && st.Untrusted {
			if q.Untrusted == nil {
				q.Untrusted = map[string]bool{}
			}
			q.Untrusted[e.ReplicaID] = true
		}
		// The cache-pressure rule's inputs: what the cache holds, by the
		// index, and what it can hold, by the engine.
		if ok && e.KVCacheBlocks > 0 {
			if q.Held == nil {
				q.Held, q.Capacity = map[string]int{}, map[string]int{}
			}
			q.Held[e.ReplicaID] = st.Blocks
			q.Capacity[e.ReplicaID] = int(min(e.KVCacheBlocks, math.MaxInt32))
		}
	}
	if t.tiers != nil {
		t.lookupTiers(q, low, prof.Speculation, byID)
		q.BlockSize = bs
		return q, low
	}
	lookup := t.idx.Lookup
	if prof.Speculation {
		lookup = t.idx.LookupPending
	}
	for _, mt := range lookup(low, nil) {
		// Only the incarnation the router routes to: blocks of an engine
		// that restarted are gone with it.
		if e := byID[mt.ID]; e != nil && e.UID == mt.UID && e.Incarnation == mt.Incarnation && !mt.Untrusted {
			q.Matched[mt.ID] = mt.Blocks
			if mt.Pending > 0 {
				if q.Pending == nil {
					q.Pending = map[string]int{}
				}
				q.Pending[mt.ID] = mt.Pending
			}
		}
	}
	q.BlockSize = bs
	if sp := trace.SpanFromContext(ctx); sp.IsRecording() {
		sp.AddEvent("llmgw.kv_lookup", trace.WithAttributes(attribute.Int("llmgw.kv.blocks", len(low)),
			attribute.Int("llmgw.kv.replicas_matched", len(q.Matched))))
	}
	return q, low
}

// lookupTiers fills q's Matched, Pending and Credit from the tiered
// lookup: Matched keeps its meaning (leading blocks on the GPU), Credit
// adds the offload tiers.
func (t *tier2) lookupTiers(q *scheduler.KVQuery, low []uint64, pending bool, byID map[string]*endpoint.Endpoint) {
	q.Credit, q.Reusable = map[string]float64{}, map[string]int{}
	for _, mt := range t.tiers.LookupTiers(low, t.weights, pending, nil) {
		e := byID[mt.ID]
		if e == nil || e.UID != mt.UID || e.Incarnation != mt.Incarnation || mt.Untrusted {
			continue
		}
		q.Credit[mt.ID], q.Reusable[mt.ID] = mt.Credit, mt.Blocks
		if mt.GPU > 0 {
			q.Matched[mt.ID] = mt.GPU
		}
		if mt.Pending > 0 {
			if q.Pending == nil {
				q.Pending = map[string]int{}
			}
			q.Pending[mt.ID] = mt.Pending
		}
	}
}

// maxPrefillAge bounds how long a send counts as queued prefill without a
// first byte or an end: past it the attempt is taken as lost (a request
// whose end the director is not told of, such as the last of its attempts
// failing), so a leak costs a minute of a slightly pessimistic cost.
const maxPrefillAge = time.Minute

// prefillLedger is this router's record of the prefill it has sent each
// replica and not yet seen a first byte for — the cost score's queue, the
// one load figure that is exact the moment a request is sent (NVIDIA
// Dynamo keeps the same record). A request's part is added when an attempt
// is sent and removed at the answer's first byte (for a stream, the first
// token; for a non-streamed answer, its end), at the next attempt, or at
// Done. Safe for concurrent use.
type prefillLedger struct {
	now func() time.Time
	mu  sync.Mutex
	seq uint64
	// by replica id: each open send's tokens and start.
	sends map[string]map[uint64]prefillSend
}

type prefillSend struct {
	tokens int
	at     time.Time
}

func newPrefillLedger(now func() time.Time) *prefillLedger {
	return &prefillLedger{now: now, sends: map[string]map[uint64]prefillSend{}}
}

// add records tokens of prefill sent to replica and returns the send's id.
func (l *prefillLedger) add(replica string, tokens int) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	m := l.sends[replica]
	if m == nil {
		m = map[uint64]prefillSend{}
		l.sends[replica] = m
	}
	m[l.seq] = prefillSend{tokens: tokens, at: l.now()}
	return l.seq
}

// done removes a send (again is a no-op).
func (l *prefillLedger) done(replica string, id uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if m := l.sends[replica]; m != nil {
		delete(m, id)
		if len(m) == 0 {
			delete(l.sends, replica)
		}
	}
}

// queued returns the open prefill per replica of eps, in tokens; nil when
// there is none. Sends past maxPrefillAge are dropped on the way.
func (l *prefillLedger) queued(eps []*endpoint.Endpoint) map[string]float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out map[string]float64
	old := l.now().Add(-maxPrefillAge)
	for _, e := range eps {
		m := l.sends[e.ReplicaID]
		n := 0
		for id, s := range m {
			if s.at.Before(old) {
				delete(m, id)
				continue
			}
			n += s.tokens
		}
		if len(m) == 0 {
			delete(l.sends, e.ReplicaID)
		}
		if n > 0 {
			if out == nil {
				out = map[string]float64{}
			}
			out[e.ReplicaID] = float64(n)
		}
	}
	return out
}

// leastLoaded is the replica to tokenize on: tokenizing is cheap, but not
// free, and the busiest engine is the one that can least spare it. Load is
// the scheduler's own measure.
func (t *tier2) leastLoaded(eps []*endpoint.Endpoint) *endpoint.Endpoint {
	best, bestLoad := eps[0], math.Inf(1)
	for _, e := range eps {
		l := t.loads.LoadOf(e)
		load := scheduler.ReplicaLoad(l.Waiting, l.Running, l.Inflight)
		if l.Saturated {
			load += 1e6 // a stale reading: only if all are
		}
		if load < bestLoad {
			best, bestLoad = e, load
		}
	}
	return best
}

// kvMetrics compare what the index predicted with what the engine then
// reported cached: the one measure of whether tier 2 is exact in practice.
type kvMetrics struct {
	predicted, reported prometheus.Counter
	diff                prometheus.Histogram
}

func newKVMetrics(reg prometheus.Registerer) *kvMetrics {
	m := &kvMetrics{
		predicted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgw_router_kv_predicted_blocks_total",
			Help: "Leading blocks the KV index said the chosen replica held, for responses that reported cached_tokens.",
		}),
		reported: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgw_router_kv_reported_blocks_total",
			Help: "Cached blocks the engine reported (usage.prompt_tokens_details.cached_tokens / block size) for the same responses.",
		}),
		diff: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "llmgw_router_kv_prediction_error_blocks",
			Help:    "Reported minus predicted cached blocks per response (negative: the index over-promised).",
			Buckets: []float64{-64, -16, -4, -1, 0, 1, 4, 16, 64},
		}),
	}
	if reg != nil {
		reg.MustRegister(m.predicted, m.reported, m.diff)
	}
	return m
}

// observe records one response's usage against the prediction for the
// replica it went to. tail is the end of the response body: the whole
// JSON of a non-streamed answer, or the last SSE events of a stream.
func (t *tier2) observe(q *scheduler.KVQuery, replica string, api openai.API, stream bool, tail []byte) {
	if t == nil || q == nil || q.Fallback != "" || q.BlockSize <= 0 || q.Untrusted[replica] {
		return
	}
	cached, ok := openai.CachedTokensFor(api, stream, tail)
	if !ok {
		return
	}
	// vLLM counts the tokens its connector loads back as cached too.
	pred := min(q.Matched[replica], q.Total)
	if q.Reusable != nil {
		pred = min(q.Reusable[replica], q.Total)
	}
	rep := cached / q.BlockSize
	t.m.predicted.Add(float64(pred))
	t.m.reported.Add(float64(rep))
	t.m.diff.Observe(float64(rep - pred))
}

// tailBuffer keeps the last max bytes written to it; first, when set,
// runs at the first write (the answer's first byte).
type tailBuffer struct {
	b     []byte
	max   int
	first func()
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	if f := t.first; f != nil && len(p) > 0 {
		t.first = nil
		f()
	}
	n := len(p)
	if len(p) >= t.max {
		t.b = append(t.b[:0], p[len(p)-t.max:]...)
		return n, nil
	}
	if over := len(t.b) + len(p) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	t.b = append(t.b, p...)
	return n, nil
}
