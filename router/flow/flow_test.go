package flow

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/endpoint"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeLoads is a model's replicas with loads the test sets.
type fakeLoads struct {
	mu    sync.Mutex
	loads map[string][]endpoint.Load
}

func (f *fakeLoads) Loads(model string, dst []endpoint.Load) []endpoint.Load {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append(dst, f.loads[model]...)
}

func (f *fakeLoads) set(model string, ls ...endpoint.Load) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.loads[model] = ls
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

// running is a fresh replica reading with n requests running.
func running(n float64) endpoint.Load { return endpoint.Load{Reading: endpoint.Reading{Running: n}} }

type rig struct {
	c     *Controller
	loads *fakeLoads
	clk   *clock
	reg   *prometheus.Registry
}

// newRig: 2 replicas of "m", 10 requests each, the default classes.
func newRig(t *testing.T, mod func(*Config)) *rig {
	t.Helper()
	cfg := DefaultConfig()
	cfg.ReplicaConcurrency = 10
	if mod != nil {
		mod(&cfg)
	}
	r := &rig{loads: &fakeLoads{loads: map[string][]endpoint.Load{}}, clk: &clock{t: time.Unix(1_700_000_000, 0)}, reg: prometheus.NewRegistry()}
	r.loads.set("m", running(0), running(0))
	c, err := New(cfg, r.loads, nil, r.reg, r.clk.now)
	if err != nil {
		t.Fatal(err)
	}
	r.c = c
	return r
}

const (
	interactive = 0
	standard    = 1
	batch       = 2
)

// result is what one Admit returned.
type result struct {
	g   *Grant
	ref *Refusal
}

// admitAsync starts Admit and returns its result channel once the
// request is queued (or decided).
func (r *rig) admitAsync(t *testing.T, ctx context.Context, req Request) <-chan result {
	t.Helper()
	before := r.c.queued.Load()
	out := make(chan result, 1)
	go func() {
		g, ref := r.c.Admit(ctx, req)
		out <- result{g, ref}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for r.c.queued.Load() == before && len(out) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("request %+v neither queued nor decided within 5s", req)
		}
		time.Sleep(time.Millisecond)
	}
	return out
}

func recv(t *testing.T, ch <-chan result, what string) result {
	t.Helper()
	select {
	case res := <-ch:
		return res
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: no decision within 5s", what)
		return result{}
	}
}

// queuedIn is how many requests of rank wait for model "m".
func (r *rig) queuedIn(rank int) int {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	return r.c.model("m").queues[rank].n
}

// collect waits for n of chs to be decided and returns how many were
// dispatched per name, with their grants.
func collect(t *testing.T, n int, chs map[string][]<-chan result) (map[string]int, []*Grant) {
	t.Helper()
	got := map[string]int{}
	var grants []*Grant
	seen := map[<-chan result]bool{}
	deadline := time.Now().Add(5 * time.Second)
	for len(seen) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d requests decided within 5s", len(seen), n)
		}
		for name, cs := range chs {
			for _, ch := range cs {
				if seen[ch] {
					continue
				}
				select {
				case res := <-ch:
					seen[ch] = true
					if res.g != nil {
						got[name]++
						grants = append(grants, res.g)
					}
				default:
				}
			}
		}
		time.Sleep(time.Millisecond)
	}
	return got, grants
}

func TestBelowSaturationDispatchesAtOnce(t *testing.T) {
	r := newRig(t, nil)
	r.loads.set("m", running(3), running(4))
	for i := range 5 {
		g, ref := r.c.Admit(context.Background(), Request{Model: "m", Tenant: "a", Rank: batch})
		if ref != nil || g == nil || g.Waited != 0 || g.Class != "batch" {
			t.Fatalf("request %d: grant %+v refusal %+v; want dispatched at once", i, g, ref)
		}
		defer g.Done(0, false)
	}
	if got := testutil.ToFloat64(r.c.m.dispatched.WithLabelValues("m", "batch", "direct")); got != 5 {
		t.Fatalf("direct dispatches = %v, want 5", got)
	}
}

