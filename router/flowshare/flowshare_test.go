package flowshare

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// queues is the router's flow control: fixed depths, and the fleet it
// was last handed.
type queues struct {
	mu     sync.Mutex
	depths []*llmgwv1.FlowDepth
	fleet  []*llmgwv1.FlowDepth
	until  time.Time
	sets   int
	ticks  int // calls of Depths: one a tick
}

func (q *queues) Depths() []*llmgwv1.FlowDepth {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.ticks++
	return q.depths
}

func (q *queues) tickCount() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.ticks
}

func (q *queues) SetFleet(d []*llmgwv1.FlowDepth, until time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.fleet, q.until = d, until
	q.sets++
}

func (q *queues) setDepths(d []*llmgwv1.FlowDepth) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.depths = d
}

func (q *queues) got() ([]*llmgwv1.FlowDepth, time.Time, int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.fleet, q.until, q.sets
}

// reporter is the control plane: it keeps the reports and answers view,
// or fails with err, or (block) waits for the call's end.
type reporter struct {
	mu      sync.Mutex
	reports []*llmgwv1.FlowReport
	view    *llmgwv1.FlowView
	err     error
	block   bool
}

func (r *reporter) ReportFlow(ctx context.Context, req *llmgwv1.FlowReport) (*llmgwv1.FlowView, error) {
	r.mu.Lock()
	r.reports = append(r.reports, proto.Clone(req).(*llmgwv1.FlowReport))
	view, err, block := r.view, r.err, r.block
	r.mu.Unlock()
	if block {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return view, err
}

func (r *reporter) set(f func(*reporter)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f(r)
}

func (r *reporter) sent() []*llmgwv1.FlowReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*llmgwv1.FlowReport(nil), r.reports...)
}

// run starts the loop and returns its stop, which waits for Run to
// return.
func run(t *testing.T, s *Share) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	return func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return within 10 s of its context's end")
		}
	}
}

func depth(model, class string, queued uint64) *llmgwv1.FlowDepth {
	return &llmgwv1.FlowDepth{Model: model, Class: class, Queued: queued}
}

var now = time.Unix(1_700_000_000, 0)

func newShare(q Queues, r Reporter, reg prometheus.Registerer, timeout time.Duration) *Share {
	return New(Config{Router: "r1", Interval: 5 * time.Millisecond, Timeout: timeout, Now: func() time.Time { return now }, Flow: true}, q, nil, r, reg, nil)
}

// TestReports: the loop reports at once and then every interval, under
// the router's name and one non-zero session, with the queues it has at
// each tick — none too: an emptied router says so — and hands each
// answer's queues to the flow control, valid for the answer's valid_ms
// from when the report was sent (3 s when it does not say).
func TestReports(t *testing.T) {
	q := &queues{depths: []*llmgwv1.FlowDepth{depth("m", "batch", 4)}}
	fleet := []*llmgwv1.FlowDepth{{Model: "m", Class: "interactive", Queued: 9, Routers: 2}}
	r := &reporter{view: &llmgwv1.FlowView{Depths: fleet, ValidMs: 2000}}
	s := newShare(q, r, nil, time.Second)
	stop := run(t, s)
	defer stop()

	testkit.Wait(t, "three reports", func() bool { return len(r.sent()) >= 3 })
	for i, rep := range r.sent() {
		if rep.Router != "r1" || rep.Session == 0 || rep.Session != s.Session() || len(rep.Depths) != 1 || rep.Depths[0].Queued != 4 {
			t.Fatalf("report %d: %v", i, rep)
		}
	}
	got, until, _ := q.got()
	if len(got) != 1 || !proto.Equal(got[0], fleet[0]) || !until.Equal(now.Add(2*time.Second)) {
		t.Fatalf("fleet %v until %v; want the answer's queues until %v", got, until, now.Add(2*time.Second))
	}

	q.setDepths(nil)
	r.set(func(r *reporter) { r.view = &llmgwv1.FlowView{} })
	testkit.Wait(t, "an empty report, and a view valid 3 s", func() bool {
		sent := r.sent()
		fleet, until, _ := q.got()
		return len(sent[len(sent)-1].Depths) == 0 && len(fleet) == 0 && until.Equal(now.Add(DefaultValid))
	})
}

