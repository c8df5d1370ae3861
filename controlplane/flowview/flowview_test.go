package flowview

import (
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// clock is a fake clock the test moves by hand.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func newTable(t *testing.T, maxRouters int) (*Table, *clock, *prometheus.Registry) {
	t.Helper()
	c := &clock{now: time.Unix(1_700_000_000, 0)}
	reg := prometheus.NewRegistry()
	return New(Config{Now: c.Now, MaxRouters: maxRouters}, reg), c, reg
}

// d is a queue as a router reports it.
func d(model, class string, rank uint32, queued, bytes uint64, waitMs int64) *llmgwv1.FlowDepth {
	return &llmgwv1.FlowDepth{Model: model, Class: class, Rank: rank, Queued: queued, QueuedBytes: bytes, OldestWaitMs: waitMs}
}

// sum is a queue as a view sums it.
func sum(model, class string, rank uint32, queued, bytes uint64, waitMs int64, routers uint32) *llmgwv1.FlowDepth {
	s := d(model, class, rank, queued, bytes, waitMs)
	s.Routers = routers
	return s
}

func report(router string, session uint64, ds ...*llmgwv1.FlowDepth) *llmgwv1.FlowReport {
	return &llmgwv1.FlowReport{Router: router, Session: session, Depths: ds}
}

func wantDepths(t *testing.T, what string, got, want []*llmgwv1.FlowDepth) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %v, want %v", what, got, want)
	}
	for i := range got {
		if !proto.Equal(got[i], want[i]) {
			t.Fatalf("%s[%d]: %v, want %v\nall: %v", what, i, got[i], want[i], got)
		}
	}
}

func mustReport(t *testing.T, tb *Table, r *llmgwv1.FlowReport) *llmgwv1.FlowView {
	t.Helper()
	v, err := tb.Report(r)
	if err != nil {
		t.Fatalf("report of %s: %v", r.Router, err)
	}
	return v
}

// TestView: a router is answered every other router's queues summed per
// model and class — queued and bytes added, the longest wait, the highest
// rank where the reports differ, how many routers reported each — never
// its own, sorted by model, rank, class; the view says how long it holds.
func TestView(t *testing.T) {
	tb, _, _ := newTable(t, 0)
	mustReport(t, tb, report("r1", 1, d("m", "interactive", 0, 5, 500, 40), d("m", "batch", 2, 7, 700, 900)))
	mustReport(t, tb, report("r2", 2, d("m", "batch", 2, 3, 300, 1200), d("n", "batch", 1, 1, 10, 5)))
	v := mustReport(t, tb, report("r3", 3, d("m", "interactive", 1, 2, 200, 80), d("m", "batch", 2, 100, 1, 1)))
	if v.ValidMs != 3000 {
		t.Fatalf("valid_ms %d, want 3000", v.ValidMs)
	}
	tests := []struct {
		router string
		want   []*llmgwv1.FlowDepth
	}{
		{"r3", []*llmgwv1.FlowDepth{sum("m", "interactive", 0, 5, 500, 40, 1), sum("m", "batch", 2, 10, 1000, 1200, 2), sum("n", "batch", 1, 1, 10, 5, 1)}},
		{"r1", []*llmgwv1.FlowDepth{sum("m", "interactive", 1, 2, 200, 80, 1), sum("m", "batch", 2, 103, 301, 1200, 2), sum("n", "batch", 1, 1, 10, 5, 1)}},
		{"r2", []*llmgwv1.FlowDepth{sum("m", "interactive", 0, 7, 700, 80, 2), sum("m", "batch", 2, 107, 701, 900, 2)}},
		{"a router that never reported", []*llmgwv1.FlowDepth{sum("m", "interactive", 0, 7, 700, 80, 2), sum("m", "batch", 2, 110, 1001, 1200, 3), sum("n", "batch", 1, 1, 10, 5, 1)}},
	}
	for _, tt := range tests {
		t.Run(tt.router, func(t *testing.T) {
			got := tb.View(tt.router)
			wantDepths(t, "view of "+tt.router, got.Depths, tt.want)
		})
	}
	wantDepths(t, "r3's answer", v.Depths, tests[0].want)
}