func TestDisabledDispatchesEverything(t *testing.T) {
	r := newRig(t, func(c *Config) { c.Enabled = false })
	r.loads.set("m", endpoint.Load{Saturated: true})
	g, ref := r.c.Admit(context.Background(), Request{Model: "m", Rank: batch})
	if g != nil || ref != nil {
		t.Fatalf("disabled: grant %+v refusal %+v, want neither", g, ref)
	}
	g.Done(0, false) // nil-safe
}

func TestNoReplicaIsNotQueued(t *testing.T) {
	r := newRig(t, nil)
	g, ref := r.c.Admit(context.Background(), Request{Model: "gone", Rank: batch})
	if ref != nil || g == nil {
		t.Fatalf("a model no replica serves: grant %+v refusal %+v; want dispatched (the director answers 503)", g, ref)
	}
	g.Done(0, false)
}

// TestRoom: what counts as full (design §7.8).
func TestRoom(t *testing.T) {
	cases := []struct {
		name  string
		conc  int
		loads []endpoint.Load
		room  float64
	}{
		{"idle", 10, []endpoint.Load{running(0), running(0)}, 20},
		{"running and own in flight: the larger", 10, []endpoint.Load{{Reading: endpoint.Reading{Running: 4}, Inflight: 6}, running(9)}, 5},
		{"stale is full", 10, []endpoint.Load{{Saturated: true}, running(2)}, 8},
		{"engine queues: full", 10, []endpoint.Load{{Reading: endpoint.Reading{Running: 2, Waiting: 1}}, running(2)}, 8},
		{"kv ceiling: full", 10, []endpoint.Load{{Reading: endpoint.Reading{Running: 2, KVUsage: 0.96}}, running(2)}, 8},
		{"no concurrency target: max_waiting each", 0, []endpoint.Load{running(50), running(80)}, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, func(c *Config) { c.ReplicaConcurrency = tc.conc })
			r.loads.set("m", tc.loads...)
			r.c.mu.Lock()
			room, _, serves := r.c.room(r.c.model("m"))
			r.c.mu.Unlock()
			if !serves || room != tc.room {
				t.Fatalf("room = %v (serves %v), want %v", room, serves, tc.room)
			}
		})
	}
}

// TestStrictPriorityAndHeadroom: at saturation the higher class goes
// first, and the batch class waits while only its headroom is free.
func TestStrictPriorityAndHeadroom(t *testing.T) {
	r := newRig(t, nil)
	r.loads.set("m", running(10), running(10)) // full
	ctx := context.Background()
	b := r.admitAsync(t, ctx, Request{Model: "m", Tenant: "a", Rank: batch})
	i := r.admitAsync(t, ctx, Request{Model: "m", Tenant: "b", Rank: interactive})

	// One slot frees: interactive takes it, batch (10 % headroom of 20 =
	// 2 slots kept) does not.
	r.loads.set("m", running(9), running(10))
	r.c.pass()
	res := recv(t, i, "interactive")
	if res.g == nil || res.g.Class != "interactive" {
		t.Fatalf("interactive: %+v", res)
	}
	defer res.g.Done(0, false)
	if r.queuedIn(batch) != 1 {
		t.Fatal("batch dispatched with no room left")
	}
	// Three free, one taken by the dispatched interactive (not yet on a
	// replica): 2 left = the headroom. Still held.
	r.loads.set("m", running(7), running(10))
	r.c.pass()
	if r.queuedIn(batch) != 1 {
		t.Fatal("batch dispatched into its headroom")
	}
	r.loads.set("m", running(6), running(10))
	r.c.pass()
	if res := recv(t, b, "batch"); res.g == nil || res.g.Class != "batch" {
		t.Fatalf("batch: %+v", res)
	} else {
		res.g.Done(0, false)
	}
	if got := testutil.ToFloat64(r.c.m.dispatched.WithLabelValues("m", "batch", "queued")); got != 1 {
		t.Fatalf("queued batch dispatches = %v, want 1", got)
	}
}

