package leader

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

const (
	ensureMetric     = "llmgw_control_adapter_ensure_seconds"
	adapterPlMetric  = "llmgw_control_adapter_placements_total"
	waitersMetric    = "llmgw_control_adapter_waiters"
	queuedMetric     = "llmgw_control_adapter_queued_calls"
	stateLoaded      = llmgwv1.AdapterState_ADAPTER_STATE_LOADED
	stateLoading     = llmgwv1.AdapterState_ADAPTER_STATE_LOADING
	stateFailed      = llmgwv1.AdapterState_ADAPTER_STATE_FAILED
	stateUnspecified = llmgwv1.AdapterState_ADAPTER_STATE_UNSPECIFIED
)

// loraState is a model "base" with adapters a to d, at most max of them
// loaded per replica, and replicas base-0 (uid 1, node n1) and base-1
// (uid 2, node n2).
func loraState(max uint32, placements ...*llmgwv1.AdapterPlacement) *llmgwv1.State {
	m := model("base", 2, 1)
	m.MaxLoadedAdapters = max
	for _, a := range []string{"a", "b", "c", "d"} {
		m.Adapters = append(m.Adapters, &llmgwv1.Adapter{Name: a, Path: "/adapters/" + a})
	}
	return &llmgwv1.State{
		Nodes:             []*llmgwv1.Node{active("n1", 1), active("n2", 1)},
		Models:            []*llmgwv1.Model{m},
		Replicas:          []*llmgwv1.Replica{replica("base-0", 1, "base", "n1", 0), replica("base-1", 2, "base", "n2", 0)},
		AdapterPlacements: placements,
	}
}

func placed(adapter string, replicas ...string) *llmgwv1.AdapterPlacement {
	return &llmgwv1.AdapterPlacement{Model: "base", Adapter: adapter, Replicas: replicas}
}

// uidOf is the uid of loraState's replicas.
func uidOf(id string) uint64 {
	return map[string]uint64{"base-0": 1, "base-1": 2}[id]
}

func loaded(adapter string, lastActive time.Time, active uint32) *llmgwv1.AdapterStatus {
	return &llmgwv1.AdapterStatus{Adapter: adapter, State: stateLoaded, LastActiveUnixNano: lastActive.UnixNano(), Active: active}
}

func loading(adapter string) *llmgwv1.AdapterStatus {
	return &llmgwv1.AdapterStatus{Adapter: adapter, State: stateLoading}
}

// failedLoad is a FAILED report; a zero retry is a final failure.
func failedLoad(adapter, reason string, retry time.Time) *llmgwv1.AdapterStatus {
	s := &llmgwv1.AdapterStatus{Adapter: adapter, State: stateFailed, Reason: reason}
	if !retry.IsZero() {
		s.RetryAfterUnixNano = retry.UnixNano()
	}
	return s
}

// agentLoads makes the fake agents load every adapter the leader places,
// as soon as the placement is applied.
func agentLoads(r *rig) {
	r.prop.onApplied = func(p proposal) {
		c, ok := p.msg.(*llmgwv1.SetAdapterPlacementCommand)
		if !ok {
			return
		}
		for _, id := range c.Placement.Replicas {
			r.reports.setAdapter(id, uidOf(id), &llmgwv1.AdapterStatus{Adapter: c.Placement.Adapter, State: stateLoaded})
		}
	}
}

// routerReport is a router's report of its adapter use, sent now by the
// rig's clock (the router's clock agrees).
func routerReport(r *rig, router string, seq uint64, uses ...*llmgwv1.AdapterStatus) {
	if _, ok := r.l.ReportAdapterUse(&llmgwv1.AdapterUseReport{Router: router, Session: 1, Seq: seq,
		SentUnixNano: r.clock.Now().UnixNano(), Uses: uses}); !ok {
		panic("report refused")
	}
}

// inFlight is one use in a router's report: n requests in flight for the
// adapter on the replica, the last one ended at last.
func inFlight(adapter, replica string, n uint32, last time.Time) *llmgwv1.AdapterStatus {
	return &llmgwv1.AdapterStatus{Adapter: adapter, ReplicaId: replica, Uid: uidOf(replica), Active: n, LastActiveUnixNano: last.UnixNano()}
}

func setPhases(r *rig, phase llmgwv1.ReplicaPhase, ids ...string) {
	for _, id := range ids {
		r.reports.setPhase(id, uidOf(id), phase)
	}
}

