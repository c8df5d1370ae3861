package kv

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/llmgw/llmgw/vllm"
)

// fakeClock is an injected clock the test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestFlushPolicyDue(t *testing.T) {
	p := FlushPolicy{Delay: 5 * time.Millisecond, MinInterval: 50 * time.Millisecond}
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	for _, tc := range []struct {
		name        string
		first, last time.Time
		want        time.Time
	}{
		{"first send ever: the delay", ms(0), time.Time{}, ms(5)},
		{"quiet: the last send long ago", ms(1000), ms(0), ms(1005)},
		{"just past the interval: the delay", ms(46), ms(0), ms(51)},
		{"churn: spaced from the last send", ms(10), ms(0), ms(50)},
		{"churn: a change right after a send waits the interval", ms(1), ms(0), ms(50)},
	} {
		if got := p.due(tc.first, tc.last); !got.Equal(tc.want) {
			t.Errorf("%s: due %v, want %v", tc.name, got.Sub(t0), tc.want.Sub(t0))
		}
	}
}

func TestFlushPolicyValidate(t *testing.T) {
	for _, tc := range []struct {
		p    FlushPolicy
		want string
	}{
		{DefaultFlushPolicy(), ""},
		{FlushPolicy{Delay: -1, MinInterval: time.Second}, "delay"},
		{FlushPolicy{Delay: 0, MinInterval: 0}, "min_interval"},
		{FlushPolicy{MinInterval: time.Hour}, "min_interval"},
	} {
		err := tc.p.Validate()
		if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: %v, want an error naming %q", tc.p, err, tc.want)
		}
	}
}

// The pacer over a sequence of changes and sends, each step at a time on
// the injected clock: when the session is woken, how long it then waits,
// and that a busy engine gets one send per interval, not one per event.
func TestPacer(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	p, err := newPacer(FlushPolicy{Delay: 5 * time.Millisecond, MinInterval: 50 * time.Millisecond}, clk.now)
	if err != nil {
		t.Fatal(err)
	}
	woken := func() bool {
		select {
		case <-p.notify:
			return true
		default:
			return false
		}
	}
	if _, ok := p.flushIn(); ok || woken() {
		t.Fatal("pending before any change")
	}
	// Quiet engine: an event, a wake, a send 5 ms later.
	p.changed()
	if !woken() {
		t.Fatal("the first change did not wake the session")
	}
	if d, ok := p.flushIn(); !ok || d != 5*time.Millisecond {
		t.Fatalf("flush in %v %v, want 5ms", d, ok)
	}
	clk.advance(2 * time.Millisecond)
	p.changed() // same batch: no second wake, the due time stays
	if woken() {
		t.Error("a second change of the batch woke the session again")
	}
	if d, _ := p.flushIn(); d != 3*time.Millisecond {
		t.Errorf("flush in %v after 2 ms, want 3ms", d)
	}
	clk.advance(3 * time.Millisecond)
	p.sent(p.taking())
	if _, ok := p.flushIn(); ok {
		t.Error("pending after the send")
	}
	// Churn: an event every 2 ms for 500 ms gives a send every 50 ms.
	sends := 0
	for range 250 {
		clk.advance(2 * time.Millisecond)
		p.changed()
		woken()
		if d, ok := p.flushIn(); ok && d == 0 {
			p.sent(p.taking())
			sends++
		}
	}
	if sends < 9 || sends > 11 {
		t.Errorf("%d sends over 500 ms of churn, want about 10 (one per 50 ms)", sends)
	}
	// A report that carried nothing does not count as a send.
	clk.advance(time.Second)
	p.changed()
	p.taking()
	p.changed()
	if d, _ := p.flushIn(); d != 5*time.Millisecond {
		t.Errorf("after an empty report: flush in %v, want the delay", d)
	}
}

// Each report carries the engine times of its oldest and newest batch,
// and the agent observes now minus each; a report that cancels out
// carries none, and stale times do not leak into the next report.
func TestHubLag(t *testing.T) {
	clk := &fakeClock{t: time.Unix(2000, 0)}
	reg := prometheus.NewRegistry()
	hub, err := NewHubWith(quiet, reg, DefaultFlushPolicy(), clk.now)
	if err != nil {
		t.Fatal(err)
	}
	m := newMirror("r", 1, testBS, "0", DefaultMaxBlocks, DefaultMaxOffloadBlocks, 16)
	m.newEngine(1)
	hub.add(m)
	hub.Changes() // the first report: a reset
	a := chain(t, vllm.NoneHash("0"), toks(1, 8))
	apply := func(ts float64, evs ...vllm.Event) {
		m.mu.Lock()
		b := vllm.EventBatch{TS: ts, Events: evs}
		m.applyBatch(b)
		m.noteBatch(b.TS)
		m.mu.Unlock()
	}
	apply(1999.9, storedEv(nil, a[:1], toks(1, 4)))
	apply(1999.95, storedEv(&a[0], a[1:2], toks(5, 4)))
	apply(0, removedEv(a[1].Uint64())) // a ts of 0 is not a time
	ch := hub.Changes()
	if len(ch) != 1 || ch[0].OldestEventUnixNano != 1999_900_000_000 || ch[0].NewestEventUnixNano != 1999_950_000_000 {
		t.Fatalf("changes %v: want oldest 1999.9 s and newest 1999.95 s", ch)
	}
	lag := histogram(t, reg, "llmgw_agent_kv_event_lag_seconds", "oldest")
	if lag.GetSampleCount() != 1 || !near(lag.GetSampleSum(), 0.1) {
		t.Errorf("oldest lag: %d samples, sum %v, want 1 of 0.1", lag.GetSampleCount(), lag.GetSampleSum())
	}
	if h := histogram(t, reg, "llmgw_agent_kv_event_lag_seconds", "newest"); !near(h.GetSampleSum(), 0.05) {
		t.Errorf("newest lag sum %v, want 0.05", h.GetSampleSum())
	}
	// Stored and removed between reports: nothing to send, and the times
	// are dropped with the empty report.
	apply(1990, storedEv(&a[0], a[1:2], toks(5, 4)), removedEv(a[1].Uint64()))
	if ch := hub.Changes(); ch != nil {
		t.Fatalf("net-zero changes reported: %v", ch)
	}
	apply(2000, removedEv(a[0].Uint64()))
	if ch := hub.Changes(); len(ch) != 1 || ch[0].OldestEventUnixNano != 2000_000_000_000 {
		t.Fatalf("changes %v: want oldest 2000 s (not a leftover time)", ch)
	}
	// A clock ahead of the agent's counts as no lag, not a negative one.
	apply(2001, storedEv(nil, a[:1], toks(1, 4)))
	hub.Changes()
	if h := histogram(t, reg, "llmgw_agent_kv_event_lag_seconds", "oldest"); h.GetSampleCount() != 3 || !near(h.GetSampleSum(), 0.1) {
		t.Errorf("oldest lag: %d samples, sum %v; want 3, sum 0.1", h.GetSampleCount(), h.GetSampleSum())
	}
}

func near(a, b float64) bool { return a-b < 1e-6 && b-a < 1e-6 }

func histogram(t *testing.T, reg *prometheus.Registry, name, edge string) *dto.Histogram {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "edge" && l.GetValue() == edge {
					return m.GetHistogram()
				}
			}
		}
	}
	return &dto.Histogram{}
}
