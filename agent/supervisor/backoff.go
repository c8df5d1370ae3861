package supervisor

import "time"

// Backoff spaces the restarts of a crashing engine: a crash loop must not
// burn a node's CPU (or a GPU's memory) reloading weights, yet an engine that
// crashed once after running well for a long time deserves a quick restart.
//
// It is not internal/backoff: restarts are spaced exactly (no jitter — one
// node's engines do not stampede anything), and the reset is judged by how
// long the engine ran, not by a call after a success. The yaml tags are the
// agent's --config keys under restart_backoff.
type Backoff struct {
	// Initial is the first delay; each crash in a row doubles it up to Max.
	Initial time.Duration `yaml:"initial"`
	Max     time.Duration `yaml:"max"`
	// StableAfter is how long an engine must have run for its next crash to
	// count as the first in a row again.
	StableAfter time.Duration `yaml:"stable_after"`
}

// DefaultBackoff is 500 ms doubling to 30 s, reset after a stable minute.
func DefaultBackoff() Backoff {
	return Backoff{Initial: 500 * time.Millisecond, Max: 30 * time.Second, StableAfter: time.Minute}
}

// Next is the delay before the next start, given the previous delay (0 for
// none) and how long the engine ran this time.
func (b Backoff) Next(prev, ran time.Duration) time.Duration {
	if prev <= 0 || ran >= b.StableAfter {
		return b.Initial
	}
	next := prev * 2
	if next > b.Max || next <= 0 {
		return b.Max
	}
	return next
}