// TestArrivalWaitsBehindItsClass: with requests of its class (or above)
// queued, a new arrival queues behind them even if a slot is free now.
func TestArrivalWaitsBehindItsClass(t *testing.T) {
	r := newRig(t, nil)
	r.loads.set("m", running(10), running(10))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := r.admitAsync(t, ctx, Request{Model: "m", Tenant: "a", Rank: standard})
	r.loads.set("m", running(0), running(0))
	second := r.admitAsync(t, ctx, Request{Model: "m", Tenant: "a", Rank: standard})
	if r.queuedIn(standard) != 2 {
		t.Fatal("a request went ahead of one queued before it")
	}
	r.c.pass()
	for _, ch := range []<-chan result{first, second} {
		res := recv(t, ch, "standard")
		if res.g == nil {
			t.Fatalf("refused: %+v", res.ref)
		}
		res.g.Done(0, false)
	}
}

// TestLeastAttainedService: within a class the tenant served least goes
// next, however many requests the other has queued.
func TestLeastAttainedService(t *testing.T) {
	r := newRig(t, nil)
	r.loads.set("m", running(10), running(10))
	ctx := context.Background()
	var heavy, light []<-chan result
	for range 10 {
		heavy = append(heavy, r.admitAsync(t, ctx, Request{Model: "m", Tenant: "heavy", Rank: standard, Cost: 100}))
	}
	for range 3 {
		light = append(light, r.admitAsync(t, ctx, Request{Model: "m", Tenant: "light", Rank: standard, Cost: 100}))
	}
	// Room for 6 (plus the standard class's headroom of 1).
	r.loads.set("m", running(7), running(6))
	r.c.pass()
	served, grants := collect(t, 6, map[string][]<-chan result{"heavy": heavy, "light": light})
	if r.queuedIn(standard) != 7 || served["heavy"] != 3 || served["light"] != 3 {
		t.Fatalf("served %v, want 3 each: least attained service alternates", served)
	}
	for _, g := range grants {
		g.Done(100, true)
	}
	// The rest, so no goroutine is left behind.
	r.loads.set("m", running(0), running(0))
	r.c.pass()
	_, grants = collect(t, 7, map[string][]<-chan result{"heavy": heavy, "light": light})
	for _, g := range grants {
		g.Done(0, false)
	}
}

// TestSmallFleetHasNoReserve: one replica without a concurrency target is
// one request of capacity; a headroom that rounds down to no whole request
// reserves nothing, so every class is served (found by the integration
// tests: one replica's standard requests waited their TTL).
func TestSmallFleetHasNoReserve(t *testing.T) {
	r := newRig(t, func(c *Config) { c.ReplicaConcurrency = 0 })
	r.loads.set("m", running(3))
	for _, rank := range []int{standard, batch} {
		g, ref := r.c.Admit(context.Background(), Request{Model: "m", Rank: rank})
		if ref != nil || g == nil {
			t.Fatalf("rank %d on one idle replica: %+v", rank, ref)
		}
		g.Done(0, false)
	}
}

func TestServiceDecays(t *testing.T) {
	r := newRig(t, nil)
	a := &attained{v: 1000, at: r.clk.now()}
	r.clk.add(time.Minute)
	r.c.decay(a, r.clk.now())
	if a.v < 499 || a.v > 501 {
		t.Fatalf("after one half-life: %v, want 500", a.v)
	}
}

func TestQueueBounds(t *testing.T) {
	r := newRig(t, func(c *Config) {
		c.Classes[batch].MaxQueued = 1
		c.Classes[standard].MaxQueuedBytes = 100
	})
	r.loads.set("m", running(10), running(10))
	ctx, cancel := context.WithCancel(context.Background())
	waiting := r.admitAsync(t, ctx, Request{Model: "m", Rank: batch})
	_, ref := r.c.Admit(ctx, Request{Model: "m", Rank: batch})
	if ref == nil || ref.Reason != ReasonQueueFull || ref.Err.Status != 429 || ref.Err.RetryAfter < 1 {
		t.Fatalf("over max_queued: %+v, want 429 queue_full with Retry-After", ref)
	}
	_, ref = r.c.Admit(ctx, Request{Model: "m", Rank: standard, Bytes: 101})
	if ref == nil || ref.Reason != ReasonQueueBytes || !strings.Contains(ref.Err.Message, "standard") {
		t.Fatalf("over max_queued_bytes: %+v, want 429 queue_bytes", ref)
	}
	cancel()
	if res := recv(t, waiting, "cancelled"); res.ref == nil || res.ref.Err != nil {
		t.Fatalf("client gone: %+v, want a refusal without error", res)
	}
	if got := testutil.ToFloat64(r.c.m.refused.WithLabelValues("m", "batch", ReasonQueueFull)); got != 1 {
		t.Fatalf("refused{queue_full} = %v", got)
	}
}