// TestEnsureAdapter: what EnsureAdapter answers, and which placement
// commands it proposes, for the states an adapter and its model's replicas
// can be in (design §7.6).
func TestEnsureAdapter(t *testing.T) {
	cfg := testConfig() // AdapterMinIdle 1m, AdapterRetryAfter 2s
	tests := []struct {
		name       string
		st         *llmgwv1.State
		setup      func(r *rig) // reports, queue; both replicas are READY before it
		req        *llmgwv1.EnsureAdapterRequest
		wait       time.Duration // 0: 5s, which a correct answer never reaches
		agentLoads bool
		fail       func(proposal) error

		wantState    llmgwv1.AdapterState
		wantOn       []string
		wantRetryMs  int64
		wantReason   string // a part of it
		wantResult   string
		wantErr      error // errors.Is
		wantErrText  string
		want         []proposal
		wantAdapterP map[string]float64 // llmgw_control_adapter_placements_total by action
	}{
		{
			name:    "an adapter no catalog lists",
			st:      loraState(2),
			req:     &llmgwv1.EnsureAdapterRequest{Adapter: "zzz"},
			wantErr: ErrUnknownAdapter, wantErrText: `adapter "zzz": not in any model's catalog`,
		},
		{
			name: "max_loaded_adapters 0: every ready replica holds every adapter",
			st:   loraState(0),
			setup: func(r *rig) {
				setPhases(r, starting, "base-1")
			},
			req:       &llmgwv1.EnsureAdapterRequest{Adapter: "a"},
			wantState: stateLoaded, wantOn: []string{"base-0"}, wantResult: "loaded",
		},
		{
			name: "max_loaded_adapters 0, no replica ready: LOADING once the wait ends",
			st:   loraState(0),
			setup: func(r *rig) {
				setPhases(r, starting, "base-0", "base-1")
			},
			req: &llmgwv1.EnsureAdapterRequest{Adapter: "a"}, wait: 30 * time.Millisecond,
			wantState: stateLoading, wantRetryMs: 2000, wantReason: `adapter "a" is not loaded after 30ms`, wantResult: "timeout",
		},
		{
			name:       "a cold adapter goes to the ready replica holding fewest; lowest id first",
			st:         loraState(2),
			req:        &llmgwv1.EnsureAdapterRequest{Adapter: "a"},
			agentLoads: true,
			wantState:  stateLoaded, wantOn: []string{"base-0"}, wantResult: "loaded",
			want:         []proposal{setAdapter("base", "a", "base-0")},
			wantAdapterP: map[string]float64{"place": 1},
		},
		{
			name: "a cold adapter goes to the ready replica holding fewest",
			st:   loraState(2, placed("b", "base-0")),
			setup: func(r *rig) {
				r.reports.setAdapter("base-0", 1, loaded("b", t0, 0))
			},
			req:        &llmgwv1.EnsureAdapterRequest{Adapter: "a"},
			agentLoads: true,
			wantState:  stateLoaded, wantOn: []string{"base-1"}, wantResult: "loaded",
			want:         []proposal{setAdapter("base", "a", "base-1")},
			wantAdapterP: map[string]float64{"place": 1},
		},
		{
			name: "a draining replica takes no adapter",
			st: func() *llmgwv1.State {
				st := loraState(2)
				st.Replicas[0].Draining = true
				return st
			}(),
			req:        &llmgwv1.EnsureAdapterRequest{Adapter: "a"},
			agentLoads: true,
			wantState:  stateLoaded, wantOn: []string{"base-1"}, wantResult: "loaded",
			want:         []proposal{setAdapter("base", "a", "base-1")},
			wantAdapterP: map[string]float64{"place": 1},
		},
		{
			name: "loaded on one placed replica: answered from the reports, nothing proposed",
			st:   loraState(2, placed("a", "base-0", "base-1")),
			setup: func(r *rig) {
				r.reports.setAdapter("base-0", 1, loading("a"))
				r.reports.setAdapter("base-1", 2, loaded("a", t0, 0))
			},
			req:       &llmgwv1.EnsureAdapterRequest{Adapter: "a"},
			wantState: stateLoaded, wantOn: []string{"base-1"}, wantResult: "loaded",
		},
		{
			name: "a placed replica that no longer exists is passed over",
			st:   loraState(2, placed("a", "base-0", "base-9")),
			setup: func(r *rig) {
				r.reports.setAdapter("base-0", 1, loaded("a", t0, 0))
			},
			req:       &llmgwv1.EnsureAdapterRequest{Adapter: "a"},
			wantState: stateLoaded, wantOn: []string{"base-0"}, wantResult: "loaded",
		},
		{
			name: "a report for another uid of the replica does not count",
			st:   loraState(2, placed("a", "base-0")),
			setup: func(r *rig) {
				r.reports.setAdapter("base-0", 9, loaded("a", t0, 0))
			},
			req: &llmgwv1.EnsureAdapterRequest{Adapter: "a"}, wait: 30 * time.Millisecond,
			wantState: stateLoading, wantRetryMs: 2000, wantReason: `adapter "a" is not loaded after 30ms`, wantResult: "timeout",
		},
		{
			name: "placed and loading: waits, LOADING once the wait ends",
			st:   loraState(2, placed("a", "base-0")),
			setup: func(r *rig) {
				r.reports.setAdapter("base-0", 1, loading("a"))
			},
			req: &llmgwv1.EnsureAdapterRequest{Adapter: "a"}, wait: 30 * time.Millisecond,
			wantState: stateLoading, wantRetryMs: 2000, wantReason: "is not loaded after", wantResult: "timeout",
		},
		{
			name: "failed on one replica, still loading on the other: waits",
			st:   loraState(2, placed("a", "base-0", "base-1")),
			setup: func(r *rig) {
				r.reports.setAdapter("base-0", 1, failedLoad("a", "bad path", t0.Add(time.Second)))
				r.reports.setAdapter("base-1", 2, loading("a"))
			},
			req: &llmgwv1.EnsureAdapterRequest{Adapter: "a"}, wait: 30 * time.Millisecond,
			wantState: stateLoading, wantRetryMs: 2000, wantReason: "is not loaded after", wantResult: "timeout",
		},
		{
			name: "failed everywhere, retry-after ahead: FAILED until the latest retry-after",
			st:   loraState(2, placed("a", "base-0", "base-1")),
			setup: func(r *rig) {
				r.reports.setAdapter("base-0", 1, failedLoad("a", "bad path", t0.Add(3*time.Second)))
				r.reports.setAdapter("base-1", 2, failedLoad("a", "out of memory", t0.Add(5*time.Second)))
			},
			req:       &llmgwv1.EnsureAdapterRequest{Adapter: "a"},
			wantState: stateFailed, wantRetryMs: 5000, wantResult: "failed",
			wantReason: `adapter "a" failed to load: base-0: bad path; base-1: out of memory`,
		},
		{
			name: "a failure without a retry-after is final",
			st:   loraState(2, placed("a", "base-0", "base-1")),
			setup: func(r *rig) {
				r.reports.setAdapter("base-0", 1, failedLoad("a", "no such file", time.Time{}))
				r.reports.setAdapter("base-1", 2, failedLoad("a", "bad path", t0.Add(-time.Second)))
			},
			req:       &llmgwv1.EnsureAdapterRequest{Adapter: "a"},
			wantState: stateFailed, wantRetryMs: 0, wantReason: "no such file", wantResult: "failed",
		},
		{
			name: "failed everywhere, retry-after passed: the placement is removed and made anew",
			st:   loraState(2, placed("a", "base-0", "base-1")),
			setup: func(r *rig) {
				r.reports.setAdapter("base-0", 1, failedLoad("a", "bad path", t0.Add(-time.Second)))
				r.reports.setAdapter("base-1", 2, failedLoad("a", "bad path", t0))
			},
			req:        &llmgwv1.EnsureAdapterRequest{Adapter: "a"},
			agentLoads: true,
			wantState:  stateLoaded, wantOn: []string{"base-0"}, wantResult: "loaded",
			want:         []proposal{setAdapter("base", "a"), setAdapter("base", "a", "base-0")},
			wantAdapterP: map[string]float64{"retry": 1, "place": 1},
		},
		{
			name: "every slot taken: the least recently used idle adapter is evicted",
			st:   loraState(1, placed("a", "base-0"), placed("b", "base-1")),
			setup: func(r *rig) {
				r.reports.setAdapter("base-0", 1, loaded("a", t0.Add(-time.Hour), 0))
				r.reports.setAdapter("base-1", 2, loaded("b", t0.Add(-2*time.Hour), 0))
			},
			req:        &llmgwv1.EnsureAdapterRequest{Adapter: "c"},
			agentLoads: true,
			wantState:  stateLoaded, wantOn: []string{"base-1"}, wantResult: "loaded",
			want:         []proposal{setAdapter("base", "b"), setAdapter("base", "c", "base-1")},
			wantAdapterP: map[string]float64{"evict": 1, "place": 1},
		},
		{
			name: "eviction keeps the adapter's other replicas",
			st:   loraState(1, placed("a", "base-0", "base-1")),
			setup: func(r *rig) {
				r.reports.setAdapter("base-0", 1, loaded("a", t0.Add(-time.Hour), 1))
				r.reports.setAdapter("base-1", 2, loaded("a", t0.Add(-time.Hour), 0))
			},
			req:        &llmgwv1.EnsureAdapterRequest{Adapter: "c"},
			agentLoads: true,
			wantState:  stateLoaded, wantOn: []string{"base-1"}, wantResult: "loaded",
			want:         []proposal{setAdapter("base", "a", "base-0"), setAdapter("base", "c", "base-1")},
			wantAdapterP: map[string]float64{"evict": 1, "place": 1},
		},
		{
			// Issue 27: the agents' readings are a second old; a router's
			// count is exact.
			name: "an adapter a router has a request in flight for is not evicted, whatever the agent read",
			st:   loraState(1, placed("a", "base-0"), placed("b", "base-1")),
			setup: func(r *rig) {
				r.reports.setAdapter("base-0", 1, loaded("a", t0.Add(-time.Hour), 0))
				r.reports.setAdapter("base-1", 2, loaded("b", t0.Add(-2*time.Hour), 0))
				routerReport(r, "r1", 1, inFlight("b", "base-1", 1, t0))
			},
			req:        &llmgwv1.EnsureAdapterRequest{Adapter: "c"},
			agentLoads: true,
			wantState:  stateLoaded, wantOn: []string{"base-0"}, wantResult: "loaded",
			want:         []proposal{setAdapter("base", "a"), setAdapter("base", "c", "base-0")},
			wantAdapterP: map[string]float64{"evict": 1, "place": 1},
		},
		{
			name: "a router's use within adapter_min_idle keeps an adapter the agent read idle",
			st:   loraState(1, placed("a", "base-0"), placed("b", "base-1")),
			setup: func(r *rig) {
				r.reports.setAdapter("base-0", 1, loaded("a", t0.Add(-time.Hour), 0))
				r.reports.setAdapter("base-1", 2, loaded("b", t0.Add(-2*time.Hour), 0))
				routerReport(r, "r1", 1, inFlight("b", "base-1", 0, t0.Add(-10*time.Second)))
			},
			req:        &llmgwv1.EnsureAdapterRequest{Adapter: "c"},
			agentLoads: true,
			wantState:  stateLoaded, wantOn: []string{"base-0"}, wantResult: "loaded",
			want:         []proposal{setAdapter("base", "a"), setAdapter("base", "c", "base-0")},
			wantAdapterP: map[string]float64{"evict": 1, "place": 1},
		},
		{
			// Issue 27: an engine whose activity metric is stuck busy.
			name: "with routers reporting, an agent's busy reading they do not confirm is not believed",
			st:   loraState(1, placed("a", "base-0"), placed("b", "base-1")),
			setup: func(r *rig) {
				r.reports.setAdapter("base-0", 1, loaded("a", t0, 1))
				r.reports.setAdapter("base-1", 2, loaded("b", t0, 1))
				routerReport(r, "r1", 1, inFlight("a", "base-0", 0, t0.Add(-10*time.Minute)),
					inFlight("b", "base-1", 0, t0.Add(-20*time.Minute)))
			},
			req:        &llmgwv1.EnsureAdapterRequest{Adapter: "c"},
			agentLoads: true,
			wantState:  stateLoaded, wantOn: []string{"base-1"}, wantResult: "loaded",
			want:         []proposal{setAdapter("base", "b"), setAdapter("base", "c", "base-1")},
			wantAdapterP: map[string]float64{"evict": 1, "place": 1},
		},
		{
			name: "every slot busy or recently used: busy at once, nothing proposed",
			st:   loraState(1, placed("a", "base-0"), placed("b", "base-1")),
			setup: func(r *rig) {
				r.reports.setAdapter("base-0", 1, loaded("a", t0.Add(-time.Hour), 1))
				r.reports.setAdapter("base-1", 2, loaded("b", t0.Add(-10*time.Second), 0))
			},
			req:       &llmgwv1.EnsureAdapterRequest{Adapter: "c"},
			wantState: stateUnspecified, wantRetryMs: 2000, wantResult: "busy",
			wantReason: `adapter "c": every loaded adapter is busy`,
		},
		{
			name: "with no router's report kept, the agents' readings decide: busy",
			st:   loraState(1, placed("a", "base-0"), placed("b", "base-1")),
			setup: func(r *rig) {
				r.reports.setAdapter("base-0", 1, loaded("a", t0, 1))
				r.reports.setAdapter("base-1", 2, loaded("b", t0, 1))
				routerReport(r, "r1", 1)
				r.clock.Add(adapterUseKeep) // the router stopped reporting
			},
			req:       &llmgwv1.EnsureAdapterRequest{Adapter: "c"},
			wantState: stateUnspecified, wantRetryMs: 2000, wantResult: "busy", wantReason: "every loaded adapter is busy",
		},
		{
			name: "an adapter loading or not yet reported is never evicted",
			st:   loraState(1, placed("a", "base-0"), placed("b", "base-1")),
			setup: func(r *rig) {
				r.reports.setAdapter("base-0", 1, loading("a"))
			},
			req:       &llmgwv1.EnsureAdapterRequest{Adapter: "c"},
			wantState: stateUnspecified, wantRetryMs: 2000, wantResult: "busy", wantReason: "every loaded adapter is busy",
		},
		{
			name: "no ready replica: busy",
			st:   loraState(2),
			setup: func(r *rig) {
				setPhases(r, starting, "base-0", "base-1")
			},
			req:       &llmgwv1.EnsureAdapterRequest{Adapter: "a"},
			wantState: stateUnspecified, wantRetryMs: 2000, wantResult: "busy", wantReason: "no ready replica",
		},
		{
			name: "a call for another adapter has waited longer: busy, the slot is its",
			st:   loraState(2),
			setup: func(r *rig) {
				r.l.queue.join("base", queuedCall{adapter: "d", waiting: 3, since: t0.Add(-time.Second)})
			},
			req:       &llmgwv1.EnsureAdapterRequest{Adapter: "a"},
			wantState: stateUnspecified, wantRetryMs: 2000, wantResult: "busy",
			wantReason: `requests for other adapters of model "base" have waited longer`,
		},
		{
			name: "this call's requests have waited longest: placed",
			st:   loraState(2),
			setup: func(r *rig) {
				r.l.queue.join("base", queuedCall{adapter: "d", since: t0.Add(-time.Second)})
			},
			req:        &llmgwv1.EnsureAdapterRequest{Adapter: "a", WaitingSinceUnixNano: t0.Add(-2 * time.Second).UnixNano()},
			agentLoads: true,
			wantState:  stateLoaded, wantOn: []string{"base-0"}, wantResult: "loaded",
			want:         []proposal{setAdapter("base", "a", "base-0")},
			wantAdapterP: map[string]float64{"place": 1},
		},
		{
			name: "a tie goes to the lower adapter name: placed",
			st:   loraState(2),
			setup: func(r *rig) {
				r.l.queue.join("base", queuedCall{adapter: "b", since: t0})
			},
			req:        &llmgwv1.EnsureAdapterRequest{Adapter: "a", WaitingSinceUnixNano: t0.UnixNano()},
			agentLoads: true,
			wantState:  stateLoaded, wantOn: []string{"base-0"}, wantResult: "loaded",
			want:         []proposal{setAdapter("base", "a", "base-0")},
			wantAdapterP: map[string]float64{"place": 1},
		},
		{
			name: "a tie goes to the lower adapter name: busy",
			st:   loraState(2),
			setup: func(r *rig) {
				r.l.queue.join("base", queuedCall{adapter: "a", since: t0})
			},
			req:       &llmgwv1.EnsureAdapterRequest{Adapter: "b", WaitingSinceUnixNano: t0.UnixNano()},
			wantState: stateUnspecified, wantRetryMs: 2000, wantResult: "busy", wantReason: "have waited longer",
		},
		{
			name: "calls queued for the same adapter are not ahead of it",
			st:   loraState(2),
			setup: func(r *rig) {
				r.l.queue.join("base", queuedCall{adapter: "a", since: t0.Add(-time.Hour)})
			},
			req:        &llmgwv1.EnsureAdapterRequest{Adapter: "a"},
			agentLoads: true,
			wantState:  stateLoaded, wantOn: []string{"base-0"}, wantResult: "loaded",
			want:         []proposal{setAdapter("base", "a", "base-0")},
			wantAdapterP: map[string]float64{"place": 1},
		},
		{
			name:    "placing refused by the store",
			st:      loraState(2),
			req:     &llmgwv1.EnsureAdapterRequest{Adapter: "a"},
			fail:    func(proposal) error { return errStore },
			wantErr: errStore, wantErrText: `place adapter "a" on replica base-0: store: not the leader`,
			want: []proposal{setAdapter("base", "a", "base-0")},
		},
		{
			name: "evicting refused by the store: nothing placed",
			st:   loraState(1, placed("a", "base-0"), placed("b", "base-1")),
			setup: func(r *rig) {
				r.reports.setAdapter("base-0", 1, loaded("a", t0.Add(-time.Hour), 0))
				r.reports.setAdapter("base-1", 2, loaded("b", t0.Add(-2*time.Hour), 0))
			},
			req:     &llmgwv1.EnsureAdapterRequest{Adapter: "c"},
			fail:    func(proposal) error { return errStore },
			wantErr: errStore, wantErrText: `evict adapter "b" from replica base-1`,
			want: []proposal{setAdapter("base", "b")},
		},
		{
			name: "clearing a failed placement refused by the store: nothing placed",
			st:   loraState(2, placed("a", "base-0")),
			setup: func(r *rig) {
				r.reports.setAdapter("base-0", 1, failedLoad("a", "bad path", t0.Add(-time.Second)))
			},
			req:     &llmgwv1.EnsureAdapterRequest{Adapter: "a"},
			fail:    func(proposal) error { return errStore },
			wantErr: errStore, wantErrText: `clear failed placement of adapter "a"`,
			want: []proposal{setAdapter("base", "a")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, cfg, tt.st)
			setPhases(r, ready, "base-0", "base-1")
			if tt.setup != nil {
				tt.setup(r)
			}
			if tt.agentLoads {
				agentLoads(r)
			}
			r.prop.fail = tt.fail
			wait := tt.wait
			if wait == 0 {
				wait = 5 * time.Second
			}
			resp, result, err := r.l.EnsureAdapter(context.Background(), tt.req, wait)
			wantProposals(t, r.prop.proposed(), tt.want)
			for _, action := range []string{"place", "evict", "retry"} {
				if got := testkit.Metric(t, r.reg, adapterPlMetric, testkit.Labels{"action": action}); got != tt.wantAdapterP[action] {
					t.Errorf("%s{action=%s} = %v, want %v", adapterPlMetric, action, got, tt.wantAdapterP[action])
				}
			}
			if got := testkit.Metric(t, r.reg, waitersMetric, nil); got != 0 {
				t.Errorf("%s = %v after the call returned", waitersMetric, got)
			}
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantErrText) {
					t.Fatalf("err %v, want %q wrapping %v", err, tt.wantErrText, tt.wantErr)
				}
				if resp != nil || result != "" {
					t.Fatalf("an error with response %v, result %q", resp, result)
				}
				if got := testkit.Metric(t, r.reg, ensureMetric, nil); got != 0 {
					t.Fatalf("%s observed %v calls that failed", ensureMetric, got)
				}
				return
			}
			if err != nil {
				t.Fatalf("EnsureAdapter: %v", err)
			}
			if resp.State != tt.wantState || !slices.Equal(resp.LoadedOn, tt.wantOn) || resp.RetryAfterMs != tt.wantRetryMs ||
				!strings.Contains(resp.Reason, tt.wantReason) || resp.Queued || result != tt.wantResult {
				t.Fatalf("got %v (result %q), want state %v on %v, retry_after_ms %d, reason with %q, result %q",
					resp, result, tt.wantState, tt.wantOn, tt.wantRetryMs, tt.wantReason, tt.wantResult)
			}
			if got := testkit.Metric(t, r.reg, ensureMetric, testkit.Labels{"result": tt.wantResult}); got != 1 {
				t.Fatalf("%s{result=%s} observed %v calls, want 1", ensureMetric, tt.wantResult, got)
			}
		})
	}
}

