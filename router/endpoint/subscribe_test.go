package endpoint

import (
	"context"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/watch"
)

// fakeAgent is an in-test LoadService: it sends what the test pushes to
// whichever stream is open, and can end the open stream.
type fakeAgent struct {
	llmgwv1.UnimplementedLoadServiceServer
	addr       string
	push       chan *llmgwv1.LoadSnapshot
	kick       chan struct{}
	active     atomic.Int64
	subscribes atomic.Int64
}

func startFakeAgent(t *testing.T, opts ...grpc.ServerOption) *fakeAgent {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &fakeAgent{addr: ln.Addr().String(), push: make(chan *llmgwv1.LoadSnapshot, 64), kick: make(chan struct{})}
	srv := grpc.NewServer(opts...)
	llmgwv1.RegisterLoadServiceServer(srv, a)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return a
}

func (a *fakeAgent) Subscribe(_ *llmgwv1.LoadSubscribeRequest, stream llmgwv1.LoadService_SubscribeServer) error {
	a.subscribes.Add(1)
	a.active.Add(1)
	defer a.active.Add(-1)
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case <-a.kick:
			return io.ErrUnexpectedEOF
		case s := <-a.push:
			if err := stream.Send(s); err != nil {
				return err
			}
		}
	}
}

// clock is a settable clock for the registry.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// withAgent puts node n1 into st with the given LoadService address.
func withAgent(st *watch.State, addr string) *watch.State {
	st.Nodes = map[string]*llmgwv1.Node{"n1": {Id: "n1", AgentGrpcAddr: addr}}
	return st
}

