package director

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/endpoint"
)

// fakeReporter keeps every report; the first fail of them fail. With
// gate set, each answer waits for a value from it (or the call's end).
type fakeReporter struct {
	gate    chan struct{}
	mu      sync.Mutex
	reports []*llmgwv1.AdapterUseReport
	fail    int
	tries   int
}

func (f *fakeReporter) ReportAdapterUse(ctx context.Context, r *llmgwv1.AdapterUseReport) (*llmgwv1.AdapterUseReportResponse, error) {
	if f.gate != nil {
		select {
		case <-f.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tries++
	if f.fail > 0 {
		f.fail--
		return nil, errors.New("control plane unreachable")
	}
	f.reports = append(f.reports, r)
	return &llmgwv1.AdapterUseReportResponse{KeepMs: 3000, MinIdleMs: 2000}, nil
}

// last is the newest report, nil before any.
func (f *fakeReporter) last() *llmgwv1.AdapterUseReport {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reports) == 0 {
		return nil
	}
	return f.reports[len(f.reports)-1]
}

func (f *fakeReporter) count() (reports, tries int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.reports), f.tries
}

// inFlightNow is the newest report's uses as "adapter/replica" -> active.
func (f *fakeReporter) inFlightNow() map[string]uint32 {
	out := map[string]uint32{}
	for _, u := range f.last().GetUses() {
		out[u.GetAdapter()+"/"+u.GetReplicaId()] = u.GetActive()
	}
	return out
}

func (f *fakeReporter) waitFor(t *testing.T, what string, want map[string]uint32) {
	t.Helper()
	testkit.Wait(t, what, func() bool {
		got := f.inFlightNow()
		if len(got) != len(want) {
			return false
		}
		for k, v := range want {
			if got[k] != v {
				return false
			}
		}
		return true
	})
}

// TestAdapterUseCounted (issue 27): each attempt of an adapter request
// counts as the adapter's use of its replica, from Next until the next
// attempt, Done, or the request's context ending without Done (a client
// gone), and the reports say so; a base-model request counts nothing.
func TestAdapterUseCounted(t *testing.T) {
	tb := baseTable()
	tb.held = map[string]string{"r0": "sql", "r1": "sql"}
	rep := &fakeReporter{}
	reg := prometheus.NewRegistry()
	d := New(tb, &sched{}, noBreakers{}, reg, WithAdapterUse(rep, "router-1", discard))
	defer d.Close()
	prepare := func(ctx context.Context, name string) *Plan {
		t.Helper()
		tgt, aerr := d.Resolve(ctx, name, discard)
		if aerr != nil {
			t.Fatal(aerr)
		}
		pl, aerr := d.Prepare(ctx, tgt, Input{Body: []byte(`{}`)})
		if aerr != nil {
			t.Fatal(aerr)
		}
		return pl
	}

	pl := prepare(context.Background(), "sql")
	first, _ := pl.Next(nil)
	rep.waitFor(t, "sql on r0 in flight", map[string]uint32{"sql/r0": 1})
	if got := testkit.Metric(t, reg, "llmgw_router_adapter_inflight_requests", nil); got != 1 {
		t.Errorf("in flight %v, want 1", got)
	}
	pl.Next([]*endpoint.Endpoint{first}) // the first attempt failed
	rep.waitFor(t, "sql moved to r1", map[string]uint32{"sql/r0": 0, "sql/r1": 1})
	pl.Done("r1", 200)
	rep.waitFor(t, "sql done", map[string]uint32{"sql/r0": 0, "sql/r1": 0})
	for _, u := range rep.last().GetUses() {
		if u.GetLastActiveUnixNano() == 0 || u.GetUid() != 1 || u.GetIncarnation() != 1 {
			t.Errorf("use %v: want its last use and the replica's uid and incarnation", u)
		}
	}

	// The client goes away: the request ends without Done.
	ctx, cancel := context.WithCancel(context.Background())
	pl = prepare(ctx, "sql")
	pl.Next(nil)
	rep.waitFor(t, "sql on r0 again", map[string]uint32{"sql/r0": 1, "sql/r1": 0})
	cancel()
	rep.waitFor(t, "released at the context's end", map[string]uint32{"sql/r0": 0, "sql/r1": 0})

	// A base-model request: nothing counted.
	pl = prepare(context.Background(), "base")
	pl.Next(nil)
	pl.Done("r0", 200)
	if got := testkit.Metric(t, reg, "llmgw_router_adapter_inflight_requests", nil); got != 0 {
		t.Errorf("in flight %v after every request ended, want 0", got)
	}
	r := rep.last()
	if r.GetRouter() != "router-1" || r.GetSession() == 0 || r.GetSeq() < 3 || r.GetSentUnixNano() == 0 {
		t.Errorf("report %v: want the router, a session, rising seq and the send time", r)
	}
}