// TestTTL: a request is refused when it has waited its class's TTL, and
// not a moment before.
func TestTTL(t *testing.T) {
	r := newRig(t, nil)
	r.loads.set("m", running(10), running(10))
	ch := r.admitAsync(t, context.Background(), Request{Model: "m", Rank: interactive})
	r.clk.add(30*time.Second - time.Millisecond)
	r.c.pass()
	if r.queuedIn(interactive) != 1 {
		t.Fatal("refused before its TTL")
	}
	r.clk.add(time.Millisecond)
	r.c.pass()
	res := recv(t, ch, "expired")
	if res.ref == nil || res.ref.Reason != ReasonQueueTimeout || res.ref.Err.Status != 429 {
		t.Fatalf("after its TTL: %+v, want 429 queue_timeout", res)
	}
	if r.c.queued.Load() != 0 {
		t.Fatalf("queued = %d after the timeout", r.c.queued.Load())
	}
}

// TestClientLeaves: a request whose client goes is out of the queue at
// once, its bytes with it.
func TestClientLeaves(t *testing.T) {
	r := newRig(t, nil)
	r.loads.set("m", running(10), running(10))
	ctx, cancel := context.WithCancel(context.Background())
	ch := r.admitAsync(t, ctx, Request{Model: "m", Tenant: "a", Rank: standard, Bytes: 50})
	cancel()
	if res := recv(t, ch, "left"); res.g != nil || res.ref == nil || res.ref.Err != nil {
		t.Fatalf("%+v, want dropped", res)
	}
	m := r.c.models["m"]
	if r.c.queued.Load() != 0 || m.queues[standard].bytes != 0 || len(m.queues[standard].tenants) != 0 {
		t.Fatal("the queue still holds a request whose client left")
	}
	if got := testutil.ToFloat64(r.c.m.dropped.WithLabelValues("m", "standard")); got != 1 {
		t.Fatalf("dropped = %v", got)
	}
}

// TestFleetHold: another router's waiting interactive class holds this
// router's batch, until its report expires.
func TestFleetHold(t *testing.T) {
	r := newRig(t, nil)
	r.c.SetFleet([]*llmgwv1.FlowDepth{{Model: "m", Class: "interactive", Queued: 2, OldestWaitMs: 60}}, r.clk.now().Add(time.Second))
	ch := r.admitAsync(t, context.Background(), Request{Model: "m", Rank: batch})
	if r.queuedIn(batch) != 1 {
		t.Fatal("batch dispatched while another router's interactive waited")
	}
	// The same class is not held by it, nor is interactive.
	g, ref := r.c.Admit(context.Background(), Request{Model: "m", Rank: interactive})
	if ref != nil {
		t.Fatalf("interactive: %+v", ref)
	}
	g.Done(0, false)
	r.clk.add(time.Second + time.Millisecond)
	r.c.pass()
	res := recv(t, ch, "after the report expired")
	if res.g == nil {
		t.Fatalf("%+v", res)
	}
	res.g.Done(0, false)

	// A class the router does not know is placed by its sender's rank;
	// a short wait (under half the inversion bound) holds nothing.
	r.c.SetFleet([]*llmgwv1.FlowDepth{{Model: "m", Class: "urgent", Rank: 0, Queued: 1, OldestWaitMs: 10}}, r.clk.now().Add(time.Second))
	g, ref = r.c.Admit(context.Background(), Request{Model: "m", Rank: batch})
	if ref != nil || g == nil {
		t.Fatalf("held by a 10 ms wait: %+v", ref)
	}
	g.Done(0, false)
}