func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func runRegistry(t *testing.T, cfg Config, src Source) *Registry {
	t.Helper()
	r := newTestRegistry(t, cfg, src)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

func testConfig(c *clock) Config {
	cfg := DefaultConfig()
	cfg.ScrapeInterval = 10 * time.Millisecond
	cfg.StaleAfter = time.Second
	cfg.SubscribeInitial, cfg.SubscribeMax = 10*time.Millisecond, 20*time.Millisecond
	cfg.Jitter = func() float64 { return 0 }
	cfg.Now = c.Now
	return cfg
}

const agentNow = int64(5_000_000_000_000_000_000) // the agent's clock, far from the router's

func snapshot(interval time.Duration, loads ...*llmgwv1.ReplicaLoad) *llmgwv1.LoadSnapshot {
	return &llmgwv1.LoadSnapshot{Node: "n1", UnixNano: agentNow, IntervalNanos: interval.Nanoseconds(), Replicas: loads}
}

func lookup(t *testing.T, r *Registry, id string) *Endpoint {
	t.Helper()
	eps, _ := r.Lookup("m")
	for _, e := range eps {
		if e.ReplicaID == id {
			return e
		}
	}
	t.Fatalf("no endpoint %s", id)
	return nil
}

func TestSnapshotReadingsApplied(t *testing.T) {
	agent := startFakeAgent(t)
	c := &clock{now: time.Unix(1000, 0)}
	engine := deadAddr(t) // scrapes fail: only snapshots give readings
	src := newFakeSource(withAgent(stateOf([]string{"m"},
		rep{id: "m-0", model: "m", uid: 1, sUID: 1, phase: ready, addr: engine, inc: 1},
		rep{id: "m-1", model: "m", uid: 2, sUID: 2, phase: ready, addr: engine, inc: 2},
		rep{id: "m-2", model: "m", uid: 3, sUID: 3, phase: ready, addr: engine, inc: 1},
	), agent.addr))
	r := runRegistry(t, testConfig(c), src)
	testkit.Wait(t, "subscribed", func() bool { return agent.active.Load() == 1 })

	scraped := agentNow - (20 * time.Millisecond).Nanoseconds()
	agent.push <- snapshot(50*time.Millisecond,
		&llmgwv1.ReplicaLoad{ReplicaId: "m-0", Uid: 1, Incarnation: 1, Waiting: 7, Running: 1, KvUsage: 0.5, ScrapedUnixNano: scraped},
		// An older incarnation's reading: dropped.
		&llmgwv1.ReplicaLoad{ReplicaId: "m-1", Uid: 2, Incarnation: 1, Waiting: 9, ScrapedUnixNano: scraped},
		// Listed but never read: nothing to apply.
		&llmgwv1.ReplicaLoad{ReplicaId: "m-2", Uid: 3, Incarnation: 1},
		// Not routable here: ignored.
		&llmgwv1.ReplicaLoad{ReplicaId: "x-0", Uid: 4, Incarnation: 1, Waiting: 1, ScrapedUnixNano: scraped},
	)
	m0, m1, m2 := lookup(t, r, "m-0"), lookup(t, r, "m-1"), lookup(t, r, "m-2")
	testkit.Wait(t, "m-0's reading", func() bool { return r.LoadOf(m0).Waiting == 7 })
	if l := r.LoadOf(m0); l.Saturated || l.Running != 1 || l.KVUsage != 0.5 {
		t.Fatalf("m-0 load %+v", l)
	}
	for _, e := range []*Endpoint{m1, m2} {
		if l := r.LoadOf(e); !l.Saturated || l.Waiting != 0 {
			t.Errorf("%s load %+v, want saturated with no reading", e.ReplicaID, l)
		}
	}
	if !r.covered("n1") {
		t.Error("a node streaming fresh snapshots is not covered")
	}

	// Three intervals (150 ms) from the scrape, on the agent's clock: the
	// reading was 20 ms old on arrival.
	c.advance(130 * time.Millisecond)
	if r.LoadOf(m0).Saturated {
		t.Fatal("saturated at exactly three intervals")
	}
	c.advance(time.Millisecond)
	if !r.LoadOf(m0).Saturated {
		t.Fatal("a reading older than three intervals is not saturated")
	}

	// A snapshot claiming another node is refused and counts nothing.
	bad := snapshot(50*time.Millisecond, &llmgwv1.ReplicaLoad{ReplicaId: "m-0", Uid: 1, Incarnation: 1, Waiting: 99, ScrapedUnixNano: agentNow})
	bad.Node = "n2"
	agent.push <- bad
	agent.push <- snapshot(50*time.Millisecond, &llmgwv1.ReplicaLoad{ReplicaId: "m-0", Uid: 1, Incarnation: 1, Waiting: 8, ScrapedUnixNano: agentNow})
	testkit.Wait(t, "the next good snapshot", func() bool { return r.LoadOf(m0).Waiting == 8 })
	if got := testutil.ToFloat64(r.snapshots); got != 2 {
		t.Errorf("llmgw_router_load_snapshots_total = %v, want 2", got)
	}
	if got := testutil.ToFloat64(r.subscriptions); got != 1 {
		t.Errorf("llmgw_router_load_subscriptions = %v, want 1", got)
	}
	var h dto.Metric
	if err := r.readingAge.Write(&h); err != nil || h.GetHistogram().GetSampleCount() != 2 ||
		math.Abs(h.GetHistogram().GetSampleSum()-0.02) > 1e-9 {
		t.Errorf("reading age histogram %v, %v; want the ages 20 ms and 0", h.GetHistogram(), err)
	}
}

func countingEngine(t *testing.T, hits *atomic.Int64) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.WriteString(w, vllmMetrics)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func TestFallbackToScrape(t *testing.T) {
	t.Run("node without an agent address", func(t *testing.T) {
		var hits atomic.Int64
		c := &clock{now: time.Unix(1000, 0)}
		src := newFakeSource(withAgent(stateOf([]string{"m"},
			rep{id: "m-0", model: "m", uid: 1, sUID: 1, phase: ready, addr: countingEngine(t, &hits), inc: 1}), ""))
		r := runRegistry(t, testConfig(c), src)
		m0 := lookup(t, r, "m-0")
		testkit.Wait(t, "a scraped reading", func() bool { return r.LoadOf(m0).Waiting == 2 })
		if r.LoadOf(m0).Saturated {
			t.Fatal("fresh scrape saturated")
		}
		if got := testutil.ToFloat64(r.subscriptions); got != 0 {
			t.Fatalf("%v subscriptions for a node without LoadService", got)
		}
	})
	t.Run("agent gone silent", func(t *testing.T) {
		var hits atomic.Int64
		agent := startFakeAgent(t)
		c := &clock{now: time.Unix(1000, 0)}
		src := newFakeSource(withAgent(stateOf([]string{"m"},
			rep{id: "m-0", model: "m", uid: 1, sUID: 1, phase: ready, addr: countingEngine(t, &hits), inc: 1}), agent.addr))
		r := runRegistry(t, testConfig(c), src)
		m0 := lookup(t, r, "m-0")
		// Snapshots win once they flow: the router stops scraping (a scrape
		// begun before the first snapshot may land once, so push until the
		// snapshot's value holds).
		pushed := 0
		testkit.Wait(t, "the snapshot's reading", func() bool {
			if len(agent.push) == 0 {
				agent.push <- snapshot(50*time.Millisecond, &llmgwv1.ReplicaLoad{ReplicaId: "m-0", Uid: 1, Incarnation: 1, Waiting: 7, ScrapedUnixNano: agentNow})
				pushed++
			}
			return r.LoadOf(m0).Waiting == 7 && r.covered("n1")
		})
		// The agent falls silent past the window (once everything pushed has
		// arrived): the router scrapes again.
		testkit.Wait(t, "every snapshot applied", func() bool { return testutil.ToFloat64(r.snapshots) == float64(pushed) })
		c.advance(time.Second)
		if r.covered("n1") {
			t.Fatal("a silent agent still covers its node")
		}
		testkit.Wait(t, "a scraped reading after the agent went silent", func() bool {
			l := r.LoadOf(m0)
			return l.Waiting == 2 && !l.Saturated
		})
	})
	t.Run("a replica the snapshots leave out", func(t *testing.T) {
		// An external engine its agent cannot read is in no snapshot: the
		// router scrapes it though the node is covered, or it would stay
		// saturated for ever.
		var hits0, hits1 atomic.Int64
		agent := startFakeAgent(t)
		c := &clock{now: time.Unix(1000, 0)}
		src := newFakeSource(withAgent(stateOf([]string{"m"},
			rep{id: "m-0", model: "m", uid: 1, sUID: 1, phase: ready, addr: countingEngine(t, &hits0), inc: 1},
			rep{id: "m-1", model: "m", uid: 2, sUID: 2, phase: ready, addr: countingEngine(t, &hits1), inc: 1}), agent.addr))
		r := runRegistry(t, testConfig(c), src)
		m0, m1 := lookup(t, r, "m-0"), lookup(t, r, "m-1")
		testkit.Wait(t, "m-0's reading from snapshots, m-1's from scrapes", func() bool {
			if len(agent.push) == 0 {
				agent.push <- snapshot(50*time.Millisecond, &llmgwv1.ReplicaLoad{ReplicaId: "m-0", Uid: 1, Incarnation: 1, Waiting: 7, ScrapedUnixNano: agentNow})
			}
			return r.LoadOf(m0).Waiting == 7 && r.covered("n1")
		})
		// Time passes, the snapshots keep coming and keep the node covered:
		// m-1's scraped reading ages past StaleAfter and is read again.
		start, before := c.Now(), hits1.Load()
		testkit.Wait(t, "m-1 scraped again while its node is covered", func() bool {
			c.advance(50 * time.Millisecond)
			if len(agent.push) == 0 {
				agent.push <- snapshot(50*time.Millisecond, &llmgwv1.ReplicaLoad{ReplicaId: "m-0", Uid: 1, Incarnation: 1, Waiting: 7, ScrapedUnixNano: agentNow})
			}
			l1 := r.LoadOf(m1)
			return c.Now().Sub(start) > 2*time.Second && hits1.Load() > before && r.covered("n1") && l1.Waiting == 2 && !l1.Saturated
		})
	})
}

func TestSubscriptionFollowsRoutableReplicas(t *testing.T) {
	agent := startFakeAgent(t)
	c := &clock{now: time.Unix(1000, 0)}
	engine := deadAddr(t)
	routable := rep{id: "m-0", model: "m", uid: 1, sUID: 1, phase: ready, addr: engine, inc: 1}
	src := newFakeSource(withAgent(stateOf([]string{"m"}, routable), agent.addr))
	r := runRegistry(t, testConfig(c), src)
	testkit.Wait(t, "subscribed", func() bool { return agent.active.Load() == 1 })

	// The agent ends the stream: the router subscribes again.
	agent.kick <- struct{}{}
	testkit.Wait(t, "resubscribed", func() bool { return agent.subscribes.Load() == 2 && agent.active.Load() == 1 })

	// No routable replica left on the node (draining): dropped.
	draining := routable
	draining.draining = true
	src.set(withAgent(stateOf([]string{"m"}, draining), agent.addr))
	testkit.Wait(t, "subscription dropped", func() bool { return agent.active.Load() == 0 })
	if got := testutil.ToFloat64(r.subscriptions); got != 0 {
		t.Fatalf("llmgw_router_load_subscriptions = %v after the drop", got)
	}

	// Routable again: subscribed again.
	src.set(withAgent(stateOf([]string{"m"}, routable), agent.addr))
	testkit.Wait(t, "subscribed again", func() bool { return agent.active.Load() == 1 })

	// The agent moves to another address: the old stream is dropped and
	// the new one opened.
	other := startFakeAgent(t)
	src.set(withAgent(stateOf([]string{"m"}, routable), other.addr))
	testkit.Wait(t, "moved to the new address", func() bool { return agent.active.Load() == 0 && other.active.Load() == 1 })
}

func TestSubscribeDelay(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SubscribeInitial, cfg.SubscribeMax = 100*time.Millisecond, 400*time.Millisecond
	cfg.Jitter = func() float64 { return 0.5 }
	r := &Registry{cfg: cfg}
	b := r.subscribeBackoff()
	// Nominal 100, 200, 400, 400 (capped), each drawn from [d/2, d) at 0.5.
	want := []time.Duration{75 * time.Millisecond, 150 * time.Millisecond, 300 * time.Millisecond, 300 * time.Millisecond}
	for i, w := range want {
		if got := b.Next(); got != w {
			t.Errorf("delay %d = %s, want %s", i, got, w)
		}
	}
	b.Reset()
	if got := b.Next(); got != want[0] {
		t.Errorf("after a stream that delivered: %s, want %s", got, want[0])
	}
}

func TestConfigValidateSubscribe(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"stale intervals", func(c *Config) { c.StaleIntervals = 0 }, "stale-intervals"},
		{"backoff", func(c *Config) { c.SubscribeInitial = 0 }, "subscribe backoff"},
		{"backoff order", func(c *Config) { c.SubscribeMax = time.Millisecond }, "subscribe backoff"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.edit(&c)
			if err := c.Validate(); err == nil || !strings.HasPrefix(err.Error(), tt.want+":") {
				t.Fatalf("Validate = %v, want an error naming %s", err, tt.want)
			}
		})
	}
}

