package gossip

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/llmgw/llmgw/internal/testkit"
)

func TestReconnectPlan(t *testing.T) {
	now := time.Unix(1000, 0)
	m := func(st Status) Member { return Member{Status: st, GossipAddr: "127.0.0.1:1"} }
	tests := []struct {
		name      string
		ms        map[string]Member
		failedAt  map[string]time.Time
		keep      func(string) bool
		retry     []string
		reap      []string
		whyRetry  string
		whyReaped string
	}{
		{name: "dead within the window is retried, alive and self are not",
			ms:       map[string]Member{"c1": m(StatusDead), "c2": m(StatusDead), "c3": m(StatusAlive), "c4": m(StatusSuspect)},
			failedAt: map[string]time.Time{"c1": now, "c2": now.Add(-time.Hour)},
			retry:    []string{"c2"}},
		{name: "left is final",
			ms:    map[string]Member{"c2": m(StatusLeft), "c3": m(StatusDead)},
			retry: []string{"c3"}},
		{name: "keep refuses a removed server",
			ms:    map[string]Member{"c2": m(StatusDead), "c3": m(StatusDead)},
			keep:  func(id string) bool { return id != "c2" },
			retry: []string{"c3"}},
		{name: "past the window is reaped, not retried, even if removed",
			ms:       map[string]Member{"c2": m(StatusDead), "c3": m(StatusDead)},
			failedAt: map[string]time.Time{"c2": now.Add(-73 * time.Hour), "c3": now.Add(-71 * time.Hour)},
			keep:     func(string) bool { return true },
			retry:    []string{"c3"}, reap: []string{"c2"}},
		{name: "no address, nothing to dial",
			ms: map[string]Member{"c2": {Status: StatusDead}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			retry, reap := reconnectPlan(tt.ms, tt.failedAt, now, 72*time.Hour, "c1", tt.keep)
			if !slices.Equal(retry, tt.retry) || !slices.Equal(reap, tt.reap) {
				t.Fatalf("retry %v reap %v, want retry %v reap %v", retry, reap, tt.retry, tt.reap)
			}
		})
	}
}

// deadOn waits until g sees id dead.
func deadOn(t *testing.T, g *Gossip, id string) {
	t.Helper()
	testkit.Wait(t, g.Self().ID+" sees "+id+" dead", func() bool {
		m, ok := g.Member(id)
		return ok && m.Status == StatusDead
	})
}

// TestReconnectBringsBackAFailedServer: b fails and comes back on its
// address with no join of its own, as a partitioned server whose network
// heals; memberlist on a does not contact a dead member again, and one
// reconnect round does: both see each other alive.
func TestReconnectBringsBackAFailedServer(t *testing.T) {
	a, _ := startMember(t, "a", Security{})
	b, _ := startMember(t, "b", Security{})
	if _, err := b.Join([]string{a.Addr()}); err != nil {
		t.Fatal(err)
	}
	testkit.Wait(t, "a and b see each other", func() bool { return alive(a) == 2 && alive(b) == 2 })
	addr := b.Addr()
	if err := b.Shutdown(); err != nil {
		t.Fatal(err)
	}
	deadOn(t, a, "b")

	b2 := New(b.Self(), &recorder{}, slog.New(slog.DiscardHandler), time.Now)
	if err := b2.Start(addr, fast, Security{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b2.Shutdown() })
	if m, _ := a.Member("b"); m.Status != StatusDead {
		t.Fatalf("b is %s on a before any reconnect, want dead", m.Status)
	}
	// A round that keeps nobody makes no attempt.
	a.reconnectRound(context.Background(), func(string) bool { return false })
	if n, _ := a.ReconnectStats(); n != 0 {
		t.Fatalf("%d attempts on a server keep refused", n)
	}
	a.reconnectRound(context.Background(), nil)
	testkit.Wait(t, "a and the returned b see each other alive", func() bool { return alive(a) == 2 && alive(b2) == 2 })
	if n, ok := a.ReconnectStats(); n != 1 || ok != 1 {
		t.Fatalf("reconnect stats %d attempts, %d reconnected; want 1, 1", n, ok)
	}
}

