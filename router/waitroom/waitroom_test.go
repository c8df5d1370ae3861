package waitroom

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/endpoint"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// table is a routing table the test changes.
type table struct {
	mu      sync.Mutex
	eps     map[string][]*endpoint.Endpoint
	changed chan struct{}
}

func (t *table) Lookup(m string) ([]*endpoint.Endpoint, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.eps[m], true
}

func (t *table) Changed() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.changed
}

func (t *table) set(model string, eps ...*endpoint.Endpoint) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.eps[model] = eps
	close(t.changed)
	t.changed = make(chan struct{})
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

var t0 = time.Unix(1_700_000_000, 0)

type rig struct {
	room *Room
	tb   *table
	clk  *clock
	reg  *prometheus.Registry
	// ctx is the requests' unless a test gives its own; it ends, and
	// every request the rig sent has returned, when the test ends.
	ctx context.Context
	wg  sync.WaitGroup
}

func newRig(t *testing.T, cfg Config) *rig {
	t.Helper()
	clk := &clock{t: t0}
	tb := &table{eps: map[string][]*endpoint.Endpoint{}, changed: make(chan struct{})}
	reg := prometheus.NewRegistry()
	cfg.Now = clk.now
	ctx, cancel := context.WithCancel(context.Background())
	r := &rig{room: New(cfg, tb, reg), tb: tb, clk: clk, reg: reg, ctx: ctx}
	t.Cleanup(func() { cancel(); r.wg.Wait() })
	return r
}

// replica is an endpoint routable since since (zero: since before the
// router's first state).
func replica(id string, since time.Time) *endpoint.Endpoint {
	return &endpoint.Endpoint{ReplicaID: id, Model: "m", Address: "127.0.0.1:1", RoutableSince: since}
}

var lim = Limits{MaxHeld: 3, Timeout: time.Minute, Warm: 2}

type result struct {
	i   int
	p   *Pass
	ref *Refusal
}

// enter sends request i of n bytes for m; it returns at once, the result
// arriving on out.
func (r *rig) enter(ctx context.Context, i, n int, l Limits, out chan<- result) {
	r.wg.Go(func() {
		p, ref := r.room.Enter(ctx, Request{Model: "m", Limits: l, Bytes: n})
		out <- result{i, p, ref}
	})
}

// hold enters requests 0..n-1, each held before the next is sent, so
// their arrival order is known.
func (r *rig) hold(t *testing.T, n int, l Limits, out chan<- result) {
	t.Helper()
	for i := range n {
		r.enter(r.ctx, i, 10, l, out)
		testkit.Wait(t, "request held", func() bool { return r.room.Held("m") == i+1 })
	}
}

func recv(t *testing.T, out <-chan result) result {
	t.Helper()
	select {
	case res := <-out:
		return res
	case <-time.After(10 * time.Second):
		t.Fatal("no request decided within 10 s")
		return result{}
	}
}

func none(t *testing.T, out <-chan result) {
	t.Helper()
	select {
	case res := <-out:
		t.Fatalf("request %d decided: %+v %+v", res.i, res.p, res.ref)
	default:
	}
}

// TestEnter: a request goes through at once while its model has a replica
// past its warm-up and nothing is held before it; without a replica it is
// held; past max_held or the bytes it gets 503 at once, naming the bound,
// with Retry-After.
func TestEnter(t *testing.T) {
	tests := []struct {
		name     string
		eps      []*endpoint.Endpoint
		held     int // requests held first (no replica)
		bytes    int
		maxBytes int64
		through  bool
		reason   string
		msg      string
	}{
		{name: "a replica of unknown age", eps: []*endpoint.Endpoint{replica("m-0", time.Time{})}, through: true},
		{name: "a replica past its warm-up", eps: []*endpoint.Endpoint{replica("m-0", t0.Add(-DefaultWarmup))}, through: true},
		{name: "a warming replica with room", eps: []*endpoint.Endpoint{replica("m-0", t0)}, through: true},
		{name: "no replica: held"},
		{name: "max_held", held: 3, reason: ReasonMaxHeld, msg: "already holds 3 requests for it (autoscale.max_held)"},
		{name: "the bytes", held: 1, bytes: 95, maxBytes: 100, reason: ReasonMaxBytes, msg: "take its 100 bytes (hold_max_bytes)"},
		{name: "the bytes, to the byte", held: 1, bytes: 90, maxBytes: 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, Config{MaxBytes: tt.maxBytes})
			ctx := r.ctx
			out := make(chan result, 8)
			r.hold(t, tt.held, lim, out)
			r.tb.set("m", tt.eps...)
			if tt.through {
				p, ref := r.room.Enter(ctx, Request{Model: "m", Limits: lim, Bytes: tt.bytes})
				if p == nil || ref != nil || p.Waited != 0 {
					t.Fatalf("Enter = %+v, %+v; want through at once", p, ref)
				}
				p.Done()
				p.Done() // once only
				return
			}
			r.enter(ctx, 99, tt.bytes, lim, out)
			if tt.reason == "" {
				testkit.Wait(t, "held", func() bool { return r.room.Held("m") == tt.held+1 })
				none(t, out)
				return
			}
			res := recv(t, out)
			if res.p != nil || res.ref == nil || res.ref.Reason != tt.reason || res.ref.Err == nil ||
				res.ref.Err.Status != 503 || res.ref.Err.RetryAfter <= 0 || !strings.Contains(res.ref.Err.Message, tt.msg) {
				t.Fatalf("Enter = %+v, %+v; want 503 %s with Retry-After saying %q", res.p, res.ref, tt.reason, tt.msg)
			}
			if got := testkit.Metric(t, r.reg, "llmgw_router_hold_refused_total", map[string]string{"model": "m", "reason": tt.reason}); got != 1 {
				t.Fatalf("refused counted %v times", got)
			}
		})
	}
}

