// Package scheduler chooses the replica a request goes to. It imports
// nothing networked, so it can be tested and benchmarked alone (plan §3).
//
// For now it holds one picker, least loaded; the scheduling framework of
// plan §7.3 (filters, weighted scorers, pickers, profiles) replaces it behind
// the same seam: the proxy asks for an index into the candidates it passed.
package scheduler

import "math/rand/v2"

// Candidate is one replica as the scheduler sees it.
type Candidate struct {
	Waiting  float64
	Running  float64
	Inflight int64
	// Saturated marks a replica with no fresh load reading: it is chosen
	// only when every candidate is saturated (plan §7.2).
	Saturated bool
}

// load is waiting + running + the router's own in-flight requests. The
// engine's running count includes this router's requests once they start,
// so the sum over-counts briefly; that only makes a busy replica look busier.
func (c Candidate) load() float64 { return c.Waiting + c.Running + float64(c.Inflight) }

// LeastLoaded picks the candidate with the least load, preferring fresh
// readings over saturated ones; ties are drawn at random so a burst does not
// land on one replica (plan §7.3).
type LeastLoaded struct {
	// IntN returns a uniform int in [0, n); nil uses math/rand/v2. It must
	// be safe for concurrent use if the picker is.
	IntN func(n int) int
}

// Pick returns the index of the chosen candidate, or -1 when there is none.
// Safe for concurrent use when IntN is.
func (p LeastLoaded) Pick(cands []Candidate) int {
	if len(cands) == 0 {
		return -1
	}
	// Saturated candidates compete only among themselves, by in-flight count:
	// their engine gauges are too old to mean anything.
	score := func(c Candidate) float64 {
		if c.Saturated {
			return float64(c.Inflight)
		}
		return c.load()
	}
	anyFresh := false
	for _, c := range cands {
		if !c.Saturated {
			anyFresh = true
			break
		}
	}
	var best []int
	var bestScore float64
	for i, c := range cands {
		if anyFresh && c.Saturated {
			continue
		}
		s := score(c)
		switch {
		case len(best) == 0 || s < bestScore:
			best, bestScore = append(best[:0], i), s
		case s == bestScore:
			best = append(best, i)
		}
	}
	if len(best) == 1 {
		return best[0]
	}
	intN := p.IntN
	if intN == nil {
		intN = rand.IntN
	}
	return best[intN(len(best))]
}