// TestReconnectLeavesLeftAndRemovedAlone: a server that left, and one
// tombstoned, are never retried; failed ones past the window are reaped.
func TestReconnectLeavesLeftAndRemovedAlone(t *testing.T) {
	clock := time.Unix(1000, 0)
	a := New(Meta{ID: "a", GRPC: "127.0.0.1:1", Raft: "127.0.0.1:2"}, nil, slog.New(slog.DiscardHandler), func() time.Time { return clock })
	if err := a.Start("127.0.0.1:0", fast, Security{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Shutdown() })
	for _, id := range []string{"left", "removed", "old"} {
		o, _ := startMember(t, id, Security{})
		if _, err := o.Join([]string{a.Addr()}); err != nil {
			t.Fatal(err)
		}
		testkit.Wait(t, "a sees "+id, func() bool { m, ok := a.Member(id); return ok && m.Status == StatusAlive })
		if id == "left" {
			if err := o.Leave(time.Second); err != nil {
				t.Fatal(err)
			}
			testkit.Wait(t, "a sees left leave", func() bool { m, _ := a.Member(id); return m.Status == StatusLeft })
		}
		_ = o.Shutdown()
		if id != "left" {
			deadOn(t, a, id)
		}
	}
	a.SetRemoved("removed", true)
	a.reconnectRound(context.Background(), nil)
	if n, _ := a.ReconnectStats(); n != 1 {
		t.Fatalf("%d reconnect attempts, want 1 (old; not left, not removed)", n)
	}
	clock = clock.Add(a.tune.reconnectTimeout() + time.Second)
	a.reconnectRound(context.Background(), nil)
	if n, _ := a.ReconnectStats(); n != 1 {
		t.Fatalf("%d reconnect attempts after the window, want still 1", n)
	}
	for _, id := range []string{"old", "removed"} {
		if _, ok := a.Member(id); ok {
			t.Fatalf("%s, failed past the reconnect window, is not reaped", id)
		}
	}
	if m, _ := a.Member("left"); m.Status != StatusLeft {
		t.Fatalf("left is %q, want still listed as left", m.Status)
	}
}

// TestLeaveIntent: a death after a leave intent is a leave, in either
// order; a server alive again drops the intent, so its next death is a
// death; an intent for an unknown server is dropped.
func TestLeaveIntent(t *testing.T) {
	g := New(Meta{ID: "a"}, nil, slog.New(slog.DiscardHandler), time.Now)
	meta, err := Meta{ID: "b", GRPC: "127.0.0.1:1", Raft: "127.0.0.1:2"}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	node := &memberlist.Node{Name: "b", Addr: net.ParseIP("127.0.0.1"), Port: 7, Meta: meta}
	ev, dl := (*events)(g), (*delegate)(g)
	intent := append([]byte{leaveKind}, "b"...)
	status := func() Status { m, _ := g.Member("b"); return m.Status }
	steps := []struct {
		name string
		do   func()
		want Status
	}{
		{"joins", func() { ev.NotifyJoin(node) }, StatusAlive},
		{"intent, then death", func() { dl.NotifyMsg(intent); ev.NotifyLeave(node) }, StatusLeft},
		{"back", func() { ev.NotifyJoin(node) }, StatusAlive},
		{"a death without an intent", func() { ev.NotifyLeave(node) }, StatusDead},
		{"the intent after the death", func() { dl.NotifyMsg(intent) }, StatusLeft},
	}
	for _, s := range steps {
		s.do()
		if got := status(); got != s.want {
			t.Fatalf("%s: b is %q, want %q", s.name, got, s.want)
		}
	}
	dl.NotifyMsg(append([]byte{leaveKind}, "stranger"...))
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.leftIntent["stranger"] {
		t.Fatal("an intent for an unknown server was kept")
	}
}

// FuzzNotifyMsg: gossip messages are outside input (leave intents,
// tombstones); none panics, and no intent is kept for a server the table
// does not hold.
func FuzzNotifyMsg(f *testing.F) {
	f.Add(append([]byte{leaveKind}, "b"...))
	f.Add([]byte{leaveKind})
	f.Add([]byte(`{"b":{"r":true,"t":1}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		g := New(Meta{ID: "a"}, nil, slog.New(slog.DiscardHandler), time.Now)
		(*delegate)(g).NotifyMsg(b)
		g.mu.Lock()
		defer g.mu.Unlock()
		if len(g.leftIntent) != 0 {
			t.Fatalf("intents kept for unknown servers: %v", g.leftIntent)
		}
	})
}