// TestEnsureAdapterWakes: a call waiting for an adapter placed before it
// answers as soon as what it waits for changes, whether an agent's report
// or an applied entry, without a poll or the end of its wait.
func TestEnsureAdapterWakes(t *testing.T) {
	for _, tt := range []struct {
		name   string
		setup  func(r *rig) // before the call
		change func(r *rig) // once the call waits
		want   string       // the replica it is loaded on
	}{
		{
			name:   "on an agent's report",
			change: func(r *rig) { r.reports.setAdapter("base-0", 1, loaded("a", t0, 0)) },
			want:   "base-0",
		},
		{
			name: "on an applied entry",
			// The adapter, already loaded on base-1, is placed there too.
			setup: func(r *rig) { r.reports.setAdapter("base-1", 2, loaded("a", t0, 0)) },
			change: func(r *rig) {
				r.desired.update(func(st *llmgwv1.State) { st.AdapterPlacements[0].Replicas = []string{"base-0", "base-1"} })
			},
			want: "base-1",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, testConfig(), loraState(2, placed("a", "base-0")))
			setPhases(r, ready, "base-0", "base-1")
			r.reports.setAdapter("base-0", 1, loading("a"))
			if tt.setup != nil {
				tt.setup(r)
			}
			type answer struct {
				resp *llmgwv1.EnsureAdapterResponse
				err  error
			}
			done := make(chan answer, 1)
			go func() {
				resp, _, err := r.l.EnsureAdapter(context.Background(), &llmgwv1.EnsureAdapterRequest{Adapter: "a"}, testkit.DefaultTimeout)
				done <- answer{resp, err}
			}()
			testkit.Wait(t, "the call's first round to read the reports", func() bool { return r.reports.adapterReads.Load() > 0 })
			tt.change(r)
			got := <-done
			if got.err != nil || got.resp.State != stateLoaded || !slices.Equal(got.resp.LoadedOn, []string{tt.want}) {
				t.Fatalf("got %v, %v; want loaded on %s", got.resp, got.err, tt.want)
			}
			wantProposals(t, r.prop.proposed(), nil)
		})
	}
}