// TestRelease: once a replica past its warm-up appears, every held
// request is released, with the time it was held; a request arriving
// while others are held waits behind them.
func TestRelease(t *testing.T) {
	r := newRig(t, Config{})
	out := make(chan result, 8)
	r.hold(t, 3, lim, out)
	r.clk.add(2 * time.Second)
	r.room.pass()
	none(t, out) // still no replica
	r.tb.set("m", replica("m-0", time.Time{}))
	r.room.pass()
	for range 3 {
		res := recv(t, out)
		if res.p == nil || res.p.Waited != 2*time.Second {
			t.Fatalf("request %d: %+v %+v, want released after 2s", res.i, res.p, res.ref)
		}
		res.p.Done()
	}
	if got := testkit.Metric(t, r.reg, "llmgw_router_hold_released_total", map[string]string{"model": "m"}); got != 3 {
		t.Fatalf("released %v", got)
	}
	if got := testkit.Metric(t, r.reg, "llmgw_router_held_requests", map[string]string{"model": "m"}); got != 0 {
		t.Fatalf("held gauge %v", got)
	}
	if len(r.room.models) != 0 {
		t.Fatalf("state kept for %d models with nothing held or running", len(r.room.models))
	}
}

// TestWarmBound: while every replica warms up, at most Warm requests per
// replica are let through at a time, the held ones in arrival order and
// a new one behind them; a request's end lets the next through; past the
// warm-up, the rest go.
func TestWarmBound(t *testing.T) {
	r := newRig(t, Config{})
	l := Limits{MaxHeld: 10, Timeout: time.Hour, Warm: 2}
	out := make(chan result, 16)
	r.hold(t, 5, l, out)
	r.tb.set("m", replica("m-0", t0))
	r.room.pass()
	a, b := recv(t, out), recv(t, out)
	if a.i+b.i != 1 { // 0 and 1, in either order
		t.Fatalf("released %d and %d, want the first two", a.i, b.i)
	}
	none(t, out)

	a.p.Done()
	r.room.pass()
	if c := recv(t, out); c.i != 2 {
		t.Fatalf("released %d after a request ended, want 2", c.i)
	}
	none(t, out)

	// A second warming replica doubles the bound: two more.
	r.tb.set("m", replica("m-0", t0), replica("m-1", t0.Add(time.Second)))
	r.room.pass()
	if c, d := recv(t, out), recv(t, out); c.i+d.i != 3+4 {
		t.Fatalf("released %d and %d, want 3 and 4", c.i, d.i)
	}
	// Nothing held now, the bound full (4 of 4): a new arrival is held.
	r.enter(r.ctx, 5, 10, l, out)
	testkit.Wait(t, "a new arrival held at the bound", func() bool { return r.room.Held("m") == 1 })
	r.clk.add(DefaultWarmup)
	r.room.pass()
	if e := recv(t, out); e.i != 5 || e.p.Waited != DefaultWarmup {
		t.Fatalf("after the warm-up: %d waited %v", e.i, e.p)
	}
}

// TestTimeout: a request held past its model's timeout gets 503 naming
// hold_timeout_s, counted, its bytes given back; one held later waits on.
func TestTimeout(t *testing.T) {
	r := newRig(t, Config{})
	out := make(chan result, 4)
	r.hold(t, 1, lim, out)
	r.clk.add(30 * time.Second)
	r.hold(t, 0, lim, out)
	r.enter(r.ctx, 1, 10, lim, out)
	testkit.Wait(t, "second held", func() bool { return r.room.Held("m") == 2 })
	r.clk.add(30 * time.Second)
	r.room.pass()
	res := recv(t, out)
	if res.i != 0 || res.ref == nil || res.ref.Reason != ReasonTimeout || res.ref.Err.Status != 503 || res.ref.Err.RetryAfter <= 0 ||
		!strings.Contains(res.ref.Err.Message, "within 1m0s (autoscale.hold_timeout_s)") {
		t.Fatalf("request %d: %+v; want 503 hold_timeout", res.i, res.ref)
	}
	none(t, out)
	if got := testkit.Metric(t, r.reg, "llmgw_router_hold_timeouts_total", map[string]string{"model": "m"}); got != 1 {
		t.Fatalf("timeouts %v", got)
	}
	if got := testkit.Metric(t, r.reg, "llmgw_router_held_bytes", nil); got != 10 {
		t.Fatalf("held bytes %v, want the one request's 10", got)
	}
}

