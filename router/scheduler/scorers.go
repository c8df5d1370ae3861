package scheduler

import (
	"math"
	"sync"
	"time"

	"github.com/llmgw/llmgw/internal/configfile"
)

// Queue prefers short queues: 1 − min(waiting / t, 1). t is the queue a
// replica may have and still count as healthy; a stale reading scores 0.
func Queue(t float64) Scorer { return queue{t} }

type queue struct{ t float64 }

func (queue) Name() string { return "queue" }

func (q queue) Score(_ *Request, cands []Candidate, out []float64) {
	for i := range cands {
		if !cands[i].Saturated {
			out[i] = 1 - min(cands[i].Waiting/q.t, 1)
		}
	}
}

// KV prefers free KV cache: 1 − min(use / c, 1). Past the ceiling c the
// engine starts preempting, which costs more than any cache hit saves.
func KV(c float64) Scorer { return kv{c} }

type kv struct{ c float64 }

func (kv) Name() string { return "kv" }

func (k kv) Score(_ *Request, cands []Candidate, out []float64) {
	for i := range cands {
		if !cands[i].Saturated {
			out[i] = 1 - min(cands[i].KVUsage/k.c, 1)
		}
	}
}

// Inflight prefers replicas with fewer of this router's requests:
// 1 − min(in-flight / t, 1). It is the one load signal that is never stale,
// so it is what makes consecutive picks in a burst see each other.
func Inflight(t float64) Scorer { return inflight{t} }

type inflight struct{ t float64 }

func (inflight) Name() string { return "inflight" }

func (f inflight) Score(_ *Request, cands []Candidate, out []float64) {
	for i := range cands {
		out[i] = 1 - min(float64(cands[i].Inflight)/f.t, 1)
	}
}

// Weight follows desired state's replica weights: weight / largest weight.
func Weight() Scorer { return weight{} }

type weight struct{}

func (weight) Name() string { return "weight" }

func (weight) Score(_ *Request, cands []Candidate, out []float64) {
	top := 0.0
	for i := range cands {
		top = max(top, cands[i].weight())
	}
	for i := range cands {
		out[i] = cands[i].weight() / top
	}
}

func (c *Candidate) weight() float64 {
	if c.Weight > 0 && !math.IsInf(c.Weight, 0) {
		return c.Weight
	}
	return 1
}

// Imbalance is the guard of design §7.3: load counts as lopsided when the
// busiest candidate's load exceeds Ratio × the mean and is at least MinGap
// above the idlest. Both conditions, because a ratio alone fires on 2 vs 0.
type Imbalance struct {
	Ratio  float64 `yaml:"scheduler_imbalance_ratio"`
	MinGap float64 `yaml:"scheduler_imbalance_min_gap"`
}

// DefaultImbalance is the design's 1.5 × mean and a gap of 4.
func DefaultImbalance() Imbalance { return Imbalance{Ratio: 1.5, MinGap: 4} }

// Validate reports every bad field, each named by its configuration key.
func (b Imbalance) Validate() error {
	return validateGuard("scheduler_imbalance_ratio", "scheduler_imbalance_min_gap", b.Ratio, b.MinGap)
}

// validateGuard checks a guard's ratio and gap, naming them by their keys.
func validateGuard(ratioKey, gapKey string, ratio, gap float64) error {
	var p configfile.Problems
	if !(ratio >= 1) || math.IsInf(ratio, 0) {
		p.Add(ratioKey, "must be a finite number >= 1, got %v", ratio)
	}
	if !(gap >= 0) || math.IsInf(gap, 0) {
		p.Add(gapKey, "must be a finite number >= 0, got %v", gap)
	}
	return p.Err()
}

// KVImbalance is tier 2's guard (the KVAffinity filter): looser than
// Imbalance by default, because what it weighs is different. Tier 1's
// guard weighs a guess — the tree's memory of a send — against load; tier
// 2's weighs an exact hit, and moving a request off the replica holding its
// prefix costs the whole prefill there plus a copy that evicts some other
// prefix. So a holder counts as hot only past twice the mean load and 8
// requests above the idlest (docs/benchmarks.md "KV affinity" measures
// both guards).
type KVImbalance struct {
	Ratio  float64 `yaml:"scheduler_kv_imbalance_ratio"`
	MinGap float64 `yaml:"scheduler_kv_imbalance_min_gap"`
}