// TestExpiry: a report counts for Valid from when it was received, then
// drops out of every view, of the status and of the routers gauge; a
// router reporting again counts again.
func TestExpiry(t *testing.T) {
	tb, c, reg := newTable(t, 0)
	mustReport(t, tb, report("r1", 1, d("m", "c", 0, 1, 1, 1)))
	c.Advance(time.Second)
	mustReport(t, tb, report("r2", 2, d("m", "c", 0, 2, 2, 2)))
	steps := []struct {
		advance time.Duration
		routers float64
		r3sees  uint64 // queued of (m, c) in a view of r3
	}{
		{0, 2, 3},
		{2*time.Second - time.Millisecond, 2, 3}, // r1's report 1 ms before its end
		{time.Millisecond, 1, 2},                 // r1's ended
		{time.Second - time.Millisecond, 1, 2},
		{time.Millisecond, 0, 0}, // r2's too
	}
	for i, s := range steps {
		c.Advance(s.advance)
		if got := testkit.Metric(t, reg, "llmgw_control_flow_routers", nil); got != s.routers {
			t.Fatalf("step %d: routers gauge %v, want %v", i, got, s.routers)
		}
		var queued uint64
		for _, x := range tb.View("r3").Depths {
			queued += x.Queued
		}
		if queued != s.r3sees {
			t.Fatalf("step %d: r3 sees %d queued, want %d", i, queued, s.r3sees)
		}
		if n := len(tb.Status().Routers); float64(n) != s.routers {
			t.Fatalf("step %d: status has %d routers, want %v", i, n, s.routers)
		}
	}
	mustReport(t, tb, report("r1", 1, d("m", "c", 0, 1, 1, 1)))
	if got := tb.Live(); got != 1 {
		t.Fatalf("after r1 reported again: %d live", got)
	}
}

// TestReplace: a report replaces its router's previous one whole — queues
// it no longer reports are gone — and a new session of the router (a
// restart) replaces the old session's at once rather than counting beside
// it.
func TestReplace(t *testing.T) {
	tb, _, _ := newTable(t, 0)
	mustReport(t, tb, report("r1", 1, d("m", "a", 0, 5, 5, 5), d("m", "b", 1, 1, 1, 1)))
	mustReport(t, tb, report("r1", 1, d("m", "b", 1, 2, 2, 2)))
	wantDepths(t, "after the second report", tb.View("x").Depths, []*llmgwv1.FlowDepth{sum("m", "b", 1, 2, 2, 2, 1)})
	mustReport(t, tb, report("r1", 99, d("m", "a", 0, 4, 4, 4)))
	wantDepths(t, "after a new session", tb.View("x").Depths, []*llmgwv1.FlowDepth{sum("m", "a", 0, 4, 4, 4, 1)})
	mustReport(t, tb, report("r1", 99))
	if v := tb.View("x"); len(v.Depths) != 0 {
		t.Fatalf("after an empty report: %v", v.Depths)
	}
	if tb.Live() != 1 {
		t.Fatal("a router reporting no queue is still a live reporter")
	}
}

// TestNormalize: a report's empty queues are dropped, a queue reported
// twice is merged (and counts as one router), a negative wait is 0, and
// sums saturate rather than wrap.
func TestNormalize(t *testing.T) {
	tb, _, _ := newTable(t, 0)
	mustReport(t, tb, report("r1", 1, d("m", "a", 3, 2, 10, -5), d("m", "empty", 0, 0, 99, 99), d("m", "a", 1, 3, 20, 7)))
	mustReport(t, tb, report("r2", 1, d("m", "a", 1, math.MaxUint64, math.MaxUint64, 1)))
	st := tb.Status()
	wantDepths(t, "r1 as held", st.Routers[0].Depths, []*llmgwv1.FlowDepth{d("m", "a", 1, 5, 30, 7)})
	wantDepths(t, "total", st.Total, []*llmgwv1.FlowDepth{sum("m", "a", 1, math.MaxUint64, math.MaxUint64, 7, 2)})
}

