package scheduler

import (
	"fmt"
	"slices"
	"testing"
)

// stepLog is a Tracer keeping each step as a line.
type stepLog struct{ steps []string }

func (l *stepLog) Filtered(f string, left int) {
	l.steps = append(l.steps, fmt.Sprintf("filter %s %d", f, left))
}
func (l *stepLog) Scored(s string, w float64, scores []float64) {
	l.steps = append(l.steps, fmt.Sprintf("score %s %g %d", s, w, len(scores)))
}
func (l *stepLog) Picked(p string, k Key, score float64, n int) {
	l.steps = append(l.steps, fmt.Sprintf("pick %s %s %d", p, k.ID, n))
}

// TestPickTraces: a traced request is told each filter, scorer and the
// pick, once each; an untraced one costs nothing more (no Tracer).
func TestPickTraces(t *testing.T) {
	s, _, _ := newSched(t, 1)
	shut := c("a", 0, 0, 0)
	shut.Breaker = BreakerCoolingDown
	p := &Profile{Filters: []Filter{BreakerOpen()}, Scorers: []WeightedScorer{{Queue(4), 2}, {Weight(), 0}},
		Picker: MaxScore(NewRand(1))}
	log := &stepLog{}
	if got := s.Pick(p, &Request{Trace: log}, []Candidate{shut, c("b", 0, 0, 0), c("c", 9, 0, 0)}); got != 1 {
		t.Fatalf("Pick = %d, want b", got)
	}
	want := []string{"filter " + BreakerOpen().Name() + " 2", "score " + Queue(4).Name() + " 2 2", "pick " + p.Picker.Name() + " b 2"}
	if !slices.Equal(log.steps, want) {
		t.Fatalf("steps\n got %q\nwant %q", log.steps, want)
	}
	// All filtered out: the filter is told, nothing else.
	log = &stepLog{}
	if got := s.Pick(p, &Request{Trace: log}, []Candidate{shut}); got != -1 {
		t.Fatalf("Pick = %d, want -1", got)
	}
	if !slices.Equal(log.steps, []string{"filter " + BreakerOpen().Name() + " 0"}) {
		t.Fatalf("steps %q", log.steps)
	}
}