// TestIdleReportsLessOften: with nothing queued here or elsewhere the
// loop reports every idleEvery-th tick; a queue here, or one elsewhere in
// the last answer, brings back a report every tick.
func TestIdleReportsLessOften(t *testing.T) {
	q := &queues{}
	r := &reporter{view: &llmgwv1.FlowView{}}
	stop := run(t, newShare(q, r, nil, time.Second))
	defer stop()
	testkit.Wait(t, "9 idle reports", func() bool { return len(r.sent()) >= 9 })
	if ticks, sent := q.tickCount(), len(r.sent()); ticks < (sent-1)*idleEvery {
		t.Fatalf("%d reports in %d ticks while idle, want one every %d", sent, ticks, idleEvery)
	}
	q.setDepths([]*llmgwv1.FlowDepth{depth("m", "batch", 1)})
	testkit.Wait(t, "a report every tick while queued", func() bool {
		t0, s0 := q.tickCount(), len(r.sent())
		time.Sleep(50 * time.Millisecond)
		return len(r.sent())-s0 >= q.tickCount()-t0-1 && q.tickCount()-t0 >= 4
	})
}

// TestFailures: a report that fails, or that the control plane does not
// answer within the timeout, is counted and hands nothing to the flow
// control (what it holds expires on its own), and the loop goes on: once
// the control plane answers again, so does the fleet view.
func TestFailures(t *testing.T) {
	tests := []struct {
		name string
		fail func(*reporter)
	}{
		{"an error", func(r *reporter) { r.err = errors.New("unavailable: no leader") }},
		{"no answer within the timeout", func(r *reporter) { r.block = true }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := &queues{}
			r := &reporter{view: &llmgwv1.FlowView{ValidMs: 3000}}
			tt.fail(r)
			reg := prometheus.NewRegistry()
			s := newShare(q, r, reg, 20*time.Millisecond)
			stop := run(t, s)
			defer stop()
			testkit.Wait(t, "three failed reports counted", func() bool {
				v, _, err := testkit.Gathered(reg, "llmgw_router_flow_reports_failed_total", nil)
				return err == nil && v >= 3
			})
			if _, _, sets := q.got(); sets != 0 {
				t.Fatalf("a failed report handed the flow control a fleet (%d times)", sets)
			}
			r.set(func(r *reporter) { r.err, r.block = nil, false })
			testkit.Wait(t, "a fleet view once the control plane answers", func() bool {
				_, _, sets := q.got()
				return sets > 0
			})
			if n := len(r.sent()); n < 4 {
				t.Fatalf("%d reports: the loop stopped after a failure", n)
			}
		})
	}
}

// TestStop: a report in flight when the loop is stopped is cut short and
// not counted as a failure; Run returns.
func TestStop(t *testing.T) {
	q := &queues{}
	r := &reporter{block: true}
	reg := prometheus.NewRegistry()
	s := newShare(q, r, reg, time.Hour)
	stop := run(t, s)
	testkit.Wait(t, "a report in flight", func() bool { return len(r.sent()) == 1 })
	stop()
	if got := testkit.Metric(t, reg, "llmgw_router_flow_reports_failed_total", nil); got != 0 {
		t.Fatalf("%v failures counted for a report cut short by the stop", got)
	}
	if got := testkit.Metric(t, reg, "llmgw_router_flow_report_seconds", nil); got != 1 {
		t.Fatalf("report seconds observed %v times, want the one report", got)
	}
}

