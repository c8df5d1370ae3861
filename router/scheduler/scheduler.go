// Package scheduler chooses the replica a request goes to (design §7.3): the
// candidates pass filters, then weighted scorers, then a picker, and
// observers are told where the request went. It imports nothing networked,
// so it can be tested and benchmarked alone (design §3).
//
// One Scheduler serves a router: it holds the memory shared by every model
// (sessions, the approximate prefix tree, recent sends) and builds each
// model's Profile from its desired state.
package scheduler

import (
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/internal/configfile"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/prefix"
)

// Key identifies a replica incarnation: everything kept per replica is keyed
// by it (design §4 "Identity"), and ID and UID are what every router sees
// alike, so rendezvous hashing over them agrees across routers.
type Key struct {
	ID          string
	UID         uint64
	Incarnation uint64
}

// BreakerView is a candidate's circuit breaker as the BreakerOpen filter
// sees it.
type BreakerView uint8

const (
	// BreakerClosed: healthy.
	BreakerClosed BreakerView = iota
	// BreakerCoolingDown: open, cooling down or with its one probe out.
	BreakerCoolingDown
	// BreakerProbeDue: open, and its cooldown has passed.
	BreakerProbeDue
)

// Candidate is one replica as the scheduler sees it: a snapshot taken for
// one decision.
type Candidate struct {
	Key Key
	// Waiting and Running are the engine's queue and batch; KVUsage its KV
	// cache use in 0..1.
	Waiting, Running, KVUsage float64
	// Inflight is this router's own requests on the replica. It is counted
	// the moment a request is sent, so consecutive picks see each other
	// before any scrape does — which is what spreads a burst.
	Inflight int64
	// Weight is the replica's share of traffic relative to its peers
	// (desired state, default 1; zero or less counts as 1).
	Weight float64
	// Saturated marks a replica without a fresh load reading (design §7.2).
	Saturated bool
	// Breaker is the replica's circuit breaker state.
	Breaker BreakerView
	// HasAdapter reports whether the replica holds the request's adapter;
	// ignored for requests without one.
	HasAdapter bool

	pos int // index in the caller's slice
}

// ReplicaLoad is a replica's load as the design's formulas use it (design
// §7.3): waiting plus what it is serving. The engine's running count
// includes this router's requests once the scrape catches up, and the
// router's own count leads it, so the larger of the two stands for
// "serving" without counting twice. It is the one definition: the
// scheduler's scorers and guard and the router's choice of a replica to
// tokenize on all rank replicas by it.
func ReplicaLoad(waiting, running float64, inflight int64) float64 {
	return waiting + max(running, float64(inflight))
}

// Load is the candidate's ReplicaLoad.
func (c *Candidate) Load() float64 { return ReplicaLoad(c.Waiting, c.Running, c.Inflight) }