// TestBounds: a report outside the bounds is refused naming the field,
// counted, and changes nothing.
func TestBounds(t *testing.T) {
	long := strings.Repeat("x", MaxNameLen+1)
	many := make([]*llmgwv1.FlowDepth, MaxDepths+1)
	for i := range many {
		many[i] = d("m", "c", 0, 1, 1, 1)
	}
	tests := []struct {
		name string
		r    *llmgwv1.FlowReport
		want string
	}{
		{"no router", report("", 1), "router: 1 to 256 bytes, got 0"},
		{"a long router name", report(long, 1), "router: 1 to 256 bytes, got 257"},
		{"no session", report("r1", 0), "session: required"},
		{"too many queues", report("r1", 1, many...), "depths: at most 4096, got 4097"},
		{"a long model name", report("r1", 1, d("m", "c", 0, 1, 1, 1), d(long, "c", 0, 1, 1, 1)), "depths[1].model: at most 256 bytes, got 257"},
		{"a long class name", report("r1", 1, d("m", long, 0, 1, 1, 1)), "depths[0].class: at most 256 bytes, got 257"},
		{"a nil queue", report("r1", 1, nil), "depths[0]: required"},
	}
	tb, _, reg := newTable(t, 0)
	mustReport(t, tb, report("r1", 1, d("m", "c", 0, 1, 1, 1)))
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tb.Report(tt.r)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("%v, want ErrInvalid with %q", err, tt.want)
			}
			if got := testkit.Metric(t, reg, "llmgw_control_flow_reports_total", testkit.Labels{"result": "invalid"}); got != float64(i+1) {
				t.Fatalf("invalid reports counted %v, want %d", got, i+1)
			}
			wantDepths(t, "the table", tb.View("x").Depths, []*llmgwv1.FlowDepth{sum("m", "c", 0, 1, 1, 1, 1)})
		})
	}
	// Exactly at the bounds: accepted.
	at := make([]*llmgwv1.FlowDepth, MaxDepths)
	for i := range at {
		at[i] = d(strings.Repeat("m", MaxNameLen), strings.Repeat("c", MaxNameLen), 0, 1, 1, 1)
	}
	mustReport(t, tb, report(strings.Repeat("r", MaxNameLen), 1, at...))
}

// TestFull: the table holds at most MaxRouters routers; one more is
// refused and kept nowhere, while the routers held go on reporting; once
// one has expired there is room again.
func TestFull(t *testing.T) {
	tb, c, reg := newTable(t, 2)
	mustReport(t, tb, report("r1", 1, d("m", "c", 0, 1, 1, 1)))
	c.Advance(time.Second)
	mustReport(t, tb, report("r2", 1, d("m", "c", 0, 2, 2, 2)))
	if _, err := tb.Report(report("r3", 1, d("m", "c", 0, 4, 4, 4))); !errors.Is(err, ErrFull) || !strings.Contains(err.Error(), "r3") {
		t.Fatalf("a third router: %v, want ErrFull naming it", err)
	}
	if got := testkit.Metric(t, reg, "llmgw_control_flow_reports_total", testkit.Labels{"result": "full"}); got != 1 {
		t.Fatalf("full counted %v", got)
	}
	wantDepths(t, "after the refusal", tb.View("x").Depths, []*llmgwv1.FlowDepth{sum("m", "c", 0, 3, 3, 2, 2)})
	mustReport(t, tb, report("r2", 1, d("m", "c", 0, 2, 2, 2))) // a router held reports again
	c.Advance(2 * time.Second)                                  // r1's report has expired
	v := mustReport(t, tb, report("r3", 1, d("m", "c", 0, 4, 4, 4)))
	wantDepths(t, "r3's view", v.Depths, []*llmgwv1.FlowDepth{sum("m", "c", 0, 2, 2, 2, 1)})
	if got := testkit.Metric(t, reg, "llmgw_control_flow_reports_total", testkit.Labels{"result": "accepted"}); got != 4 {
		t.Fatalf("accepted counted %v, want 4", got)
	}
}