// TestClientLeaves: a held request whose client goes away is dropped at
// once: nothing to answer, its place and bytes given back.
func TestClientLeaves(t *testing.T) {
	r := newRig(t, Config{})
	ctx, cancel := context.WithCancel(r.ctx)
	out := make(chan result, 1)
	r.enter(ctx, 0, 10, lim, out)
	testkit.Wait(t, "held", func() bool { return r.room.Held("m") == 1 })
	cancel()
	res := recv(t, out)
	if res.p != nil || res.ref == nil || res.ref.Err != nil {
		t.Fatalf("Enter = %+v, %+v; want a refusal without an answer", res.p, res.ref)
	}
	if r.room.Held("m") != 0 || r.room.bytes != 0 || len(r.room.models) != 0 {
		t.Fatalf("held %d, %d bytes, %d models after the client left", r.room.Held("m"), r.room.bytes, len(r.room.models))
	}
	if got := testkit.Metric(t, r.reg, "llmgw_router_hold_dropped_total", map[string]string{"model": "m"}); got != 1 {
		t.Fatalf("dropped %v", got)
	}
}

// TestRun: the loop releases held requests as soon as the routing table
// shows a replica, without waiting for a tick, and times them out by its
// ticks; it returns when its context ends.
func TestRun(t *testing.T) {
	r := newRig(t, Config{Tick: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = r.room.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	out := make(chan result, 4)
	r.hold(t, 2, lim, out)
	r.tb.set("m", replica("m-0", time.Time{}))
	for range 2 {
		if res := recv(t, out); res.p == nil {
			t.Fatalf("request %d: %+v", res.i, res.ref)
		}
	}

	r2 := newRig(t, Config{Tick: time.Millisecond})
	ctx2, cancel2 := context.WithCancel(context.Background())
	done2 := make(chan struct{})
	go func() { _ = r2.room.Run(ctx2); close(done2) }()
	defer func() { cancel2(); <-done2 }()
	r2.hold(t, 1, lim, out)
	r2.clk.add(time.Minute)
	if res := recv(t, out); res.ref == nil || res.ref.Reason != ReasonTimeout {
		t.Fatalf("after the timeout: %+v %+v", res.p, res.ref)
	}
}

func TestLimitsOf(t *testing.T) {
	tests := []struct {
		name string
		m    *llmgwv1.Model
		want Limits
		ok   bool
	}{
		{"not autoscaled", &llmgwv1.Model{Name: "m"}, Limits{}, false},
		{"defaults", &llmgwv1.Model{Autoscale: &llmgwv1.Autoscale{Max: 2}}, Limits{DefaultMaxHeld, DefaultHoldTimeout, DefaultWarm}, true},
		{"the spec's", &llmgwv1.Model{Autoscale: &llmgwv1.Autoscale{MaxHeld: 7, HoldTimeoutS: 9, WarmConcurrency: 11},
			ExtraArgs: []string{"--max-num-seqs", "64"}}, Limits{7, 9 * time.Second, 11}, true},
		{"--max-num-seqs N", &llmgwv1.Model{Autoscale: &llmgwv1.Autoscale{}, ExtraArgs: []string{"--dtype", "half", "--max-num-seqs", "64"}},
			Limits{DefaultMaxHeld, DefaultHoldTimeout, 64}, true},
		{"--max-num-seqs=N", &llmgwv1.Model{Autoscale: &llmgwv1.Autoscale{}, ExtraArgs: []string{"--max-num-seqs=48"}},
			Limits{DefaultMaxHeld, DefaultHoldTimeout, 48}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := LimitsOf(tt.m)
			if got != tt.want || ok != tt.ok {
				t.Fatalf("LimitsOf = %+v, %v; want %+v, %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}

// BenchmarkEnterOpen is the room's cost for a request of an autoscaled
// model that has a replica past its warm-up: what every such request pays.
func BenchmarkEnterOpen(b *testing.B) {
	tb := &table{eps: map[string][]*endpoint.Endpoint{"m": {replica("m-0", time.Time{})}}, changed: make(chan struct{})}
	room := New(Config{}, tb, prometheus.NewRegistry())
	req := Request{Model: "m", Limits: lim, Bytes: 100}
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p, _ := room.Enter(ctx, req)
			p.Done()
		}
	})
}