// TestAdapterUseReportPace: once a router has counted a request, its
// reports go out every second while a model loads adapters on demand —
// the leader keeps one 3 s — and none before; a failed report is sent
// again soon, not at the next second.
func TestAdapterUseReportPace(t *testing.T) {
	t.Run("keepalive", func(t *testing.T) {
		tb := baseTable()
		tb.held = map[string]string{"r0": "sql"}
		tb.models[0].MaxLoadedAdapters = 1
		tb.models[0].Adapters = []*llmgwv1.Adapter{{Name: "sql"}}
		rep := &fakeReporter{}
		d := New(tb, &sched{}, noBreakers{}, nil, WithAdapterUse(rep, "r", discard))
		defer d.Close()
		time.Sleep(useKeepalive + useKeepalive/2) // pacing: a check that nothing happens
		if n, tries := rep.count(); tries != 0 {
			t.Errorf("%d reports (%d tries) before any request", n, tries)
		}
		tgt, _ := d.Resolve(context.Background(), "sql", discard)
		pl, _ := d.Prepare(context.Background(), tgt, Input{Body: []byte(`{}`)})
		pl.Next(nil)
		pl.Done("r0", 200)
		rep.waitFor(t, "the use reported", map[string]uint32{"sql/r0": 0})
		n, _ := rep.count()
		testkit.Wait(t, "two keepalives", func() bool { m, _ := rep.count(); return m >= n+2 })
	})
	t.Run("retried after a failure", func(t *testing.T) {
		tb := baseTable()
		tb.held = map[string]string{"r0": "sql"}
		rep := &fakeReporter{fail: 2}
		d := New(tb, &sched{}, noBreakers{}, nil, WithAdapterUse(rep, "r", discard))
		defer d.Close()
		tgt, _ := d.Resolve(context.Background(), "sql", discard)
		pl, _ := d.Prepare(context.Background(), tgt, Input{Body: []byte(`{}`)})
		start := time.Now()
		pl.Next(nil)
		rep.waitFor(t, "the use reported despite two failures", map[string]uint32{"sql/r0": 1})
		if took := time.Since(start); took >= useKeepalive {
			t.Errorf("reported %v after the change, want the failures retried sooner than the keepalive", took)
		}
		pl.Done("r0", 200)
	})
}

// TestAdapterUseSnapshot: a report forgets uses idle for useRetain, and
// past maxReportUses keeps those in flight, then the most recent.
func TestAdapterUseSnapshot(t *testing.T) {
	now := time.Unix(10_000, 0)
	u := &adapterUse{uses: map[useKey]*useCount{}, now: func() time.Time { return now }}
	key := func(i int) useKey { return useKey{adapter: fmt.Sprint("a", i), rep: Key(ep("r0"))} }
	u.uses[key(-1)] = &useCount{last: now.Add(-useRetain)} // forgotten
	for i := range maxReportUses + 10 {
		u.uses[key(i)] = &useCount{last: now.Add(-time.Duration(i) * time.Millisecond)}
	}
	u.uses[key(maxReportUses+5)].n = 2 // old, but in flight
	got := u.snapshot(now, 1)
	if len(got) != maxReportUses {
		t.Fatalf("%d uses, want %d", len(got), maxReportUses)
	}
	names := map[string]*llmgwv1.AdapterStatus{}
	for _, s := range got {
		names[s.GetAdapter()] = s
	}
	if s := names[fmt.Sprint("a", maxReportUses+5)]; s.GetActive() != 2 || s.GetLastActiveUnixNano() != now.UnixNano() {
		t.Errorf("the use in flight: %v, want kept with active 2, used now", s)
	}
	for _, gone := range []int{-1, maxReportUses - 1, maxReportUses + 9} {
		if _, ok := names[fmt.Sprint("a", gone)]; ok {
			t.Errorf("a%d kept", gone)
		}
	}
	if _, ok := u.uses[key(-1)]; ok {
		t.Error("a use idle for useRetain is still held")
	}
}

