package director

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/endpoint"
)

// fakeClock is a Clock moved by Advance; After's channels fire when it
// passes their time.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []fakeTimer
}

type fakeTimer struct {
	at time.Time
	ch chan time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	c.timers = append(c.timers, fakeTimer{at: c.now.Add(d), ch: ch})
	return ch
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	keep := c.timers[:0]
	for _, t := range c.timers {
		if !t.at.After(c.now) {
			t.ch <- c.now
		} else {
			keep = append(keep, t)
		}
	}
	c.timers = keep
}

// pending is how many After channels have not fired.
func (c *fakeClock) pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// liveTable is a table whose holdings change, announcing it.
type liveTable struct {
	*table
	mu      sync.Mutex
	holds   map[string]map[string]bool // replica -> adapters
	changed chan struct{}
}

func newLiveTable() *liveTable {
	tb := baseTable()
	tb.adapters["law"] = endpoint.AdapterRef{Model: "base", Index: 2}
	return &liveTable{table: tb, holds: map[string]map[string]bool{}, changed: make(chan struct{})}
}

func (t *liveTable) Holds(e *endpoint.Endpoint, a string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.holds[e.ReplicaID][a]
}

func (t *liveTable) Changed() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.changed
}

func (t *liveTable) hold(replica, adapter string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.holds[replica] == nil {
		t.holds[replica] = map[string]bool{}
	}
	t.holds[replica][adapter] = true
	close(t.changed)
	t.changed = make(chan struct{})
}

// scriptedControl answers EnsureAdapter from a channel the test feeds,
// recording each request.
type scriptedControl struct {
	mu      sync.Mutex
	reqs    []*llmgwv1.EnsureAdapterRequest
	answers chan *llmgwv1.EnsureAdapterResponse
}

func newScriptedControl() *scriptedControl {
	return &scriptedControl{answers: make(chan *llmgwv1.EnsureAdapterResponse)}
}

func (c *scriptedControl) EnsureAdapter(ctx context.Context, req *llmgwv1.EnsureAdapterRequest) (*llmgwv1.EnsureAdapterResponse, error) {
	c.mu.Lock()
	c.reqs = append(c.reqs, req)
	c.mu.Unlock()
	select {
	case resp := <-c.answers:
		return resp, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (c *scriptedControl) calls() []*llmgwv1.EnsureAdapterRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*llmgwv1.EnsureAdapterRequest(nil), c.reqs...)
}

type resolved struct {
	tgt Target
	err error
}

func resolveAsync(d *Director, name string) chan resolved {
	out := make(chan resolved, 1)
	go func() {
		tgt, err := d.Resolve(context.Background(), name, discard)
		if err != nil {
			out <- resolved{tgt, err}
			return
		}
		out <- resolved{tgt, nil}
	}()
	return out
}