// FuzzApplySnapshot feeds an agent's snapshot fields, as decoded from the
// wire, to the registry: whatever they hold, a stored reading is a load and
// not younger than now.
func FuzzApplySnapshot(f *testing.F) {
	f.Add(2.0, 3.0, 0.5, agentNow, agentNow-1000, int64(50_000_000), "n1")
	f.Add(math.NaN(), -1.0, math.Inf(1), int64(0), int64(math.MaxInt64), int64(-5), "n1")
	f.Add(1.0, 1.0, 1.0, int64(math.MinInt64), int64(math.MaxInt64), int64(math.MaxInt64), "n2")
	f.Fuzz(func(t *testing.T, waiting, running, kv float64, unix, scraped, interval int64, node string) {
		c := &clock{now: time.Unix(1000, 0)}
		st := withAgent(stateOf([]string{"m"}, rep{id: "m-0", model: "m", uid: 1, sUID: 1, phase: ready, addr: "a:1", inc: 1}), "x:1")
		r := newTestRegistry(t, testConfig(c), newFakeSource(st))
		s := &subscription{node: "n1"}
		_ = r.applySnapshot(s, &llmgwv1.LoadSnapshot{Node: node, UnixNano: unix, IntervalNanos: interval,
			Replicas: []*llmgwv1.ReplicaLoad{{ReplicaId: "m-0", Uid: 1, Incarnation: 1,
				Waiting: waiting, Running: running, KvUsage: kv, ScrapedUnixNano: scraped}}})
		rd := lookup(t, r, "m-0").reading.Load()
		if rd == nil {
			return
		}
		if !validLoad(rd.Waiting) || !validLoad(rd.Running) || !validLoad(rd.KVUsage) {
			t.Fatalf("stored an impossible reading %+v", rd.Reading)
		}
		if rd.at.After(c.Now()) || rd.staleAfter <= 0 {
			t.Fatalf("reading at %s with window %s, now %s", rd.at, rd.staleAfter, c.Now())
		}
	})
}