// KVQuery is the precise index's answer for one request (design §7.5 tier 2),
// worked out before scheduling because it needs a round trip (tokenizing)
// that a scorer must not make. Tier 2 fills it; until then it stays nil and
// the Prefix scorer uses the tree.
type KVQuery struct {
	// Fallback, when set, is why the index could not answer (one of the
	// KV* reasons); tier 1 decides.
	Fallback string
	// Matched is how many of the prompt's leading blocks each replica (by
	// ID) holds on its GPU, out of Total; a replica absent holds none.
	Matched map[string]int
	Total   int
	// Credit is each replica's credited blocks over every tier of its
	// cache (design §7.5 "Offload tiers"): the leading blocks it holds in
	// any tier, each weighed by its best tier's credit (GPU 1, CPU and
	// storage less). nil when the index gave no tiers: Matched is then the
	// credit. The prefix scorer and the KV affinity filter rank by it
	// (Credited); the cache-pressure rule keeps to Matched, since what it
	// weighs is GPU space.
	Credit map[string]float64
	// Reusable is how many leading blocks each replica holds in any tier:
	// what its engine reuses, loading the offloaded ones back, and so what
	// it reports as cached. nil when the index gave no tiers (Matched).
	Reusable map[string]int
	// Untrusted replicas' KV state is unknown: tier 1 scores them.
	Untrusted map[string]bool
	// MinBlocks is the fewest leading blocks worth preferring a replica
	// for; below one means one.
	MinBlocks int
	// BlockSize is the tokens per block the prompt was hashed with.
	BlockSize int
	// Pending is how many of each replica's Matched blocks were this
	// router's speculative entries (sent, not yet confirmed by events).
	Pending map[string]int
	// Tokens is the prompt's length in tokens (the cost score's prefill).
	Tokens int
	// Queued is the prefill, in tokens, this router has sent each replica
	// and not yet seen a first byte for (the cost score's queue).
	Queued map[string]float64
	// Held is how many blocks each replica's cache holds by the index (its
	// confirmed entries), and Capacity how many it can hold (the engine's
	// num_gpu_blocks, as its agent reports it); a replica absent from
	// Capacity has not said. The cache-pressure rule reads both
	// (KVPressure).
	Held     map[string]int
	Capacity map[string]int
}

// Credited is replica id's credited blocks (Credit, or Matched without
// tiers), at most Total.
func (q *KVQuery) Credited(id string) float64 {
	if q.Credit != nil {
		return min(q.Credit[id], float64(q.Total))
	}
	return float64(min(q.Matched[id], q.Total))
}

// creditReaches reports whether credited blocks c reach n whole blocks,
// float sums' rounding aside.
func creditReaches(c float64, n int) bool { return c+1e-9 >= float64(n) }

// Request is what the scheduler knows of a request.
type Request struct {
	ID      string
	Model   string
	Session string
	// Adapter is the LoRA adapter the request names, or "".
	Adapter string
	// Prefix is prefix.Hashes of the prompt's leading text; empty when the
	// request has none.
	Prefix []uint64
	// KV is tier 2's answer, or nil.
	KV *KVQuery
	// Trace, when set, is told each step of Pick for the request's trace
	// (design §9 "Tracing"); nil when the request is not traced.
	Trace Tracer
}

// Filter drops candidates. Filter appends the kept ones from in to out
// and returns it; it must not modify in. Called concurrently.
type Filter interface {
	Name() string
	Filter(r *Request, in, out []Candidate) []Candidate
}

// Scorer rates candidates. Score writes one score per candidate into out
// (same length, zeroed); scores belong in [0, 1] — the scheduler clamps and
// counts any that stray. Called concurrently.
type Scorer interface {
	Name() string
	Score(r *Request, cands []Candidate, out []float64)
}

// Picker chooses one candidate from their combined scores (each in
// [0, 1]); it returns an index into cands, which is never empty. Called
// concurrently.
type Picker interface {
	Name() string
	Pick(r *Request, cands []Candidate, scores []float64) int
}

// Observer is told where a request was actually sent (never what a scorer
// proposed: design §7.5). Scorers with memory implement it.
type Observer interface {
	Observe(r *Request, chosen *Candidate)
}

// Retainer holds per-replica memory and drops what keep rejects: replicas
// that are gone (Forget, design §7.5).
type Retainer interface {
	Retain(keep func(Key) bool)
}

// WeightedScorer is a scorer and its weight in a profile.
type WeightedScorer struct {
	Scorer Scorer
	Weight float64
}

// Profile is one model's scheduling pipeline.
type Profile struct {
	Name    string
	Filters []Filter
	Scorers []WeightedScorer
	Picker  Picker
	// KVScore and Speculation are the profile's tier-2 settings (Params):
	// the Prefix scorer applies the first, whoever prepares the KVQuery
	// the second.
	KVScore     string
	Speculation bool
}

// Rand is the randomness the framework draws from. *rand.Rand satisfies
// it but is not safe for concurrent use; Config.Rand must be.
type Rand interface {
	IntN(n int) int
	Float64() float64
}

