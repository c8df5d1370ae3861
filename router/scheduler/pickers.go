package scheduler

import (
	"math"
	"sync/atomic"
)

// tieEpsilon is how close two scores must be to count as equal: scores are
// weighted means of floats, and 0.1+0.2 must tie with 0.3.
const tieEpsilon = 1e-9

// MaxScore picks the highest score; ties are drawn at random, so a burst
// over equal replicas spreads instead of landing on the first.
func MaxScore(rnd Rand) Picker { return maxScore{rnd} }

type maxScore struct{ rnd Rand }

func (maxScore) Name() string { return "max-score" }

func (m maxScore) Pick(_ *Request, _ []Candidate, scores []float64) int {
	best, ties := 0, 1
	for i := 1; i < len(scores); i++ {
		switch d := scores[i] - scores[best]; {
		case d > tieEpsilon:
			best, ties = i, 1
		case d >= -tieEpsilon:
			// Reservoir sampling: each of the tied is kept with probability 1/ties.
			ties++
			if m.rnd.IntN(ties) == 0 {
				best = i
			}
		}
	}
	return best
}

// P2C draws two candidates and keeps the better (the power of two choices):
// it avoids the herd that every router choosing the same "best" from the
// same stale gauges would make.
//
// The draws are weighted by exp(score / 0.1) rather than uniform. Uniform
// draws would leave a session's replica out of the pair in (n−2)/n of
// requests — with 8 replicas, affinity would be a 25% coin. Weighted, a clear
// favourite (a session's replica scores some 0.35 above its peers) is nearly
// always in the pair, while replicas within a few hundredths of each other
// are drawn almost alike, which is what spreads them.
func P2C(rnd Rand) Picker { return p2c{rnd} }

type p2c struct{ rnd Rand }

func (p2c) Name() string { return "p2c" }

// p2cTau is the draws' temperature.
const p2cTau = 0.1

func (p p2c) Pick(_ *Request, _ []Candidate, scores []float64) int {
	if len(scores) == 1 {
		return 0
	}
	top := math.Inf(-1)
	for _, v := range scores {
		top = max(top, v)
	}
	w := func(v float64) float64 { return math.Exp((v - top) / p2cTau) }
	sum := 0.0
	for _, v := range scores {
		sum += w(v)
	}
	a := p.draw(scores, w, sum, -1)
	b := p.draw(scores, w, sum-w(scores[a]), a)
	switch d := scores[a] - scores[b]; {
	case d > tieEpsilon:
		return a
	case d < -tieEpsilon:
		return b
	}
	if p.rnd.IntN(2) == 0 {
		return a
	}
	return b
}

func (p p2c) draw(scores []float64, w func(float64) float64, sum float64, skip int) int {
	x := p.rnd.Float64() * sum
	last := -1
	for i, v := range scores {
		if i == skip {
			continue
		}
		last = i
		if x -= w(v); x < 0 {
			return i
		}
	}
	return last // rounding
}

// Softmax draws with probability ∝ exp(score / τ): a small τ is nearly
// MaxScore, a large one nearly uniform. Useful where being second best is
// cheap and herding is not (long prompts, where KV pressure moves slowly).
func Softmax(tau float64, rnd Rand) Picker { return softmax{tau, rnd} }

type softmax struct {
	tau float64
	rnd Rand
}

func (softmax) Name() string { return "softmax" }

func (s softmax) Pick(_ *Request, _ []Candidate, scores []float64) int {
	top := math.Inf(-1)
	for _, v := range scores {
		top = max(top, v)
	}
	sum := 0.0
	for _, v := range scores {
		sum += math.Exp((v - top) / s.tau) // shifted: no overflow, same distribution
	}
	x := s.rnd.Float64() * sum
	for i, v := range scores {
		if x -= math.Exp((v - top) / s.tau); x < 0 {
			return i
		}
	}
	return len(scores) - 1
}

// RoundRobin takes the candidates in turn, ignoring scores: the baseline
// every other profile has to beat, and a way to rule the scheduler out when
// troubleshooting. Candidates arrive sorted by replica id, so "in turn" is
// stable while the set is.
func RoundRobin() Picker { return &roundRobin{} }

type roundRobin struct{ next atomic.Uint64 }

func (*roundRobin) Name() string { return "round-robin" }

func (r *roundRobin) Pick(_ *Request, cands []Candidate, _ []float64) int {
	return int((r.next.Add(1) - 1) % uint64(len(cands)))
}