// TestNewDefaults: zero values take the defaults; a session is picked.
func TestNewDefaults(t *testing.T) {
	s := New(Config{Router: "r1"}, &queues{}, nil, &reporter{}, nil, nil)
	if s.cfg.Interval != DefaultInterval || s.cfg.Timeout != DefaultTimeout || s.Session() == 0 {
		t.Fatalf("config %+v", s.cfg)
	}
	if s2 := New(Config{Router: "r1"}, &queues{}, nil, &reporter{}, nil, nil); s2.Session() == s.Session() {
		t.Fatal("two runs share a session")
	}
}

// demand is the router's demand: fixed, and counting its calls.
type demand struct {
	mu     sync.Mutex
	d      []*llmgwv1.ModelDemand
	depths []*llmgwv1.FlowDepth // what the last call was given
}

func (d *demand) Demand(depths []*llmgwv1.FlowDepth) []*llmgwv1.ModelDemand {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.depths = depths
	return d.d
}

func (d *demand) set(md []*llmgwv1.ModelDemand) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.d = md
}

// TestDemand: the report carries the demand, computed with the queues of
// the same tick; with flow control off, the loop reports only while a
// model is autoscaled, at the idle cadence while nothing is held, and
// every tick while a request is held; more than MaxDemands are cut.
func TestDemand(t *testing.T) {
	q := &queues{}
	d := &demand{}
	r := &reporter{view: &llmgwv1.FlowView{Depths: []*llmgwv1.FlowDepth{depth("m", "batch", 1)}}}
	s := New(Config{Router: "r1", Interval: 5 * time.Millisecond, Timeout: time.Second}, q, d, r, nil, nil)
	stop := run(t, s)
	defer stop()

	testkit.Wait(t, "ticks without a report", func() bool { return q.tickCount() >= 5 })
	if n := len(r.sent()); n != 0 {
		t.Fatalf("%d reports with flow control off and no autoscaled model", n)
	}

	// Idle demand: every idleEvery-th tick, though the fleet has queues
	// (this router's flow control is off: they are not its business).
	d.set([]*llmgwv1.ModelDemand{{Model: "m", Replicas: 1}})
	testkit.Wait(t, "a report with the demand", func() bool { return len(r.sent()) >= 1 })
	t0, s0 := q.tickCount(), len(r.sent())
	testkit.Wait(t, "4 idle reports", func() bool { return len(r.sent()) >= s0+4 })
	if ticks, sent := q.tickCount()-t0, len(r.sent())-s0; ticks < (sent-1)*idleEvery {
		t.Fatalf("%d reports in %d ticks while idle, want one every %d", sent, ticks, idleEvery)
	}
	if rep := r.sent()[0]; len(rep.Demand) != 1 || rep.Demand[0].Model != "m" || rep.Demand[0].Replicas != 1 {
		t.Fatalf("report %v, want the demand", rep)
	}

	// Held: every tick.
	d.set([]*llmgwv1.ModelDemand{{Model: "m", Held: 3}})
	testkit.Wait(t, "a report every tick while held", func() bool {
		t0, s0 := q.tickCount(), len(r.sent())
		time.Sleep(50 * time.Millisecond)
		return len(r.sent())-s0 >= q.tickCount()-t0-1 && q.tickCount()-t0 >= 4
	})

	// The queues of the tick are handed to the demand.
	q.setDepths([]*llmgwv1.FlowDepth{depth("m", "batch", 2)})
	testkit.Wait(t, "the demand given the tick's queues", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return len(d.depths) == 1 && d.depths[0].Queued == 2
	})

	many := make([]*llmgwv1.ModelDemand, MaxDemands+5)
	for i := range many {
		many[i] = &llmgwv1.ModelDemand{Model: "m"}
	}
	d.set(many)
	testkit.Wait(t, "a report cut to MaxDemands", func() bool {
		sent := r.sent()
		return len(sent[len(sent)-1].Demand) == MaxDemands
	})
}