// lockedRand makes a *rand.Rand safe for concurrent use.
type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func (l *lockedRand) IntN(n int) int   { l.mu.Lock(); defer l.mu.Unlock(); return l.r.IntN(n) }
func (l *lockedRand) Float64() float64 { l.mu.Lock(); defer l.mu.Unlock(); return l.r.Float64() }

// NewRand returns a concurrency-safe Rand from a seed: tests pass a fixed
// one so every draw is reproducible.
func NewRand(seed uint64) Rand {
	return &lockedRand{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// Config configures a Scheduler. Start from DefaultConfig. In the router's
// configuration file its keys sit at the top level, as scheduler_*; there
// are no flags for them.
type Config struct {
	// Sessions bounds the remembered session → replica pairs (LRU).
	Sessions int `yaml:"scheduler_sessions"`
	// TreeEntries bounds the approximate prefix tree (LRU).
	TreeEntries int `yaml:"scheduler_tree_entries"`
	// Imbalance is the guard that silences prefix affinity when load is
	// lopsided.
	Imbalance Imbalance `yaml:",inline"`
	// KVImbalance is the guard of tier 2's KV affinity: past it a replica
	// holding a request's prefix is passed over for load.
	KVImbalance KVImbalance `yaml:",inline"`
	// KVPressure is tier 2's cache-pressure rule: where the longest match's
	// cache is full, or over-planned with sessions, a request goes where it
	// evicts less.
	KVPressure KVPressure `yaml:",inline"`
	// Rand is the randomness of pickers and ties; nil draws from a seed
	// taken at New. Must be safe for concurrent use.
	Rand Rand `yaml:"-"`
	// Now is the clock of the Load scorer and of the latency metric.
	Now func() time.Time `yaml:"-"`
}

// DefaultConfig remembers 64k sessions and 256k prefix chunks (some
// 30 MiB together) with the design's imbalance guards.
func DefaultConfig() Config {
	return Config{Sessions: 1 << 16, TreeEntries: 1 << 18, Imbalance: DefaultImbalance(), KVImbalance: DefaultKVImbalance(),
		KVPressure: DefaultKVPressure()}
}

// Validate reports every bad field, each named by its configuration key.
func (c Config) Validate() error {
	var p configfile.Problems
	if c.Sessions < 1 {
		p.Add("scheduler_sessions", "must be at least 1, got %d", c.Sessions)
	}
	if c.TreeEntries < 1 {
		p.Add("scheduler_tree_entries", "must be at least 1, got %d", c.TreeEntries)
	}
	p.Join(c.Imbalance.Validate())
	p.Join(c.KVImbalance.Validate())
	p.Join(c.KVPressure.Validate())
	return p.Err()
}

// Scheduler is a router's scheduler. Safe for concurrent use.
type Scheduler struct {
	cfg Config
	log *slog.Logger
	m   *metrics

	sessions *prefix.Tree[Key]
	tree     *prefix.Tree[Key]
	sends    *sendLog
	homes    *homes
	// footprints: where this router's live sessions are, and the room
	// planned for each (KVPressure).
	footprints *footprints

	mu       sync.Mutex
	profiles map[*llmgwv1.Model]*Profile

	scratch sync.Pool
}

// New builds a scheduler; reg receives its metrics (nil for none).
func New(cfg Config, log *slog.Logger, reg prometheus.Registerer) (*Scheduler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Rand == nil {
		cfg.Rand = NewRand(rand.Uint64())
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Scheduler{
		cfg: cfg, log: log, m: newMetrics(reg),
		sessions:   prefix.NewTree[Key](cfg.Sessions),
		tree:       prefix.NewTree[Key](cfg.TreeEntries),
		sends:      newSendLog(cfg.Now),
		homes:      newHomes(cfg.Now),
		footprints: newFootprints(cfg.Now),
		profiles:   make(map[*llmgwv1.Model]*Profile),
	}
	s.scratch.New = func() any { return new(scratch) }
	return s, nil
}

type scratch struct {
	a, b          []Candidate
	scores, total []float64
}

// Pick runs p over cands and returns the chosen index into cands, or -1
// when the filters left nothing (no replica can take the request now).
// cands is not modified.
func (s *Scheduler) Pick(p *Profile, r *Request, cands []Candidate) int {
	start := s.cfg.Now()
	defer func() { s.m.latency.Observe(s.cfg.Now().Sub(start).Seconds()) }()
	if len(cands) == 0 {
		return -1
	}
	sc := s.scratch.Get().(*scratch)
	defer s.scratch.Put(sc)

	cur := append(sc.a[:0], cands...)
	for i := range cur {
		cur[i].pos = i
	}
	next := sc.b[:0]
	for _, f := range p.Filters {
		next = f.Filter(r, cur, next[:0])
		cur, next = next, cur
		if r.Trace != nil {
			r.Trace.Filtered(f.Name(), len(cur))
		}
		if len(cur) == 0 {
			sc.a, sc.b = cur, next
			return -1
		}
	}
	sc.a, sc.b = cur, next

	total := grow(sc.total, len(cur))
	sc.total = total
	var sumW float64
	for _, ws := range p.Scorers {
		if ws.Weight <= 0 {
			continue
		}
		out := grow(sc.scores, len(cur))
		sc.scores = out
		ws.Scorer.Score(r, cur, out)
		if r.Trace != nil {
			r.Trace.Scored(ws.Scorer.Name(), ws.Weight, out)
		}
		for i, v := range out {
			if !(v >= 0 && v <= 1) { // also catches NaN
				s.m.clamped.WithLabelValues(ws.Scorer.Name()).Inc()
				v = clamp01(v)
			}
			total[i] += ws.Weight * v
		}
		sumW += ws.Weight
	}
	if sumW > 0 {
		for i := range total {
			total[i] /= sumW
		}
	}
	i := p.Picker.Pick(r, cur, total)
	if i < 0 || i >= len(cur) {
		return -1
	}
	if r.Trace != nil {
		r.Trace.Picked(p.Picker.Name(), cur[i].Key, total[i], len(cur))
	}
	return cur[i].pos
}

// Observe tells the profile's observers, and the scheduler's shared memory,
// that r was sent to chosen. Call it once the replica has accepted the
// request — after a failed attempt the retry's replica is the one to record.
func (s *Scheduler) Observe(p *Profile, r *Request, chosen Candidate) {
	for _, ws := range p.Scorers {
		if o, ok := ws.Scorer.(Observer); ok {
			o.Observe(r, &chosen)
		}
	}
	if o, ok := p.Picker.(Observer); ok {
		o.Observe(r, &chosen)
	}
	if r.Session != "" && r.KV != nil && r.KV.Fallback == "" && r.KV.Total > 0 && s.cfg.KVPressure.SessionReserveTokens > 0 {
		s.footprints.set(sessionHash(r.Session), chosen.Key, s.cfg.KVPressure.plannedBlocks(r.KV), r.KV.Total)
	}
}

// Retain forgets every replica keep rejects: call it when the routing
// table changes, so the tree, sessions and send counts of a replica that is
// gone stop steering requests (design §7.5 "Forget").
func (s *Scheduler) Retain(keep func(Key) bool) {
	s.tree.RetainReplicas(keep)
	s.sessions.RetainReplicas(keep)
	s.sends.Retain(keep)
	s.homes.retain(keep)
	s.footprints.retain(keep)
}

func grow(b []float64, n int) []float64 {
	if cap(b) < n {
		return make([]float64, n)
	}
	b = b[:n]
	clear(b)
	return b
}

func clamp01(v float64) float64 {
	switch {
	case math.IsNaN(v) || v < 0:
		return 0
	case v > 1:
		return 1
	}
	return v
}