// TestAdapterQueue: a request for a cold adapter waits in the model's
// queue — through the control plane's busy answers and its queued waits —
// until the table shows a holder, or answers 503 with Retry-After when
// the wait or the queue's length is exceeded, saying which.
func TestAdapterQueue(t *testing.T) {
	const wait = 30 * time.Second
	loaded := &llmgwv1.EnsureAdapterResponse{State: llmgwv1.AdapterState_ADAPTER_STATE_LOADED, LoadedOn: []string{"r0"}}
	busy := &llmgwv1.EnsureAdapterResponse{RetryAfterMs: 1500, Reason: "every loaded adapter is busy"}
	queuedOut := &llmgwv1.EnsureAdapterResponse{State: llmgwv1.AdapterState_ADAPTER_STATE_LOADING, Queued: true, RetryAfterMs: 1000}
	tests := []struct {
		name string
		// script drives one request for "sql": the control plane's
		// answers, clock moves and table changes, in order.
		script     func(t *testing.T, clk *fakeClock, ctl *scriptedControl, tb *liveTable)
		wantServed bool
		wantErr    string // in the 503's message
		wantResult string
		wantCalls  int
	}{
		{name: "queued at the plane, then loaded: served", script: func(t *testing.T, clk *fakeClock, ctl *scriptedControl, tb *liveTable) {
			clk.Advance(4 * time.Second) // the plane holds the call while no slot frees
			ctl.answers <- loaded
			tb.hold("r0", "sql")
		}, wantServed: true, wantResult: "served_after_wait", wantCalls: 1},
		{name: "plane's wait ends unplaced: asked again, then served", script: func(t *testing.T, clk *fakeClock, ctl *scriptedControl, tb *liveTable) {
			ctl.answers <- queuedOut
			testkit.Wait(t, "the pause", func() bool { return clk.pending() == 2 })
			clk.Advance(ensureRetry)
			testkit.Wait(t, "the second call", func() bool { return len(ctl.calls()) == 2 })
			ctl.answers <- loaded
			tb.hold("r0", "sql")
		}, wantServed: true, wantResult: "served_after_wait", wantCalls: 2},
		{name: "busy without a queue: asked again after its retry-after", script: func(t *testing.T, clk *fakeClock, ctl *scriptedControl, tb *liveTable) {
			ctl.answers <- busy
			testkit.Wait(t, "the retry timer", func() bool { return clk.pending() == 2 })
			if n := len(ctl.calls()); n != 1 {
				t.Errorf("asked again before the retry-after: %d calls", n)
			}
			clk.Advance(1500 * time.Millisecond)
			ctl.answers <- loaded
			tb.hold("r0", "sql")
		}, wantServed: true, wantResult: "served_after_wait", wantCalls: 2},
		{name: "no slot within the wait: 503 naming --adapter-wait", script: func(t *testing.T, clk *fakeClock, ctl *scriptedControl, tb *liveTable) {
			ctl.answers <- queuedOut
			testkit.Wait(t, "the pause", func() bool { return clk.pending() == 2 })
			clk.Advance(ensureRetry)
			testkit.Wait(t, "the second call", func() bool { return len(ctl.calls()) == 2 })
			clk.Advance(wait)
		}, wantErr: `no slot of model "base" freed for it within 30s (--adapter-wait)`, wantResult: "timed_out", wantCalls: 2},
		{name: "loaded but never in the table: 503 saying so", script: func(t *testing.T, clk *fakeClock, ctl *scriptedControl, tb *liveTable) {
			ctl.answers <- loaded
			testkit.Wait(t, "the table wait", func() bool { return clk.pending() == 2 })
			clk.Advance(wait)
		}, wantErr: "reported loaded on [r0] but not routable here within 30s", wantResult: "timed_out", wantCalls: 1},
		{name: "loaded, not in the table, asked again: then served", script: func(t *testing.T, clk *fakeClock, ctl *scriptedControl, tb *liveTable) {
			ctl.answers <- loaded
			testkit.Wait(t, "the table wait", func() bool { return clk.pending() == 2 })
			clk.Advance(loadedRecheck)
			testkit.Wait(t, "the second call", func() bool { return len(ctl.calls()) == 2 })
			tb.hold("r0", "sql")
		}, wantServed: true, wantResult: "served_after_wait", wantCalls: 2},
		{name: "load failed: 503 with its retry-after", script: func(t *testing.T, clk *fakeClock, ctl *scriptedControl, tb *liveTable) {
			ctl.answers <- &llmgwv1.EnsureAdapterResponse{State: llmgwv1.AdapterState_ADAPTER_STATE_FAILED, Reason: "no such file", RetryAfterMs: 2500}
		}, wantErr: "loading failed: no such file", wantResult: "failed", wantCalls: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk, ctl, tb := newFakeClock(), newScriptedControl(), newLiveTable()
			reg := prometheus.NewRegistry()
			d := New(tb, &sched{}, noBreakers{}, reg, WithAdapters(ctl, wait), WithAdapterQueue(4, clk))
			defer d.Close()
			start := clk.Now()
			got := resolveAsync(d, "sql")
			testkit.Wait(t, "the first call", func() bool { return len(ctl.calls()) == 1 })
			first := ctl.calls()[0]
			if !first.Queue || first.Waiting != 1 || first.WaitingSinceUnixNano != start.UnixNano() || first.TimeoutMs != wait.Milliseconds() {
				t.Errorf("first call %v: want queue, 1 waiting since the request arrived, the wait as timeout", first)
			}
			tt.script(t, clk, ctl, tb)
			r := <-got
			if tt.wantServed {
				if r.err != nil || len(r.tgt.Endpoints) != 1 || r.tgt.Endpoints[0].ReplicaID != "r0" {
					t.Fatalf("Resolve = %+v, %v; want r0", r.tgt, r.err)
				}
			} else {
				if r.err == nil || !strings.Contains(r.err.Error(), tt.wantErr) {
					t.Fatalf("Resolve error %v, want one saying %q", r.err, tt.wantErr)
				}
			}
			if n := len(ctl.calls()); n != tt.wantCalls {
				t.Errorf("EnsureAdapter calls %d, want %d", n, tt.wantCalls)
			}
			if got := testkit.Metric(t, reg, "llmgw_router_adapter_queue_requests_total", testkit.Labels{"model": "base", "result": tt.wantResult}); got != 1 {
				t.Errorf("queue requests{result=%q} = %v, want 1", tt.wantResult, got)
			}
		})
	}
}