// DefaultKVImbalance is twice the mean and a gap of 8.
func DefaultKVImbalance() KVImbalance { return KVImbalance{Ratio: 2, MinGap: 8} }

// Validate reports every bad field, each named by its configuration key.
func (b KVImbalance) Validate() error {
	return validateGuard("scheduler_kv_imbalance_ratio", "scheduler_kv_imbalance_min_gap", b.Ratio, b.MinGap)
}

func (b KVImbalance) imbalance() Imbalance { return Imbalance(b) }

// Imbalanced reports whether load over cands is lopsided: some candidate
// is Hot.
func (b Imbalance) Imbalanced(cands []Candidate) bool { return b.Hot(cands) != nil }

// Hot marks the candidates that make load lopsided: each whose load
// exceeds Ratio × the mean and is at least MinGap above the idlest — the
// guard's two conditions, per candidate; nil when none is.
func (b Imbalance) Hot(cands []Candidate) []bool {
	if len(cands) < 2 {
		return nil
	}
	lo, sum := math.Inf(1), 0.0
	for i := range cands {
		l := cands[i].Load()
		lo, sum = min(lo, l), sum+l
	}
	mean := sum / float64(len(cands))
	var hot []bool
	for i := range cands {
		if l := cands[i].Load(); l > b.Ratio*mean && l-lo >= b.MinGap {
			if hot == nil {
				hot = make([]bool, len(cands))
			}
			hot[i] = true
		}
	}
	return hot
}

// Load spreads requests by what this router sent recently:
// 1 − sent to the replica in the last w seconds / the most sent to any
// candidate. It balances when engine gauges lag — a batch burst lands
// faster than any scrape.
func (s *Scheduler) Load(w float64) Scorer {
	return &loadScorer{s: s, w: time.Duration(w * float64(time.Second))}
}

type loadScorer struct {
	s *Scheduler
	w time.Duration
}

func (*loadScorer) Name() string { return "load" }

func (l *loadScorer) Score(_ *Request, cands []Candidate, out []float64) {
	top := 0
	for i := range cands {
		n := l.s.sends.count(cands[i].Key, l.w)
		out[i] = float64(n)
		top = max(top, n)
	}
	for i := range out {
		if top == 0 {
			out[i] = 1
		} else {
			out[i] = 1 - out[i]/float64(top)
		}
	}
}

func (l *loadScorer) Observe(_ *Request, chosen *Candidate) { l.s.sends.add(chosen.Key) }

// sendLog counts sends per replica in one-second buckets over the last
// minute: enough for any Load window up to 60 s.
type sendLog struct {
	now func() time.Time
	mu  sync.Mutex
	m   map[Key]*[sendBuckets]bucket
}

const sendBuckets = 60

type bucket struct {
	sec int64
	n   int
}

func newSendLog(now func() time.Time) *sendLog {
	return &sendLog{now: now, m: make(map[Key]*[sendBuckets]bucket)}
}

func (l *sendLog) add(k Key) {
	sec := l.now().Unix()
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.m[k]
	if b == nil {
		b = new([sendBuckets]bucket)
		l.m[k] = b
	}
	slot := &b[sec%sendBuckets]
	if slot.sec != sec {
		*slot = bucket{sec: sec}
	}
	slot.n++
}

func (l *sendLog) count(k Key, w time.Duration) int {
	sec := l.now().Unix()
	from := sec - int64(min(max(w/time.Second, 1), sendBuckets)) + 1
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.m[k]
	if b == nil {
		return 0
	}
	n := 0
	for _, s := range b {
		if s.sec >= from && s.sec <= sec {
			n += s.n
		}
	}
	return n
}

func (l *sendLog) Retain(keep func(Key) bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k := range l.m {
		if !keep(k) {
			delete(l.m, k)
		}
	}
}