// TestStatus: the status lists each live router's queues as held, sorted
// by router, with when its report was received, and their sum over every
// router; Reset forgets them all.
func TestStatus(t *testing.T) {
	tb, c, _ := newTable(t, 0)
	mustReport(t, tb, report("r2", 1, d("m", "b", 1, 1, 1, 1)))
	c.Advance(250 * time.Millisecond)
	mustReport(t, tb, report("r1", 1, d("m", "b", 1, 2, 2, 9), d("m", "a", 0, 3, 3, 3)))
	st := tb.Status()
	if len(st.Routers) != 2 || st.Routers[0].Router != "r1" || st.Routers[1].Router != "r2" {
		t.Fatalf("routers %v, want r1 then r2", st.Routers)
	}
	if got, want := st.Routers[0].ReportedUnixMs, c.Now().UnixMilli(); got != want {
		t.Fatalf("r1 reported at %d, want %d", got, want)
	}
	if got, want := st.Routers[1].ReportedUnixMs, c.Now().Add(-250*time.Millisecond).UnixMilli(); got != want {
		t.Fatalf("r2 reported at %d, want %d", got, want)
	}
	wantDepths(t, "r1's queues", st.Routers[0].Depths, []*llmgwv1.FlowDepth{d("m", "a", 0, 3, 3, 3), d("m", "b", 1, 2, 2, 9)})
	wantDepths(t, "total", st.Total, []*llmgwv1.FlowDepth{sum("m", "a", 0, 3, 3, 3, 1), sum("m", "b", 1, 3, 3, 9, 2)})
	// The status is a copy: changing it changes nothing held.
	st.Routers[0].Depths[0].Queued = 1000
	if got := tb.Status().Routers[0].Depths[0].Queued; got != 3 {
		t.Fatalf("the status shares the table's queues: %d", got)
	}
	tb.Reset()
	if st := tb.Status(); len(st.Routers) != 0 || len(st.Total) != 0 {
		t.Fatalf("after Reset: %v", st)
	}
}

// TestConcurrent: reports, views and the status from many goroutines at
// once (for the race detector).
func TestConcurrent(t *testing.T) {
	tb, c, _ := newTable(t, 0)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			name := string(rune('a' + i))
			for j := range 200 {
				if _, err := tb.Report(report(name, 1, d("m", "c", 0, uint64(j+1), 1, 1))); err != nil {
					t.Error(err)
					return
				}
				tb.View(name)
				tb.Status()
				if i == 0 {
					c.Advance(time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	if got := tb.Live(); got != 8 {
		t.Fatalf("%d live, want 8", got)
	}
}

// TestDemand: held, sent and TTFT counts are each router's own and add up;
// the engines' readings are the same engines seen twice and take the
// larger; a report that lapses drops out; a bad demand is refused whole.
func TestDemand(t *testing.T) {
	tb, clk, _ := newTable(t, 0)
	r1 := report("r1", 1)
	r1.Demand = []*llmgwv1.ModelDemand{{Model: "chat", Held: 3, Waiting: 4, Running: 10, KvUsageSum: 1.5, Replicas: 2, TtftBuckets: []uint64{1, 2}, Requests: 7}}
	r2 := report("r2", 2)
	r2.Demand = []*llmgwv1.ModelDemand{
		{Model: "chat", Held: 1, Waiting: 5, Running: 9, KvUsageSum: 1.2, Replicas: 1, TtftBuckets: []uint64{0, 1, 4}, Requests: 2},
		{Model: "embed", Requests: 1},
	}
	mustReport(t, tb, r1)
	clk.Advance(2 * time.Second)
	mustReport(t, tb, r2)
	want := map[string]*llmgwv1.ModelDemand{
		"chat":  {Model: "chat", Held: 4, Waiting: 5, Running: 10, KvUsageSum: 1.5, Replicas: 2, TtftBuckets: []uint64{1, 3, 4}, Requests: 9},
		"embed": {Model: "embed", Requests: 1},
	}
	got := tb.Demand()
	if len(got) != len(want) {
		t.Fatalf("demand %v, want %v", got, want)
	}
	for m, w := range want {
		if !proto.Equal(got[m], w) {
			t.Errorf("demand of %s: %v, want %v", m, got[m], w)
		}
	}
	clk.Advance(1500 * time.Millisecond) // r1's report is 3.5 s old
	if got := tb.Demand()["chat"]; got.GetHeld() != 1 || got.GetReplicas() != 1 {
		t.Fatalf("after r1's report lapsed: %v, want r2's alone", got)
	}
	for _, bad := range []*llmgwv1.ModelDemand{
		{Model: ""},
		{Model: "chat", Waiting: math.NaN()},
		{Model: "chat", Running: -1},
		{Model: "chat", KvUsageSum: math.Inf(1)},
		{Model: "chat", TtftBuckets: make([]uint64, MaxTTFTBuckets+1)},
	} {
		r := report("r3", 3)
		r.Demand = []*llmgwv1.ModelDemand{bad}
		if _, err := tb.Report(r); !errors.Is(err, ErrInvalid) {
			t.Errorf("demand %v: err %v, want ErrInvalid", bad, err)
		}
	}
	if _, ok := tb.Demand()["chat"]; !ok || tb.Live() != 1 {
		t.Fatal("a refused report changed the table")
	}
}
