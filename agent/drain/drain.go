// Package drain decides when a draining replica's engine may stop (design §4
// "Changes roll", §5.5). The control plane marks a replica draining so that
// routers stop choosing it, and removes it once its agent reports the engine
// STOPPED; the agent stops the engine as soon as nothing runs or waits in
// it, judged from the load readings it already takes every 50 ms, rather
// than leave every scale-down, node drain and roll waiting out the control
// plane's drain timeout.
//
// Idle is judged over a quiet period, not one reading: routers learn of the
// drain through their own watch, a little after the agent, and a request
// already sent may not be counted by the engine yet.
package drain

import (
	"context"
	"errors"
	"fmt"
	"time"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Loads is the node's latest load readings; *load.Reader implements it.
type Loads interface {
	// Latest returns the newest snapshot (shared: not modified by the
	// caller) and a channel closed once a newer one is published. A new
	// snapshot must come at least once per reading interval, whether or
	// not anything changed: Wait judges its timeout on each.
	Latest() (*llmgwv1.LoadSnapshot, <-chan struct{})
}

// Config sets the quiet period and the bound on a drain.
type Config struct {
	// Quiet is how long every reading of the engine must show no request
	// running or waiting before it is stopped.
	Quiet time.Duration
	// Timeout stops the engine however busy it is, so a replica whose
	// clients never let go still leaves. The control plane has its own,
	// usually shorter, drain timeout after which it removes the replica
	// anyway; this one matters when the control plane is out of reach.
	Timeout time.Duration
	// Now is the clock the timeout is judged by; nil means time.Now.
	// Quiet is judged by the readings' own scrape times.
	Now func() time.Time
}

// DefaultConfig is a 1 s quiet period and a 5 minute bound.
func DefaultConfig() Config { return Config{Quiet: time.Second, Timeout: 5 * time.Minute} }

// Validate names the bad field by its flag.
func (c Config) Validate() error {
	if c.Quiet <= 0 {
		return fmt.Errorf("--drain-quiet: must be positive, got %s", c.Quiet)
	}
	if c.Timeout < c.Quiet {
		return fmt.Errorf("--drain-timeout: %s must be at least --drain-quiet %s", c.Timeout, c.Quiet)
	}
	return nil
}

// Outcome is why a drain's wait ended.
type Outcome int

const (
	// Idle: every reading for the quiet period showed nothing running or
	// waiting.
	Idle Outcome = iota + 1
	// NotServing: the engine is not ready to serve (starting, restarting,
	// failed), so nothing can be in it.
	NotServing
	// TimedOut: the drain timeout passed first.
	TimedOut
)

func (o Outcome) String() string {
	switch o {
	case Idle:
		return "idle"
	case NotServing:
		return "not_serving"
	case TimedOut:
		return "timeout"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Replica is the placement being drained.
type Replica struct {
	ID  string
	UID uint64
	// Serving reports whether the engine may hold requests (its latest
	// status is READY or UNHEALTHY). It is asked only while the readings
	// have nothing for the replica, from Wait's goroutine.
	Serving func() bool
}

// ErrNoLoads is returned by Wait without a source of readings.
var ErrNoLoads = errors.New("drain: no load readings")

// Wait returns once the replica may be stopped, or ctx's error once ctx
// ends. Only readings scraped after Wait was called count, so a reading
// taken before routers were told cannot end the drain.
func Wait(ctx context.Context, cfg Config, loads Loads, rep Replica) (Outcome, error) {
	if loads == nil {
		return 0, ErrNoLoads
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	start := now()
	var (
		idleSince   int64 // scrape time of the first idle reading of the current run; 0 when none
		incarnation uint64
	)
	for {
		snap, next := loads.Latest()
		if now().Sub(start) >= cfg.Timeout {
			return TimedOut, nil
		}
		rl := find(snap, rep)
		switch {
		case rl == nil || rl.GetScrapedUnixNano() == 0:
			// Listed only once ready and read; a replica not listed is
			// not serving, or not read yet.
			idleSince = 0
			if rep.Serving != nil && !rep.Serving() {
				return NotServing, nil
			}
		case rl.GetScrapedUnixNano() < start.UnixNano():
		case rl.GetIncarnation() != incarnation:
			// A restarted engine starts its own quiet period.
			incarnation, idleSince = rl.GetIncarnation(), 0
			if idle(rl) {
				idleSince = rl.GetScrapedUnixNano()
			}
		case !idle(rl):
			idleSince = 0
		case idleSince == 0:
			idleSince = rl.GetScrapedUnixNano()
		}
		if idleSince != 0 && rl != nil && time.Duration(rl.GetScrapedUnixNano()-idleSince) >= cfg.Quiet {
			return Idle, nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-next:
		}
	}
}

func idle(rl *llmgwv1.ReplicaLoad) bool { return rl.GetRunning() == 0 && rl.GetWaiting() == 0 }

func find(s *llmgwv1.LoadSnapshot, rep Replica) *llmgwv1.ReplicaLoad {
	for _, rl := range s.GetReplicas() {
		if rl.GetReplicaId() == rep.ID && rl.GetUid() == rep.UID {
			return rl
		}
	}
	return nil
}
