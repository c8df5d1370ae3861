// Package testkit holds the helpers every test package needs the same way:
// polling a condition under a deadline and reading a Prometheus metric, from
// a registry or from a process's /metrics. They were copied into a dozen
// test files, each with its own interval, deadline and failure text; one copy
// keeps the rules of the suite in one place (the project's README: wait for
// conditions, never for fixed times; every wait has a deadline and a message
// saying what did not happen).
//
// Only tests import it. It is a leaf under internal/ (design §3): it imports
// no package of the repository.
package testkit

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// Interval is how often the waits poll: short enough that a test does not
// sleep long past its condition, long enough not to spin a busy machine.
const Interval = 20 * time.Millisecond

// DefaultTimeout is the deadline of Wait: a bound on a broken test hanging,
// never a measurement. A condition an idle machine meets in milliseconds
// still has it, so a loaded CI machine does not fail a correct test.
const DefaultTimeout = 30 * time.Second

// Until polls cond every Interval until it returns nil or ctx ends, and
// returns nil or cond's last error. cond runs at least once, so a context
// that has already ended still reports what cond saw. It is the core of
// the waits below, for callers that hold a context rather than a
// *testing.T.
func Until(ctx context.Context, cond func() error) error {
	tick := time.NewTicker(Interval)
	defer tick.Stop()
	for {
		last := cond()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return last
		case <-tick.C:
		}
	}
}

// Eventually polls cond until it holds or timeout passes, and reports
// whether it held: for callers that decide themselves what a miss means.
func Eventually(timeout time.Duration, cond func() bool) bool {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return Until(ctx, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	}) == nil
}

// EventuallyErr polls cond until it returns nil or timeout passes, and
// returns its last error: the miss says what was last seen.
func EventuallyErr(timeout time.Duration, cond func() error) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return Until(ctx, cond)
}

var errNotYet = fmt.Errorf("condition not met")

// Wait polls cond until it holds, failing t with what (the condition, as
// "the replica is ready") after DefaultTimeout.
func Wait(t testing.TB, what string, cond func() bool) {
	t.Helper()
	WaitWithin(t, DefaultTimeout, what, cond)
}

// WaitWithin is Wait with its own deadline.
func WaitWithin(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Eventually(timeout, cond) {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// WaitErr polls cond until it returns nil, failing t with what and cond's
// last error after timeout.
func WaitErr(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	if err := EventuallyErr(timeout, cond); err != nil {
		t.Fatalf("timed out after %v waiting for %s: %v", timeout, what, err)
	}
}

// WaitCtx polls cond until it returns nil, failing t with what and cond's
// last error when ctx ends: for tests whose deadline is a context shared by
// several steps.
func WaitCtx(ctx context.Context, t testing.TB, what string, cond func() error) {
	t.Helper()
	if err := Until(ctx, cond); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// Throughout checks, for d, that check keeps returning nil, polling it
// every `every` (Interval when 0), and returns the first error it gives —
// the way to show that a thing does not happen. d is a length, not a
// deadline: what it takes to show a thing does not happen is the time it
// would take to happen, so a passing run pays all of it, and a loaded
// machine can only make the check weaker (fewer samples), never fail it
// falsely. check runs at least once.
func Throughout(d, every time.Duration, check func() error) error {
	if every <= 0 {
		every = Interval
	}
	end := time.Now().Add(d)
	for {
		if err := check(); err != nil {
			return err
		}
		if !time.Now().Before(end) {
			return nil
		}
		time.Sleep(min(every, time.Until(end)))
	}
}

// SyncBuffer is a bytes.Buffer that writers (a process's output copied by
// exec, a logger on other goroutines) and a test's reads may share.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is what was written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
