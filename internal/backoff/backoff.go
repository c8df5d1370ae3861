// Package backoff spaces the attempts of a client that lost its server.
//
// Every long-lived client in llmgw (the agent's control session, the router's
// watch stream, its load subscriptions to agents) reconnects the same way: a
// delay that doubles from Initial up to Max, reset once an attempt got
// somewhere, drawn at random from [d/2, d) so that a fleet that lost the same
// server at the same instant does not come back in step and stampede it.
// The shape is "equal jitter": never less than half the nominal delay, so a
// retry loop cannot degenerate into a busy loop, and never more than the
// nominal delay, so Max is a real upper bound an operator can reason about.
//
// The package imports only the standard library (design §3): it is a leaf
// that the control plane, the agent and the router may all import.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is the state of one retry loop. The zero value is not usable; make
// one with New. It is not safe for concurrent use: it belongs to the loop.
type Backoff struct {
	initial, max time.Duration
	jitter       func() float64
	cur          time.Duration // the last nominal delay; 0 before the first
}

// New returns a backoff from initial doubling to max. jitter returns a
// number in [0, 1); nil means math/rand/v2's Float64 (tests inject their own
// to make the delays exact). A max below initial is raised to initial.
func New(initial, max time.Duration, jitter func() float64) *Backoff {
	if jitter == nil {
		jitter = rand.Float64
	}
	if initial <= 0 {
		initial = time.Millisecond
	}
	return &Backoff{initial: initial, max: maxDur(max, initial), jitter: jitter}
}

// Next returns the delay before the next attempt: the nominal delay (Initial
// the first time and after Reset, then doubled, capped at Max) drawn from
// [d/2, d).
func (b *Backoff) Next() time.Duration {
	if b.cur == 0 {
		b.cur = b.initial
	} else {
		b.cur = min(b.cur*2, b.max)
		if b.cur <= 0 { // overflow
			b.cur = b.max
		}
	}
	return Draw(b.cur, b.jitter)
}

// Reset makes the next delay Initial again: call it when an attempt got
// somewhere (a welcome, an event), so a server that comes back is used at
// once and a flapping one is not retried at the slowest pace forever.
func (b *Backoff) Reset() { b.cur = 0 }

// Draw returns d drawn from [d/2, d) with jitter (a number in [0, 1)).
func Draw(d time.Duration, jitter func() float64) time.Duration {
	j := jitter()
	if j < 0 || j >= 1 {
		j = 0
	}
	return d/2 + time.Duration(j*float64(d-d/2))
}

// Sleep waits d or until ctx ends; it reports whether the wait ran to its
// end (false: ctx ended first, stop retrying).
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func maxDur(a, b time.Duration) time.Duration {
	if a > b {
		return a
	}
	return b
}