func TestDepths(t *testing.T) {
	r := newRig(t, nil)
	if d := r.c.Depths(); d != nil {
		t.Fatalf("idle depths %v", d)
	}
	r.loads.set("m", running(10), running(10))
	ctx, cancel := context.WithCancel(context.Background())
	ch := r.admitAsync(t, ctx, Request{Model: "m", Rank: batch, Bytes: 7})
	r.clk.add(250 * time.Millisecond)
	d := r.c.Depths()
	if len(d) != 1 || d[0].GetClass() != "batch" || d[0].GetRank() != 2 || d[0].GetQueued() != 1 || d[0].GetQueuedBytes() != 7 || d[0].GetOldestWaitMs() != 250 {
		t.Fatalf("depths %v", d)
	}
	cancel()
	recv(t, ch, "cancelled")
}

func TestResolve(t *testing.T) {
	r := newRig(t, nil)
	cases := []struct {
		header, def, max string
		want             string
		bad              bool
	}{
		{"", "", "", "standard", false},
		{"", "batch", "", "batch", false},
		{"interactive", "", "", "standard", false},                       // no maximum: not above the default
		{"interactive", "standard", "interactive", "interactive", false}, // up to the maximum
		{"batch", "interactive", "interactive", "batch", false},          // lowering is always allowed
		{"", "interactive", "standard", "standard", false},               // a default above the maximum is clamped
		{"", "gold", "", "standard", false},                              // a class the routers do not configure
		{" Batch ", "", "", "batch", false},
		{"urgent", "", "", "", true},
	}
	for _, tc := range cases {
		rank, err := r.c.Resolve(tc.header, tc.def, tc.max)
		if tc.bad {
			if err == nil || err.Status != 400 || err.Param != "x-llmgw-priority" {
				t.Errorf("Resolve(%q, %q, %q) = %d, %v; want 400", tc.header, tc.def, tc.max, rank, err)
			}
			continue
		}
		if err != nil || r.c.Class(rank) != tc.want {
			t.Errorf("Resolve(%q, %q, %q) = %d (%v); want %s", tc.header, tc.def, tc.max, rank, err, tc.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"default", func(*Config) {}, ""},
		{"name only", func(c *Config) { c.Classes = []Class{{Name: "only"}}; c.DefaultClass = "only" }, ""},
		{"negative concurrency", func(c *Config) { c.ReplicaConcurrency = -1 }, "flow.replica_concurrency"},
		{"no classes", func(c *Config) { c.Classes = nil }, "flow.classes"},
		{"bad name", func(c *Config) { c.Classes[0].Name = "Gold" }, "flow.classes[0]: name"},
		{"twice", func(c *Config) { c.Classes[1].Name = "interactive" }, "listed twice"},
		{"headroom order", func(c *Config) { c.Classes[2].Headroom = 0.01 }, "flow.classes[2]: headroom"},
		{"default unknown", func(c *Config) { c.DefaultClass = "gold" }, "flow.default_class"},
		{"kv", func(c *Config) { c.KVCeiling = 0 }, "flow.kv_ceiling"},
		{"max waiting", func(c *Config) { c.MaxWaiting = 0 }, "flow.max_waiting"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.mod(&c)
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to name %q", err, tc.want)
			}
		})
	}
}

// TestRunDispatchesAsRoomFrees: the dispatcher, running, lets a queued
// request go when a Done frees room.
func TestRunDispatchesAsRoomFrees(t *testing.T) {
	r := newRig(t, func(c *Config) { c.Tick = time.Hour }) // only the Done's wake-up can dispatch it
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	r.loads.set("m", running(9), running(10))
	first, ref := r.c.Admit(ctx, Request{Model: "m", Rank: interactive})
	if ref != nil || first == nil {
		t.Fatal(ref)
	}
	// The one slot is taken by the request just dispatched, though no
	// reading shows it yet: the next waits.
	ch := r.admitAsync(t, ctx, Request{Model: "m", Rank: interactive})
	if r.queuedIn(interactive) != 1 {
		t.Fatal("dispatched into a slot already given")
	}
	r.loads.set("m", running(8), running(10))
	first.Done(0, false)
	res := recv(t, ch, "after a Done")
	if res.g == nil || res.g.Waited < 0 {
		t.Fatalf("%+v", res)
	}
	res.g.Done(0, false)
}