// TestChooseOnlyHolders (issue 27): an attempt goes only to a replica the
// table still shows holding the adapter — one the control plane evicted it
// from since Resolve is passed over — and, when none holds it any more, to
// the replicas Resolve found.
func TestChooseOnlyHolders(t *testing.T) {
	tb := newLiveTable()
	tb.hold("r0", "sql")
	tb.hold("r1", "sql")
	d := New(tb, &sched{}, noBreakers{}, nil)
	defer d.Close()
	tgt, aerr := d.Resolve(context.Background(), "sql", discard)
	if aerr != nil || len(tgt.Endpoints) != 2 {
		t.Fatalf("Resolve: %v %v", tgt.Endpoints, aerr)
	}
	pl, _ := d.Prepare(context.Background(), tgt, Input{Body: []byte(`{}`)})
	tb.mu.Lock()
	delete(tb.holds["r0"], "sql") // evicted from r0 since
	tb.mu.Unlock()
	if e, _ := pl.Next(nil); e == nil || e.ReplicaID != "r1" {
		t.Fatalf("chose %v, want r1, the one still holding sql", e)
	}
	tb.mu.Lock()
	delete(tb.holds["r1"], "sql")
	tb.mu.Unlock()
	var got []string
	var tried []*endpoint.Endpoint
	for e, _ := pl.Next(nil); e != nil; e, _ = pl.Next(tried) {
		got = append(got, e.ReplicaID)
		tried = append(tried, e)
	}
	if !slices.Equal(got, []string{"r0", "r1"}) {
		t.Errorf("with no holder left, chose %v, want Resolve's r0 then r1", got)
	}
}

// TestAdapterUseWaitsForTheAnswer (issue 27): a request for an adapter the
// control plane does not already hold busy on this router's word is sent
// only once the report counting it is answered — not before, and not
// later than useAnswerWait; one used within half the leader's
// adapter_min_idle, or while reports fail, goes at once.
func TestAdapterUseWaitsForTheAnswer(t *testing.T) {
	tb := baseTable()
	tb.held = map[string]string{"r0": "sql"}
	rep := &fakeReporter{gate: make(chan struct{})}
	reg := prometheus.NewRegistry()
	d := New(tb, &sched{}, noBreakers{}, reg, WithAdapterUse(rep, "r", discard))
	defer d.Close()
	defer close(rep.gate) // let every report through at the end
	next := func() chan time.Duration {
		t.Helper()
		tgt, aerr := d.Resolve(context.Background(), "sql", discard)
		if aerr != nil {
			t.Fatal(aerr)
		}
		pl, _ := d.Prepare(context.Background(), tgt, Input{Body: []byte(`{}`)})
		out := make(chan time.Duration, 1)
		go func() {
			start := time.Now()
			pl.Next(nil)
			out <- time.Since(start)
			pl.Done("r0", 200)
		}()
		return out
	}
	waits := func(result string) float64 {
		return testkit.Metric(t, reg, "llmgw_router_adapter_use_waits_total", testkit.Labels{"result": result})
	}

	// First use: held until the control plane answers.
	sent := next()
	select {
	case <-sent:
		t.Fatal("a first use was sent before the control plane answered its report")
	case <-time.After(useAnswerWait / 4): // pacing: a check that nothing happens
	}
	rep.gate <- struct{}{}
	<-sent
	if got := waits("answered"); got != 1 {
		t.Errorf("waits answered %v, want 1", got)
	}
	// The release's report, answered: sql on r0 is now used within half
	// of adapter_min_idle, so the next request goes at once, reports held.
	rep.gate <- struct{}{}
	rep.waitFor(t, "the release reported", map[string]uint32{"sql/r0": 0})
	if took := <-next(); took >= useAnswerWait/2 {
		t.Errorf("a use within half of adapter_min_idle waited %v", took)
	}

	// Nothing answers: sent after useAnswerWait.
	d2 := New(tb, &sched{}, noBreakers{}, prometheus.NewRegistry(), WithAdapterUse(&fakeReporter{gate: make(chan struct{})}, "r", discard))
	defer d2.Close()
	d = d2
	if took := <-next(); took < useAnswerWait || took > 10*useAnswerWait {
		t.Errorf("with no answer, sent after %v, want useAnswerWait (%v)", took, useAnswerWait)
	}
}

// TestAdapterUseNoWaitWhileReportsFail: while reports fail, requests do
// not wait for answers that do not come (the control plane is not in the
// way of traffic).
func TestAdapterUseNoWaitWhileReportsFail(t *testing.T) {
	tb := baseTable()
	tb.held = map[string]string{"r0": "sql", "r1": "sql"}
	rep := &fakeReporter{fail: 1 << 30}
	d := New(tb, &sched{}, noBreakers{}, nil, WithAdapterUse(rep, "r", discard))
	defer d.Close()
	tgt, _ := d.Resolve(context.Background(), "sql", discard)
	pl, _ := d.Prepare(context.Background(), tgt, Input{Body: []byte(`{}`)})
	e, _ := pl.Next(nil) // waits for the first failure at most
	testkit.Wait(t, "a failed report", func() bool { _, tries := rep.count(); return tries >= 1 })
	start := time.Now()
	pl.Next([]*endpoint.Endpoint{e}) // r1: never used, and reports fail
	if took := time.Since(start); took >= useAnswerWait/2 {
		t.Errorf("waited %v for an answer while reports fail", took)
	}
	pl.Done("r1", 200)
}
