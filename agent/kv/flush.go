package kv

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// FlushPolicy is when the agent sends the mirrors' net changes up the
// control session (design §7.5 step 2). A router learns what an engine
// cached only when the change arrives, and until then it routes by a stale
// index; so a change goes soon after it happens. But every send is an
// ephemeral update the control plane applies and forwards to every router
// (and the leader's placement loop wakes for), so a busy engine must not
// cause one per event: sends are spaced, and what happens in between goes
// as its net effect.
type FlushPolicy struct {
	// Delay is how long the first change of a batch waits for more: an
	// engine step's events arrive as one batch, but the next steps of a
	// burst (a prompt's prefill, then its first decode blocks) come a few
	// milliseconds apart.
	Delay time.Duration
	// MinInterval is the least time between two sends: the bound on the
	// send rate of a busy node. The latency of a change is at most
	// max(Delay, MinInterval) after it.
	MinInterval time.Duration
}

// DefaultFlushPolicy is a delay of 5 ms and sends 50 ms apart: a quiet
// engine's change goes 5 ms after it; a busy node sends at most 20 times a
// second (the fixed tick it replaces sent 4 times a second, and made every
// change wait up to 250 ms).
func DefaultFlushPolicy() FlushPolicy {
	return FlushPolicy{Delay: 5 * time.Millisecond, MinInterval: 50 * time.Millisecond}
}

// Validate reports the first bad field by its name.
func (p FlushPolicy) Validate() error {
	switch {
	case p.Delay < 0:
		return fmt.Errorf("kv flush: delay %v: must not be negative", p.Delay)
	case p.MinInterval <= 0:
		return fmt.Errorf("kv flush: min_interval %v: must be positive", p.MinInterval)
	case p.MinInterval > time.Minute:
		return fmt.Errorf("kv flush: min_interval %v: must be at most 1m", p.MinInterval)
	}
	return nil
}

// due is when a batch whose first change came at first should go, given
// the last send (zero: none yet).
func (p FlushPolicy) due(first, last time.Time) time.Time {
	at := first.Add(p.Delay)
	if !last.IsZero() {
		if next := last.Add(p.MinInterval); next.After(at) {
			at = next
		}
	}
	return at
}

// pacer applies a FlushPolicy to the hub's changes. The hub marks a change
// (changed) whenever a mirror may have something new to report, and a send
// (sent) whenever it reports; the session waits on notify and then for
// FlushIn.
type pacer struct {
	policy FlushPolicy
	now    func() time.Time
	notify chan struct{}

	mu    sync.Mutex
	first time.Time // the first change not yet sent; zero: none
	last  time.Time // the last send that carried anything
}

func newPacer(p FlushPolicy, now func() time.Time) (*pacer, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if now == nil {
		return nil, errors.New("kv flush: nil clock")
	}
	return &pacer{policy: p, now: now, notify: make(chan struct{}, 1)}, nil
}

// changed records a change; the first of a batch wakes the session.
func (p *pacer) changed() {
	p.mu.Lock()
	first := p.first.IsZero()
	if first {
		p.first = p.now()
	}
	p.mu.Unlock()
	if first {
		select {
		case p.notify <- struct{}{}:
		default: // already woken
		}
	}
}

// flushIn is how long until the pending batch is due (0: now), and false
// when nothing is pending.
func (p *pacer) flushIn() (time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.first.IsZero() {
		return 0, false
	}
	return max(p.policy.due(p.first, p.last).Sub(p.now()), 0), true
}

// taking starts a report: changes from now on belong to the next batch.
// It returns the time the report is taken at.
func (p *pacer) taking() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.first = time.Time{}
	return p.now()
}

// sent records that a report taken at t carried something: the next send
// is spaced from it.
func (p *pacer) sent(t time.Time) {
	p.mu.Lock()
	if t.After(p.last) {
		p.last = t
	}
	p.mu.Unlock()
}
