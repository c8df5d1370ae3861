// Package ratelog decides when a repeated log line may be written again:
// at most once per interval per key (a peer, a caller), so that a peer
// retrying in a loop — a refused server's heartbeats, ten a second — cannot
// flood the log, while the first line about each peer is always written.
// Metrics count every event; the log only has to say that it happens and
// who does it.
//
// It is a leaf under internal/ (design §3): it imports nothing of the
// repository.
package ratelog

import (
	"sync"
	"time"
)

// Limiter is safe for concurrent use.
type Limiter struct {
	every time.Duration
	max   int
	now   func() time.Time

	mu   sync.Mutex
	last map[string]time.Time
}

// New returns a limiter letting one line per key through every interval,
// remembering at most maxKeys keys: a flood of distinct keys (forged
// names) clears the memory rather than grow it, at the cost of letting
// their next lines through. now is the clock (time.Now when nil).
func New(every time.Duration, maxKeys int, now func() time.Time) *Limiter {
	if now == nil {
		now = time.Now
	}
	return &Limiter{every: every, max: max(1, maxKeys), now: now, last: map[string]time.Time{}}
}

// Allow reports whether a line about key may be logged now, and if so
// starts its interval.
func (l *Limiter) Allow(key string) bool {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if t, ok := l.last[key]; ok && now.Sub(t) < l.every {
		return false
	}
	if len(l.last) >= l.max {
		clear(l.last)
	}
	l.last[key] = now
	return true
}