// TestEnsureAdapterSingleFlight: many calls for one cold adapter at once
// place it once (design §7.6), and all of them see it loaded.
func TestEnsureAdapterSingleFlight(t *testing.T) {
	r := newRig(t, testConfig(), loraState(2))
	setPhases(r, ready, "base-0", "base-1")
	agentLoads(r)
	const calls = 8
	// Every call waits for the placement lock while the first of them
	// holds it: the calls after it find the adapter placed when they get
	// it (the re-read under the lock).
	r.l.adapterMu.Lock()
	var wg sync.WaitGroup
	resps := make([]*llmgwv1.EnsureAdapterResponse, calls)
	errs := make([]error, calls)
	for i := range calls {
		wg.Go(func() {
			resps[i], _, errs[i] = r.l.EnsureAdapter(context.Background(), &llmgwv1.EnsureAdapterRequest{Adapter: "a"}, 5*time.Second)
		})
	}
	testkit.WaitMetric(t, r.reg, waitersMetric, nil, calls)
	r.l.adapterMu.Unlock()
	wg.Wait()
	for i := range calls {
		if errs[i] != nil || resps[i].State != stateLoaded || !slices.Equal(resps[i].LoadedOn, []string{"base-0"}) {
			t.Fatalf("call %d: %v, %v", i, resps[i], errs[i])
		}
	}
	wantProposals(t, r.prop.proposed(), []proposal{setAdapter("base", "a", "base-0")})
}