// TestAdapterQueueBound: past --adapter-queue requests for the model get
// 503 with Retry-After at once, saying the queue is full; another model's
// queue is apart, and a place freed is taken again.
func TestAdapterQueueBound(t *testing.T) {
	clk, ctl, tb := newFakeClock(), newScriptedControl(), newLiveTable()
	reg := prometheus.NewRegistry()
	d := New(tb, &sched{}, noBreakers{}, reg, WithAdapters(ctl, time.Minute), WithAdapterQueue(2, clk))
	defer d.Close()
	a, b := resolveAsync(d, "sql"), resolveAsync(d, "law")
	testkit.Wait(t, "both waiting", func() bool { return len(ctl.calls()) == 2 })
	_, err := d.Resolve(context.Background(), "sql", discard)
	if err == nil || err.Status != 503 || err.RetryAfter != 1 || !strings.Contains(err.Message, `the queue for model "base"'s adapters is full (2 requests waiting, --adapter-queue)`) {
		t.Fatalf("third request: %+v, want 503 queue full", err)
	}
	if got := testkit.Metric(t, reg, "llmgw_router_adapter_queue_requests_total", testkit.Labels{"model": "base", "result": "queue_full"}); got != 1 {
		t.Errorf("queue_full = %v, want 1", got)
	}
	// The two waiting are served once loaded; both adapters' demand was
	// sent with its own arrival.
	for _, c := range ctl.calls() {
		if c.Waiting != 1 || c.WaitingSinceUnixNano != clk.Now().UnixNano() {
			t.Errorf("call %v: want 1 waiting since now", c)
		}
	}
	ctl.answers <- &llmgwv1.EnsureAdapterResponse{State: llmgwv1.AdapterState_ADAPTER_STATE_LOADED}
	ctl.answers <- &llmgwv1.EnsureAdapterResponse{State: llmgwv1.AdapterState_ADAPTER_STATE_LOADED}
	tb.hold("r0", "sql")
	tb.hold("r1", "law")
	for _, ch := range []chan resolved{a, b} {
		if r := <-ch; r.err != nil {
			t.Fatalf("waiting request: %v", r.err)
		}
	}
	if got := testkit.Metric(t, reg, "llmgw_router_adapter_queue_requests_total", testkit.Labels{"model": "base", "result": "served_after_wait"}); got != 2 {
		t.Errorf("served_after_wait = %v, want 2", got)
	}
}

// TestAdapterQueueDemand: the demand sent for an adapter is its waiting
// count and its oldest waiter's arrival, apart per adapter and model.
func TestAdapterQueueDemand(t *testing.T) {
	q := newAdapterQueue(10)
	t0 := time.Unix(100, 0)
	w1, _ := q.join("m", "a", t0)
	w2, _ := q.join("m", "a", t0.Add(time.Second))
	q.join("m", "b", t0.Add(2*time.Second))
	q.join("other", "a", t0.Add(-time.Hour))
	if n, since := q.demand("m", "a"); n != 2 || !since.Equal(t0) {
		t.Fatalf("demand(m, a) = %d since %v, want 2 since %v", n, since, t0)
	}
	q.leave(w1)
	if n, since := q.demand("m", "a"); n != 1 || !since.Equal(t0.Add(time.Second)) {
		t.Fatalf("after the oldest left: %d since %v", n, since)
	}
	if n := q.leave(w2); n != 1 {
		t.Fatalf("m's queue length after both a left: %d, want 1 (b)", n)
	}
	if n := q.leave(w2); n != 1 {
		t.Fatalf("leaving twice changed the length: %d", n)
	}
	if n, _ := q.demand("m", "a"); n != 0 {
		t.Fatalf("demand after all left: %d", n)
	}
}

// TestAdapterMissing: a replica that answered 404 for an adapter is not
// given it on the table's word for missingFor, then is again.
func TestAdapterMissing(t *testing.T) {
	clk, ctl, tb := newFakeClock(), newScriptedControl(), newLiveTable()
	tb.hold("r0", "sql")
	tb.hold("r1", "sql")
	d := New(tb, &sched{}, noBreakers{}, nil, WithAdapters(ctl, time.Minute), WithAdapterQueue(4, clk))
	defer d.Close()
	tgt, err := d.Resolve(context.Background(), "sql", discard)
	if err != nil || len(tgt.Endpoints) != 2 {
		t.Fatalf("before: %v, %v", tgt.Endpoints, err)
	}
	d.AdapterMissing("sql", tgt.Endpoints[:1])
	if tgt, err = d.Resolve(context.Background(), "sql", discard); err != nil || len(tgt.Endpoints) != 1 || tgt.Endpoints[0].ReplicaID != "r1" {
		t.Fatalf("after r0's 404: %v, %v; want r1 alone", tgt.Endpoints, err)
	}
	// Both missing: the request waits for a holder, asking the plane.
	d.AdapterMissing("sql", tgt.Endpoints)
	got := resolveAsync(d, "sql")
	testkit.Wait(t, "the call", func() bool { return len(ctl.calls()) == 1 })
	clk.Advance(missingFor)
	ctl.answers <- &llmgwv1.EnsureAdapterResponse{State: llmgwv1.AdapterState_ADAPTER_STATE_LOADED}
	tb.hold("r0", "sql") // the table changes: both are eligible again
	if r := <-got; r.err != nil || len(r.tgt.Endpoints) != 2 {
		t.Fatalf("after missingFor: %v, %v", r.tgt.Endpoints, r.err)
	}
}
