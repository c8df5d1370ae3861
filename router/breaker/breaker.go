// Package breaker is the router's per-replica circuit breaker (design §7.4):
// a replica that keeps failing is taken out of rotation for a cooldown, then
// given one probe request; a success puts it back, a failure restarts the
// cooldown. Without it every request would pay a connect timeout to a dead
// engine before being retried elsewhere.
package breaker

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/llmgw/llmgw/internal/configfile"
)

// State is where a breaker stands.
type State int

const (
	// Closed lets every request through: the replica is healthy.
	Closed State = iota
	// Open refuses requests until the cooldown has passed.
	Open
	// HalfOpen has let one probe through and waits for its outcome; no
	// other request passes meanwhile.
	HalfOpen
)

func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half_open"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Config configures breakers. The zero value is not usable; start from
// DefaultConfig. In the router's configuration file its keys sit at the
// top level, as breaker_*; there are no flags for them.
type Config struct {
	// Failures is how many consecutive failures open the breaker.
	Failures int `yaml:"breaker_failures"`
	// Cooldown is how long an open breaker refuses requests before it lets
	// a probe through.
	Cooldown time.Duration `yaml:"breaker_cooldown"`
	// Now is the clock; nil uses time.Now. Tests inject one.
	Now func() time.Time `yaml:"-"`
}

// DefaultConfig opens after 3 consecutive failures and probes after 5 s:
// three is past a single unlucky connection reset, and 5 s is about what an
// engine restart by the agent's supervisor takes to be noticed.
func DefaultConfig() Config { return Config{Failures: 3, Cooldown: 5 * time.Second} }

// Validate reports every bad field, each named by its configuration key.
func (c Config) Validate() error {
	var p configfile.Problems
	if c.Failures < 1 {
		p.Add("breaker_failures", "must be at least 1, got %d", c.Failures)
	}
	if c.Cooldown <= 0 {
		p.Add("breaker_cooldown", "must be positive, got %s", c.Cooldown)
	}
	return p.Err()
}

// ErrOpen is returned by Acquire when the breaker lets nothing through.
var ErrOpen = errors.New("breaker open")

// Breaker guards one replica incarnation. Safe for concurrent use.
type Breaker struct {
	cfg Config
	// onChange, when set, is told every transition (for the state metric).
	// It is called with the breaker's lock held and must not call back.
	onChange func(from, to State)

	mu       sync.Mutex
	state    State
	failures int
	openedAt time.Time
}

// New returns a closed breaker. onChange may be nil.
func New(cfg Config, onChange func(from, to State)) *Breaker {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Breaker{cfg: cfg, onChange: onChange}
}

// View is what a scheduler needs to know without taking anything: Closed,
// Open, or whether an open breaker is due a probe.
func (b *Breaker) View() (s State, probeDue bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state, b.state == Open && !b.cfg.Now().Before(b.openedAt.Add(b.cfg.Cooldown))
}

// Acquire asks to send one request. It fails with ErrOpen while the
// breaker is open and cooling down, or half-open with its probe out; an
// open breaker past its cooldown turns half-open and lets this request
// through as the probe. The caller must report the outcome with Success or
// Failure.
func (b *Breaker) Acquire() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case Closed:
		return nil
	case Open:
		if b.cfg.Now().Before(b.openedAt.Add(b.cfg.Cooldown)) {
			return ErrOpen
		}
		b.set(HalfOpen)
		return nil
	default: // HalfOpen: one probe at a time
		return ErrOpen
	}
}

// Success reports a request that the replica answered. It closes the
// breaker whatever its state: a replica that answers is alive.
func (b *Breaker) Success() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures = 0
	if b.state != Closed {
		b.set(Closed)
	}
}

// Failure reports a request that failed at the replica (connection error,
// timeout, 5xx). A failed probe reopens at once; otherwise the breaker opens
// after Failures in a row.
func (b *Breaker) Failure() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures++
	if b.state == HalfOpen || (b.state == Closed && b.failures >= b.cfg.Failures) {
		b.openedAt = b.cfg.Now()
		b.set(Open)
	}
}

// Release gives back a probe whose request was abandoned without an
// outcome (the client went away): the breaker returns to open, due a probe
// at once, instead of waiting for an answer that will not come.
func (b *Breaker) Release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == HalfOpen {
		b.set(Open)
	}
}

func (b *Breaker) set(to State) {
	from := b.state
	b.state = to
	if b.onChange != nil {
		b.onChange(from, to)
	}
}