// TestEnsureAdapterJustPlacedIsNotIdle: an adapter this leader placed
// counts as used, with a request, for AdapterMinIdle after it placed it,
// whatever the agent reports: the requests it was placed for may still be
// on their way. After that it may be evicted.
func TestEnsureAdapterJustPlacedIsNotIdle(t *testing.T) {
	cfg := testConfig()
	st := loraState(1)
	st.Replicas = st.Replicas[:1] // base-0 alone: one slot
	r := newRig(t, cfg, st)
	setPhases(r, ready, "base-0")
	agentLoads(r)
	ensure := func(adapter string) *llmgwv1.EnsureAdapterResponse {
		t.Helper()
		resp, _, err := r.l.EnsureAdapter(context.Background(), &llmgwv1.EnsureAdapterRequest{Adapter: adapter}, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if resp := ensure("a"); resp.State != stateLoaded {
		t.Fatalf("a: %v", resp)
	}
	r.clock.Add(cfg.AdapterMinIdle - time.Millisecond)
	if resp := ensure("b"); resp.State != stateUnspecified || resp.RetryAfterMs != cfg.AdapterRetryAfter.Milliseconds() {
		t.Fatalf("b, with a placed %v ago: %v, want busy", cfg.AdapterMinIdle-time.Millisecond, resp)
	}
	r.clock.Add(time.Millisecond)
	if resp := ensure("b"); resp.State != stateLoaded {
		t.Fatalf("b, with a placed AdapterMinIdle ago: %v, want loaded", resp)
	}
	wantProposals(t, r.prop.proposed(), []proposal{
		setAdapter("base", "a", "base-0"), setAdapter("base", "a"), setAdapter("base", "b", "base-0"),
	})
	if _, ok := r.l.placedAt[adapterKey{"a", "base-0"}]; ok {
		t.Fatal("the evicted adapter's placement time is still remembered")
	}
	if at := r.l.placedAt[adapterKey{"b", "base-0"}]; !at.Equal(t0.Add(cfg.AdapterMinIdle)) {
		t.Fatalf("b placed at %v, want %v", at, t0.Add(cfg.AdapterMinIdle))
	}
}

// TestEnsureAdapterQueued: a call that may queue waits in its model's queue
// while every slot is busy (a runs a request, b was used within
// AdapterMinIdle), keeps later calls for other adapters out, and takes the
// slot when one turns idle (found by its poll: nothing announces it).
func TestEnsureAdapterQueued(t *testing.T) {
	r := newRig(t, testConfig(), loraState(1, placed("a", "base-0"), placed("b", "base-1")))
	setPhases(r, ready, "base-0", "base-1")
	r.reports.setAdapter("base-0", 1, loaded("a", t0, 1))
	r.reports.setAdapter("base-1", 2, loaded("b", t0.Add(-30*time.Second), 0))
	agentLoads(r)

	type answer struct {
		resp   *llmgwv1.EnsureAdapterResponse
		result string
		err    error
	}
	done := make(chan answer, 1)
	go func() {
		resp, result, err := r.l.EnsureAdapter(context.Background(),
			&llmgwv1.EnsureAdapterRequest{Adapter: "c", Queue: true, Waiting: 2, WaitingSinceUnixNano: t0.Add(-time.Second).UnixNano()}, testkit.DefaultTimeout)
		done <- answer{resp, result, err}
	}()
	testkit.WaitMetric(t, r.reg, queuedMetric, nil, 1)
	if n := r.l.queue.length("base"); n != 1 {
		t.Fatalf("%d calls in base's queue, want 1", n)
	}

	// A later call for another adapter, not queuing: busy, behind c.
	resp, result, err := r.l.EnsureAdapter(context.Background(), &llmgwv1.EnsureAdapterRequest{Adapter: "d"}, 5*time.Second)
	if err != nil || result != "busy" || !strings.Contains(resp.Reason, "have waited longer") {
		t.Fatalf("d while c waits: %v (%q), %v", resp, result, err)
	}
	wantProposals(t, r.prop.proposed(), nil)

	// b turns idle by time passing, which no report or applied entry
	// announces: the queued call's poll finds it.
	r.clock.Add(30 * time.Second)

	var got answer
	select {
	case got = <-done:
	case <-time.After(testkit.DefaultTimeout):
		t.Fatal("the queued call did not take the freed slot")
	}
	if got.err != nil || got.resp.State != stateLoaded || !slices.Equal(got.resp.LoadedOn, []string{"base-1"}) || !got.resp.Queued || got.result != "loaded" {
		t.Fatalf("queued call: %v (%q), %v; want loaded on base-1, queued", got.resp, got.result, got.err)
	}
	wantProposals(t, r.prop.proposed(), []proposal{setAdapter("base", "b"), setAdapter("base", "c", "base-1")})
	if got := testkit.Metric(t, r.reg, queuedMetric, nil); got != 0 {
		t.Fatalf("%s = %v after the queued call returned", queuedMetric, got)
	}
	if n := r.l.queue.length("base"); n != 0 {
		t.Fatalf("%d calls left in base's queue", n)
	}
}

// TestEnsureAdapterQueueTimeout: a queued call whose wait ends before a
// slot frees answers LOADING, queued, saying how many calls wait, and
// leaves the queue. Its wait spans a few polls, each of which finds every
// slot still busy and stays in the queue.
func TestEnsureAdapterQueueTimeout(t *testing.T) {
	r := newRig(t, testConfig(), loraState(1, placed("a", "base-0"), placed("b", "base-1")))
	setPhases(r, ready, "base-0", "base-1")
	r.reports.setAdapter("base-0", 1, loaded("a", t0, 1))
	r.reports.setAdapter("base-1", 2, loaded("b", t0, 1))
	resp, result, err := r.l.EnsureAdapter(context.Background(), &llmgwv1.EnsureAdapterRequest{Adapter: "c", Queue: true}, 250*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	want := `adapter "c": no slot of model "base" freed within 250ms (1 calls wait for one)`
	if resp.State != stateLoading || !resp.Queued || resp.Reason != want || resp.RetryAfterMs != 2000 || result != "timeout" {
		t.Fatalf("got %v (%q), want LOADING, queued, %q", resp, result, want)
	}
	wantProposals(t, r.prop.proposed(), nil)
	if got := testkit.Metric(t, r.reg, queuedMetric, nil); got != 0 {
		t.Fatalf("%s = %v after the call returned", queuedMetric, got)
	}
	if n := r.l.queue.length("base"); n != 0 {
		t.Fatalf("%d calls left in base's queue", n)
	}
}

// TestEnsureAdapterCancelled: a call whose context ends while it waits
// returns the context's error, and no figure counts it.
func TestEnsureAdapterCancelled(t *testing.T) {
	r := newRig(t, testConfig(), loraState(2, placed("a", "base-0")))
	setPhases(r, ready, "base-0", "base-1")
	r.reports.setAdapter("base-0", 1, loading("a"))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	resp, _, err := r.l.EnsureAdapter(ctx, &llmgwv1.EnsureAdapterRequest{Adapter: "a"}, time.Hour)
	if !errors.Is(err, context.Canceled) || resp != nil {
		t.Fatalf("got %v, %v; want context.Canceled", resp, err)
	}
	if got := testkit.Metric(t, r.reg, ensureMetric, nil); got != 0 {
		t.Fatalf("%s observed %v cancelled calls", ensureMetric, got)
	}
}
