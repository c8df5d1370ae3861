package leader

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestAdapterUse: how the leader keeps the routers' reports (design §7.6):
// each session's newest, for adapterUseKeep, summed over routers, with the
// routers' clocks read against their send time.
func TestAdapterUse(t *testing.T) {
	rep := func(router string, session, seq uint64, sent time.Time, uses ...*llmgwv1.AdapterStatus) *llmgwv1.AdapterUseReport {
		return &llmgwv1.AdapterUseReport{Router: router, Session: session, Seq: seq, SentUnixNano: sent.UnixNano(), Uses: uses}
	}
	use := func(adapter, replica string, uid uint64, n uint32, last time.Time) *llmgwv1.AdapterStatus {
		return &llmgwv1.AdapterStatus{Adapter: adapter, ReplicaId: replica, Uid: uid, Active: n, LastActiveUnixNano: last.UnixNano()}
	}
	type at struct {
		d      time.Duration // after t0
		report *llmgwv1.AdapterUseReport
	}
	tests := []struct {
		name    string
		reports []at
		query   time.Duration // after t0
		uid     uint64
		want    routerUse
	}{
		{name: "nothing reported: not covered", want: routerUse{}},
		{name: "one router, one request in flight: busy now",
			reports: []at{{0, rep("r1", 1, 1, t0, use("a", "base-0", 1, 1, t0.Add(-time.Hour)))}},
			query:   time.Second, uid: 1,
			want: routerUse{active: 1, last: t0, covered: true}},
		{name: "summed over routers; the latest use",
			reports: []at{
				{0, rep("r1", 1, 1, t0, use("a", "base-0", 1, 2, t0))},
				{0, rep("r2", 7, 1, t0, use("a", "base-0", 1, 0, t0.Add(-time.Minute)))},
				{0, rep("r3", 8, 1, t0, use("a", "base-0", 1, 3, t0))}},
			uid:  1,
			want: routerUse{active: 5, last: t0, covered: true}},
		{name: "a router's clock an hour ahead: its times are read against its send time",
			reports: []at{{0, rep("r1", 1, 1, t0.Add(time.Hour), use("a", "base-0", 1, 0, t0.Add(time.Hour-10*time.Second)))}},
			uid:     1,
			want:    routerUse{last: t0.Add(-10 * time.Second), covered: true}},
		{name: "a last use after the send time is taken as now",
			reports: []at{{0, rep("r1", 1, 1, t0, use("a", "base-0", 1, 0, t0.Add(time.Minute)))}},
			uid:     1,
			want:    routerUse{last: t0, covered: true}},
		{name: "an older report of the session arriving late is dropped",
			reports: []at{
				{0, rep("r1", 1, 5, t0, use("a", "base-0", 1, 0, t0))},
				{time.Millisecond, rep("r1", 1, 4, t0, use("a", "base-0", 1, 9, t0))}},
			uid:  1,
			want: routerUse{last: t0, covered: true}},
		{name: "a newer report replaces the session's whole",
			reports: []at{
				{0, rep("r1", 1, 1, t0, use("a", "base-0", 1, 4, t0))},
				{time.Millisecond, rep("r1", 1, 2, t0.Add(time.Millisecond), use("b", "base-0", 1, 1, t0))}},
			uid:  1,
			want: routerUse{covered: true}},
		{name: "a report expires after adapterUseKeep",
			reports: []at{{0, rep("r1", 1, 1, t0, use("a", "base-0", 1, 4, t0))}},
			query:   adapterUseKeep, uid: 1,
			want: routerUse{}},
		{name: "another replica under the same id does not count",
			reports: []at{{0, rep("r1", 1, 1, t0, use("a", "base-0", 9, 4, t0))}},
			uid:     1,
			want:    routerUse{covered: true}},
		{name: "incarnations of one replica add up",
			reports: []at{{0, rep("r1", 1, 1, t0, use("a", "base-0", 1, 1, t0), use("a", "base-0", 1, 2, t0))}},
			uid:     1,
			want:    routerUse{active: 3, last: t0, covered: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := newAdapterUse()
			for _, r := range tt.reports {
				if _, ok := u.report(r.report, t0.Add(r.d)); !ok {
					t.Fatalf("report refused: %v", r.report)
				}
			}
			if got := u.of("a", "base-0", tt.uid, t0.Add(tt.query)); got.active != tt.want.active || !got.last.Equal(tt.want.last) || got.covered != tt.want.covered {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestAdapterUseBounds: what callers can make the leader hold is bounded —
// a router restarting in a loop replaces its oldest session, and a table
// of maxUseSessions refuses new ones until some expire.
func TestAdapterUseBounds(t *testing.T) {
	u := newAdapterUse()
	for s := range uint64(maxSessionsPerRouter + 3) {
		if n, ok := u.report(&llmgwv1.AdapterUseReport{Router: "r1", Session: s + 1, Seq: 1}, t0.Add(time.Duration(s))); !ok || n > maxSessionsPerRouter {
			t.Fatalf("session %d of one router: %d kept, ok %v", s+1, n, ok)
		}
	}
	if _, kept := u.sessions[useSession{"r1", 1}]; kept {
		t.Error("the router's oldest session was kept over its newest")
	}
	for i := len(u.sessions); i < maxUseSessions; i++ {
		if _, ok := u.report(&llmgwv1.AdapterUseReport{Router: fmt.Sprint("other", i), Session: 1, Seq: 1}, t0); !ok {
			t.Fatalf("session %d refused below the bound", i)
		}
	}
	if n, ok := u.report(&llmgwv1.AdapterUseReport{Router: "late", Session: 1, Seq: 1}, t0); ok || n != maxUseSessions {
		t.Errorf("a session past the bound: kept %v, %d sessions", ok, n)
	}
	// A kept session still reports.
	if _, ok := u.report(&llmgwv1.AdapterUseReport{Router: "r1", Session: maxSessionsPerRouter + 3, Seq: 2}, t0); !ok {
		t.Error("a kept session's next report refused at the bound")
	}
	if _, ok := u.report(&llmgwv1.AdapterUseReport{Router: "late", Session: 1, Seq: 1}, t0.Add(adapterUseKeep)); !ok {
		t.Error("refused once the others expired")
	}
}

// TestReportAdapterUseAnswer: the leader's gauge of router sessions, and
// its answer: how long a report counts and adapter_min_idle.
func TestReportAdapterUseAnswer(t *testing.T) {
	r := newRig(t, testConfig(), loraState(1))
	routerReport(r, "r1", 1)
	resp, ok := r.l.ReportAdapterUse(&llmgwv1.AdapterUseReport{Router: "r2", Session: 1, Seq: 1})
	if !ok || resp.GetKeepMs() != adapterUseKeep.Milliseconds() || resp.GetMinIdleMs() != time.Minute.Milliseconds() {
		t.Errorf("answer %v %v, want keep 3 s and the 1 m adapter_min_idle", resp, ok)
	}
	if got := testkit.Metric(t, r.reg, "llmgw_control_adapter_use_routers", nil); got != 2 {
		t.Errorf("llmgw_control_adapter_use_routers = %v, want 2", got)
	}
}

// TestReportWaitsForAnEviction (issue 27): a report that arrives while an
// eviction is being decided and committed is kept, and answered, only once
// the eviction is committed — so a router that waits for the answer before
// sending a request never sends it into an eviction decided without it.
func TestReportWaitsForAnEviction(t *testing.T) {
	r := newRig(t, testConfig(), loraState(1, placed("a", "base-0"), placed("b", "base-1")))
	setPhases(r, ready, "base-0", "base-1")
	r.reports.setAdapter("base-0", 1, loaded("a", t0.Add(-time.Hour), 0))
	r.reports.setAdapter("base-1", 2, loaded("b", t0.Add(-2*time.Hour), 0))
	agentLoads(r)
	evicting, release := make(chan struct{}), make(chan struct{})
	r.prop.fail = func(p proposal) error {
		if c, ok := p.msg.(*llmgwv1.SetAdapterPlacementCommand); ok && len(c.Placement.Replicas) == 0 {
			close(evicting)
			<-release
		}
		return nil
	}
	ensured := make(chan error, 1)
	go func() {
		_, _, err := r.l.EnsureAdapter(context.Background(), &llmgwv1.EnsureAdapterRequest{Adapter: "c"}, 5*time.Second)
		ensured <- err
	}()
	<-evicting
	answered := make(chan struct{})
	go func() {
		routerReport(r, "r1", 1, inFlight("b", "base-1", 1, t0))
		close(answered)
	}()
	select {
	case <-answered:
		t.Fatal("a report was answered while an eviction was being committed")
	case <-time.After(50 * time.Millisecond): // pacing: a check that nothing happens
	}
	close(release)
	<-answered
	if err := <-ensured; err != nil {
		t.Fatal(err)
	}
}

// FuzzAdapterUseReport: any report a caller can send, decoded, is kept or
// dropped without a panic, and a query after it is answered.
func FuzzAdapterUseReport(f *testing.F) {
	seed, _ := proto.Marshal(&llmgwv1.AdapterUseReport{Router: "r", Session: 1, Seq: 1, SentUnixNano: t0.UnixNano(),
		Uses: []*llmgwv1.AdapterStatus{{Adapter: "a", ReplicaId: "base-0", Uid: 1, Active: 2, LastActiveUnixNano: -1}}})
	f.Add(seed)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var r llmgwv1.AdapterUseReport
		if proto.Unmarshal(b, &r) != nil {
			return
		}
		u := newAdapterUse()
		u.report(&r, t0)
		u.report(&r, t0.Add(time.Second))
		for _, s := range r.GetUses() {
			u.of(s.GetAdapter(), s.GetReplicaId(), s.GetUid(), t0)
		}
	})
}
