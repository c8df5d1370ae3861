package leader

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

const (
	ready    = llmgwv1.ReplicaPhase_REPLICA_PHASE_READY
	starting = llmgwv1.ReplicaPhase_REPLICA_PHASE_STARTING
	stopped  = llmgwv1.ReplicaPhase_REPLICA_PHASE_STOPPED
	failedPh = llmgwv1.ReplicaPhase_REPLICA_PHASE_FAILED

	placementsMetric = "llmgw_control_placement_decisions_total"
)

func status(id string, uid uint64, phase llmgwv1.ReplicaPhase) *llmgwv1.ReplicaStatus {
	return &llmgwv1.ReplicaStatus{ReplicaId: id, Uid: uid, Phase: phase}
}

func report(r *rig, statuses ...*llmgwv1.ReplicaStatus) {
	for _, s := range statuses {
		r.reports.setPhase(s.ReplicaId, s.Uid, s.Phase)
	}
}

// TestReconcileOnce: one round of placement turns the desired state and
// the agents' reports into the commands the leader proposes, in order
// (removals, then drains, then placements), and proposes nothing when
// every model has its replicas.
func TestReconcileOnce(t *testing.T) {
	drainingNode := node("n3", 8, llmgwv1.NodeState_NODE_STATE_DRAINING)
	tests := []struct {
		name    string
		st      *llmgwv1.State
		reports []*llmgwv1.ReplicaStatus
		want    []proposal
		wantLog string
	}{
		{
			name: "a new model's replicas spread over the active nodes",
			st: &llmgwv1.State{Nodes: []*llmgwv1.Node{active("n1", 2), active("n2", 2), drainingNode},
				Models: []*llmgwv1.Model{model("m", 3, 1)}},
			want: []proposal{place("m", "n1", 0), place("m", "n2", 0), place("m", "n1", 1)},
		},
		{
			name: "a multi-GPU replica takes the lowest free GPUs of the node with most free",
			st: &llmgwv1.State{Nodes: []*llmgwv1.Node{active("n1", 4), active("n2", 2)},
				Models:   []*llmgwv1.Model{model("o", 1, 1), model("big", 1, 2)},
				Replicas: []*llmgwv1.Replica{replica("o-0", 1, "o", "n1", 0)}},
			reports: []*llmgwv1.ReplicaStatus{status("o-0", 1, ready)},
			want:    []proposal{place("big", "n1", 1, 2)},
		},
		{
			name: "a node selector keeps replicas off other nodes",
			st: &llmgwv1.State{
				Nodes:  []*llmgwv1.Node{active("n1", 4), {Id: "n2", Gpus: 1, State: llmgwv1.NodeState_NODE_STATE_ACTIVE, Labels: map[string]string{"gpu": "h100"}}},
				Models: []*llmgwv1.Model{{Name: "m", Engine: "vllm", Replicas: 2, GpusPerReplica: 1, NodeSelector: map[string]string{"gpu": "h100"}}}},
			want:    []proposal{place("m", "n2", 0)},
			wantLog: "replicas cannot be placed",
		},
		{
			name:    "nothing fits: nothing proposed",
			st:      &llmgwv1.State{Nodes: []*llmgwv1.Node{active("n1", 2)}, Models: []*llmgwv1.Model{model("m", 1, 4)}},
			wantLog: "replicas cannot be placed",
		},
		{
			name: "every replica placed and ready: nothing to do",
			st: &llmgwv1.State{Nodes: []*llmgwv1.Node{active("n1", 1), active("n2", 1)}, Models: []*llmgwv1.Model{model("m", 2, 1)},
				Replicas: []*llmgwv1.Replica{replica("m-0", 1, "m", "n1", 0), replica("m-1", 2, "m", "n2", 0)}},
			reports: []*llmgwv1.ReplicaStatus{status("m-0", 1, ready), status("m-1", 2, ready)},
		},
		{
			name: "replicas still starting: nothing to do",
			st: &llmgwv1.State{Nodes: []*llmgwv1.Node{active("n1", 2)}, Models: []*llmgwv1.Model{model("m", 2, 1)},
				Replicas: []*llmgwv1.Replica{replica("m-0", 1, "m", "n1", 0), replica("m-1", 2, "m", "n1", 1)}},
			reports: []*llmgwv1.ReplicaStatus{status("m-0", 1, starting)},
		},
		{
			name: "replicas crowded on one node: a replacement goes to an empty one",
			st: &llmgwv1.State{Nodes: []*llmgwv1.Node{active("n1", 2), active("n2", 1)}, Models: []*llmgwv1.Model{model("m", 2, 1)},
				Replicas: []*llmgwv1.Replica{replica("m-0", 1, "m", "n1", 0), replica("m-1", 2, "m", "n1", 1)}},
			reports: []*llmgwv1.ReplicaStatus{status("m-0", 1, ready), status("m-1", 2, ready)},
			want:    []proposal{place("m", "n2", 0)},
			wantLog: "spreading replicas",
		},
		{
			name: "scale down drains the newest replica",
			st: &llmgwv1.State{Nodes: []*llmgwv1.Node{active("n1", 1), active("n2", 1)}, Models: []*llmgwv1.Model{model("m", 1, 1)},
				Replicas: []*llmgwv1.Replica{replica("m-0", 1, "m", "n1", 0), replica("m-1", 2, "m", "n2", 0)}},
			reports: []*llmgwv1.ReplicaStatus{status("m-0", 1, ready), status("m-1", 2, ready)},
			want:    []proposal{drain("m-1", 2)},
		},
		{
			name: "scale down drains a replica that is not ready first",
			st: &llmgwv1.State{Nodes: []*llmgwv1.Node{active("n1", 1), active("n2", 1)}, Models: []*llmgwv1.Model{model("m", 1, 1)},
				Replicas: []*llmgwv1.Replica{replica("m-0", 1, "m", "n1", 0), replica("m-1", 2, "m", "n2", 0)}},
			reports: []*llmgwv1.ReplicaStatus{status("m-0", 1, starting), status("m-1", 2, ready)},
			want:    []proposal{drain("m-0", 1)},
		},
		{
			name: "scale down takes from the node holding the most",
			st: &llmgwv1.State{Nodes: []*llmgwv1.Node{active("n1", 2), active("n2", 1)}, Models: []*llmgwv1.Model{model("m", 2, 1)},
				Replicas: []*llmgwv1.Replica{replica("m-0", 1, "m", "n1", 0), replica("m-1", 2, "m", "n1", 1), replica("m-2", 3, "m", "n2", 0)}},
			reports: []*llmgwv1.ReplicaStatus{status("m-0", 1, ready), status("m-1", 2, ready), status("m-2", 3, ready)},
			want:    []proposal{drain("m-1", 2)},
		},
		{
			name: "a drained replica whose engine stopped is removed",
			st: &llmgwv1.State{Nodes: []*llmgwv1.Node{active("n1", 1), active("n2", 1)}, Models: []*llmgwv1.Model{model("m", 1, 1)},
				Replicas: []*llmgwv1.Replica{replica("m-0", 1, "m", "n1", 0), draining(replica("m-1", 2, "m", "n2", 0))}},
			reports: []*llmgwv1.ReplicaStatus{status("m-0", 1, ready), status("m-1", 2, stopped)},
			want:    []proposal{remove("m-1", 2)},
		},
		{
			name: "a draining replica whose engine failed is removed",
			st: &llmgwv1.State{Nodes: []*llmgwv1.Node{active("n1", 1), active("n2", 1)}, Models: []*llmgwv1.Model{model("m", 1, 1)},
				Replicas: []*llmgwv1.Replica{replica("m-0", 1, "m", "n1", 0), draining(replica("m-1", 2, "m", "n2", 0))}},
			reports: []*llmgwv1.ReplicaStatus{status("m-0", 1, ready), status("m-1", 2, failedPh)},
			want:    []proposal{remove("m-1", 2)},
		},
		{
			name: "a draining replica its agent does not report (for its uid) is removed",
			st: &llmgwv1.State{Nodes: []*llmgwv1.Node{active("n1", 1), active("n2", 1)}, Models: []*llmgwv1.Model{model("m", 1, 1)},
				Replicas: []*llmgwv1.Replica{replica("m-0", 1, "m", "n1", 0), draining(replica("m-1", 2, "m", "n2", 0))}},
			reports: []*llmgwv1.ReplicaStatus{status("m-0", 1, ready), status("m-1", 7, ready)},
			want:    []proposal{remove("m-1", 2)},
		},
		{
			name: "a draining replica still serving stays until the drain timeout",
			st: &llmgwv1.State{Nodes: []*llmgwv1.Node{active("n1", 1), active("n2", 1)}, Models: []*llmgwv1.Model{model("m", 1, 1)},
				Replicas: []*llmgwv1.Replica{replica("m-0", 1, "m", "n1", 0), draining(replica("m-1", 2, "m", "n2", 0))}},
			reports: []*llmgwv1.ReplicaStatus{status("m-0", 1, ready), status("m-1", 2, ready)},
		},
		{
			name: "a replica on a draining node gets a replacement first",
			st: &llmgwv1.State{Nodes: []*llmgwv1.Node{drainingNode, active("n2", 1), active("n4", 1)}, Models: []*llmgwv1.Model{model("m", 2, 1)},
				Replicas: []*llmgwv1.Replica{replica("m-0", 1, "m", "n3", 0), replica("m-1", 2, "m", "n2", 0)}},
			reports: []*llmgwv1.ReplicaStatus{status("m-0", 1, ready), status("m-1", 2, ready)},
			want:    []proposal{place("m", "n4", 0)},
		},
		{
			name: "once the replacement is ready the replica on the draining node drains",
			st: &llmgwv1.State{Nodes: []*llmgwv1.Node{drainingNode, active("n2", 1), active("n4", 1)}, Models: []*llmgwv1.Model{model("m", 2, 1)},
				Replicas: []*llmgwv1.Replica{replica("m-0", 1, "m", "n3", 0), replica("m-1", 2, "m", "n2", 0), replica("m-2", 3, "m", "n4", 0)}},
			reports: []*llmgwv1.ReplicaStatus{status("m-0", 1, ready), status("m-1", 2, ready), status("m-2", 3, ready)},
			want:    []proposal{drain("m-0", 1)},
		},
		{
			name: "removals, drains and placements of several models, in that order",
			st: &llmgwv1.State{Nodes: []*llmgwv1.Node{active("n1", 2), active("n2", 2)}, Models: []*llmgwv1.Model{model("a", 1, 1), model("b", 1, 1)},
				Replicas: []*llmgwv1.Replica{replica("a-0", 1, "a", "n1", 0), replica("a-1", 2, "a", "n2", 0), draining(replica("b-0", 3, "b", "n1", 1))}},
			reports: []*llmgwv1.ReplicaStatus{status("a-0", 1, ready), status("a-1", 2, ready), status("b-0", 3, stopped)},
			want:    []proposal{remove("b-0", 3), drain("a-1", 2), place("b", "n2", 1)},
		},
		{
			name: "an external engine's endpoints are owned by agents, one replica each",
			st: &llmgwv1.State{Nodes: []*llmgwv1.Node{active("n1", 0), active("n2", 0)},
				Models: []*llmgwv1.Model{{Name: "ext", Engine: "external", Replicas: 2, Endpoints: []string{"127.0.0.1:41401", "127.0.0.1:41402"}}}},
			want: []proposal{
				{llmgwv1.CommandType_COMMAND_TYPE_PLACE_REPLICA, &llmgwv1.PlaceReplicaCommand{Replica: &llmgwv1.Replica{Model: "ext", Node: "n1", Endpoint: "127.0.0.1:41401", Weight: 1}}},
				{llmgwv1.CommandType_COMMAND_TYPE_PLACE_REPLICA, &llmgwv1.PlaceReplicaCommand{Replica: &llmgwv1.Replica{Model: "ext", Node: "n2", Endpoint: "127.0.0.1:41402", Weight: 1}}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, testConfig(), tt.st)
			report(r, tt.reports...)
			if failed := r.l.reconcileOnce(context.Background(), newTerm(r.clock.Now())); failed {
				t.Fatal("reconcileOnce reported a failed decision; the fake refuses none")
			}
			wantProposals(t, r.prop.proposed(), tt.want)
			if got := testkit.Metric(t, r.reg, placementsMetric, testkit.Labels{"result": "ok"}); got != float64(len(tt.want)) {
				t.Fatalf("%s{result=ok} = %v, want %d", placementsMetric, got, len(tt.want))
			}
			if tt.wantLog != "" && !strings.Contains(r.logs.String(), tt.wantLog) {
				t.Fatalf("log lacks %q", tt.wantLog)
			}
		})
	}
}

// TestReconcileReschedulesFromDownNode: the replicas of a DOWN node are
// left alone for RescheduleAfter, counted by the leader's own clock from
// when it first saw the node DOWN; then they are removed and placed
// elsewhere. A node that comes back ACTIVE in between starts the count
// anew.
func TestReconcileReschedulesFromDownNode(t *testing.T) {
	cfg := testConfig()
	st := &llmgwv1.State{
		Nodes:    []*llmgwv1.Node{node("n1", 1, llmgwv1.NodeState_NODE_STATE_DOWN), active("n2", 1)},
		Models:   []*llmgwv1.Model{model("m", 1, 1)},
		Replicas: []*llmgwv1.Replica{replica("m-0", 1, "m", "n1", 0)},
	}
	r := newRig(t, cfg, st)
	report(r, status("m-0", 1, ready))
	term := newTerm(r.clock.Now())
	round := func(step string, want ...proposal) {
		t.Helper()
		r.prop.reset()
		if r.l.reconcileOnce(context.Background(), term) {
			t.Fatalf("%s: a decision failed", step)
		}
		got := r.prop.proposed()
		if len(got) != len(want) {
			t.Fatalf("%s: proposed\n  %s\nwant\n  %s", step, list(got), list(want))
		}
		wantProposals(t, got, want)
	}
	setState := func(s llmgwv1.NodeState) {
		r.desired.update(func(st *llmgwv1.State) { st.Nodes[0].State = s })
	}

	round("first seen down")
	r.clock.Add(cfg.RescheduleAfter / 2)
	round("half the grace")
	setState(llmgwv1.NodeState_NODE_STATE_ACTIVE)
	round("back active")
	setState(llmgwv1.NodeState_NODE_STATE_DOWN)
	round("down again: the count starts anew")
	r.clock.Add(cfg.RescheduleAfter - time.Millisecond)
	round("just within the grace")
	r.clock.Add(time.Millisecond)
	round("grace over", remove("m-0", 1), place("m", "n2", 0))
}

// TestReconcileDrainTimeout: a draining replica that still reports READY
// is removed once the leader has seen it draining for DrainTimeout, by its
// own clock; one that stops draining is forgotten.
func TestReconcileDrainTimeout(t *testing.T) {
	cfg := testConfig()
	st := &llmgwv1.State{
		Nodes:    []*llmgwv1.Node{active("n1", 3)},
		Models:   []*llmgwv1.Model{model("m", 1, 1)},
		Replicas: []*llmgwv1.Replica{replica("m-0", 1, "m", "n1", 0), draining(replica("m-1", 2, "m", "n1", 1)), draining(replica("m-2", 3, "m", "n1", 2))},
	}
	r := newRig(t, cfg, st)
	report(r, status("m-0", 1, ready), status("m-1", 2, ready), status("m-2", 3, ready))
	term := newTerm(r.clock.Now())
	ctx := context.Background()

	r.l.reconcileOnce(ctx, term)
	wantProposals(t, r.prop.proposed(), nil)
	if len(term.drainSeen) != 2 {
		t.Fatalf("drainSeen %v, want both draining replicas", term.drainSeen)
	}
	// m-2 leaves the state (removed by someone else): forgotten.
	r.desired.update(func(st *llmgwv1.State) { st.Replicas = st.Replicas[:2] })
	r.clock.Add(cfg.DrainTimeout - time.Millisecond)
	r.l.reconcileOnce(ctx, term)
	wantProposals(t, r.prop.proposed(), nil)
	if _, ok := term.drainSeen[replicaKey{"m-2", 3}]; ok || len(term.drainSeen) != 1 {
		t.Fatalf("drainSeen %v, want only m-1", term.drainSeen)
	}
	r.clock.Add(time.Millisecond)
	r.l.reconcileOnce(ctx, term)
	wantProposals(t, r.prop.proposed(), []proposal{remove("m-1", 2)})
}

// TestMarkDown: an ACTIVE node without an agent session for NodeDownAfter
// is marked DOWN, the count starting no earlier than the term (the grace
// after winning office); a leader that cannot see every server's sessions
// judges no node.
func TestMarkDown(t *testing.T) {
	cfg := testConfig()
	tests := []struct {
		name    string
		state   llmgwv1.NodeState
		visible bool
		// detached is since when the node has had no session, relative to
		// the term's start; nil: a session is attached.
		detached *time.Duration
		elapsed  time.Duration // since the term's start
		want     []proposal
	}{
		{"session attached", llmgwv1.NodeState_NODE_STATE_ACTIVE, true, nil, time.Hour, nil},
		{"detached for NodeDownAfter", llmgwv1.NodeState_NODE_STATE_ACTIVE, true, ptr(0), cfg.NodeDownAfter, []proposal{nodeDown("n1")}},
		{"detached not quite long enough", llmgwv1.NodeState_NODE_STATE_ACTIVE, true, ptr(0), cfg.NodeDownAfter - time.Millisecond, nil},
		{"detached long before the term: grace from the term's start", llmgwv1.NodeState_NODE_STATE_ACTIVE, true, ptr(-time.Hour), cfg.NodeDownAfter - time.Millisecond, nil},
		{"detached long before the term, grace over", llmgwv1.NodeState_NODE_STATE_ACTIVE, true, ptr(-time.Hour), cfg.NodeDownAfter, []proposal{nodeDown("n1")}},
		{"detached during the term", llmgwv1.NodeState_NODE_STATE_ACTIVE, true, ptr(time.Minute), time.Minute + cfg.NodeDownAfter, []proposal{nodeDown("n1")}},
		{"sessions on other servers invisible", llmgwv1.NodeState_NODE_STATE_ACTIVE, false, ptr(0), time.Hour, nil},
		{"a draining node is not judged", llmgwv1.NodeState_NODE_STATE_DRAINING, true, ptr(0), time.Hour, nil},
		{"a node already down is not marked again", llmgwv1.NodeState_NODE_STATE_DOWN, true, ptr(0), time.Hour, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, cfg, &llmgwv1.State{Nodes: []*llmgwv1.Node{node("n1", 0, tt.state)}})
			r.l.cluster = fakeCluster{visible: tt.visible}
			term := newTerm(r.clock.Now())
			if tt.detached != nil {
				r.sessions.detached["n1"] = t0.Add(*tt.detached)
			}
			r.clock.Add(tt.elapsed)
			if _, failed := r.l.markDown(context.Background(), term, r.desired.State(), r.clock.Now()); failed {
				t.Fatal("markDown reported a failure; the fake refuses nothing")
			}
			wantProposals(t, r.prop.proposed(), tt.want)
		})
	}
}

func ptr(d time.Duration) *time.Duration { return &d }

var errStore = errors.New("store: not the leader")

// TestReconcileRefused: a refused decision is counted and logged, the
// other decisions of the round are still proposed, and reconcileOnce
// reports the failure (Place then waits for its tick). A cancelled
// proposal (the term ended) is counted but not logged.
func TestReconcileRefused(t *testing.T) {
	cfg := testConfig()
	for _, tt := range []struct {
		name    string
		err     error
		wantLog bool
	}{
		{"store refuses", fmt.Errorf("propose: %w", errStore), true},
		{"term ended", fmt.Errorf("propose: %w", context.Canceled), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st := &llmgwv1.State{
				Nodes:    []*llmgwv1.Node{active("n1", 2), active("n2", 2), active("n3", 1)},
				Models:   []*llmgwv1.Model{model("m", 2, 1), model("x", 1, 1)},
				Replicas: []*llmgwv1.Replica{draining(replica("x-0", 1, "x", "n3", 0))},
			}
			r := newRig(t, cfg, st)
			r.sessions.detached["n3"] = t0.Add(-time.Hour)
			r.clock.Add(cfg.NodeDownAfter)
			r.prop.fail = func(p proposal) error {
				if p.typ == llmgwv1.CommandType_COMMAND_TYPE_REMOVE_REPLICA {
					return nil
				}
				return tt.err
			}
			if !r.l.reconcileOnce(context.Background(), newTerm(t0)) {
				t.Fatal("reconcileOnce did not report the refused decisions")
			}
			wantProposals(t, r.prop.proposed(), []proposal{
				nodeDown("n3"), remove("x-0", 1), place("m", "n1", 0), place("m", "n2", 0), place("x", "n1", 1),
			})
			for _, c := range []struct {
				action, result string
				want           float64
			}{{"place", "failed", 3}, {"remove", "ok", 1}, {"place", "ok", 0}} {
				if got := testkit.Metric(t, r.reg, placementsMetric, testkit.Labels{"action": c.action, "result": c.result}); got != c.want {
					t.Errorf("%s{action=%s,result=%s} = %v, want %v", placementsMetric, c.action, c.result, got, c.want)
				}
			}
			logs := r.logs.String()
			if !strings.Contains(logs, "marking node down failed") {
				t.Error("the refused SET_NODE_STATE is not logged")
			}
			if got := strings.Count(logs, "placement decision failed"); tt.wantLog && got != 3 {
				t.Errorf("%d refused placements logged, want 3", got)
			} else if !tt.wantLog && got != 0 {
				t.Errorf("%d cancelled placements logged, want none", got)
			}
		})
	}
}

// startPlace runs Place until the test ends, and waits for it to return.
func startPlace(t *testing.T, r *rig) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.l.Place(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(testkit.DefaultTimeout):
			t.Error("Place did not return after its context ended")
		}
	})
}

func replicaIDs(st *llmgwv1.State) []string {
	var ids []string
	for _, r := range st.Replicas {
		ids = append(ids, fmt.Sprintf("%s@%s", r.Id, r.Node))
	}
	return ids
}

// TestPlaceRunsToConvergence: Place runs a round on every applied entry,
// so a new model's replicas are proposed one round after the apply, with
// no tick; and it returns when its context ends.
func TestPlaceRunsToConvergence(t *testing.T) {
	r := newRig(t, testConfig(), &llmgwv1.State{Nodes: []*llmgwv1.Node{active("n1", 1), active("n2", 1)}})
	startPlace(t, r)
	r.desired.update(func(st *llmgwv1.State) { st.Models = append(st.Models, model("m", 2, 1)) })
	testkit.Wait(t, "two replicas of m placed", func() bool { return len(r.desired.State().Replicas) == 2 })
	wantProposals(t, r.prop.proposed(), []proposal{place("m", "n1", 0), place("m", "n2", 0)})
	testkit.WaitMetric(t, r.reg, placementsMetric, testkit.Labels{"action": "place", "result": "ok"}, 2)

	// Scale down: the next applied entry drains one; its agent's report
	// that the engine stopped (no apply, no tick) removes it.
	report(r, status("m-0", 1, ready), status("m-1", 2, ready))
	r.prop.reset()
	r.desired.update(func(st *llmgwv1.State) { st.Models[0].Replicas = 1 })
	testkit.Wait(t, "m-1 draining", func() bool {
		st := r.desired.State()
		return len(st.Replicas) == 2 && st.Replicas[1].Draining
	})
	report(r, status("m-1", 2, stopped))
	testkit.Wait(t, "m-1 removed", func() bool { return len(r.desired.State().Replicas) == 1 })
	wantProposals(t, r.prop.proposed(), []proposal{drain("m-1", 2), remove("m-1", 2)})
	if got := replicaIDs(r.desired.State()); len(got) != 1 || got[0] != "m-0@n1" {
		t.Fatalf("replicas %v, want m-0@n1", got)
	}
}

// TestPlaceRetriesRefusedOnTick: after a refused decision Place does not
// run again on the next applied entry or report (it would recompute the
// same decision), but on its ReconcileInterval tick.
func TestPlaceRetriesRefusedOnTick(t *testing.T) {
	t.Run("not on an applied entry", func(t *testing.T) {
		r := newRig(t, testConfig(), &llmgwv1.State{Nodes: []*llmgwv1.Node{active("n1", 1)}, Models: []*llmgwv1.Model{model("m", 1, 1)}})
		r.prop.fail = func(proposal) error { return errStore }
		startPlace(t, r)
		testkit.Wait(t, "the first placement proposed", func() bool { return len(r.prop.proposed()) == 1 })
		r.desired.update(func(st *llmgwv1.State) { st.Nodes[0].Labels = map[string]string{"a": "b"} })
		report(r, status("other", 1, ready))
		// A bound on noticing a regression, not a condition to wait for:
		// the loop, were it woken, would propose again well within it.
		time.Sleep(200 * time.Millisecond)
		if got := r.prop.proposed(); len(got) != 1 {
			t.Fatalf("a refused decision was proposed again without a tick:\n  %s", list(got))
		}
	})
	t.Run("on the tick", func(t *testing.T) {
		cfg := testConfig()
		cfg.ReconcileInterval = 20 * time.Millisecond
		r := newRig(t, cfg, &llmgwv1.State{Nodes: []*llmgwv1.Node{active("n1", 1)}, Models: []*llmgwv1.Model{model("m", 1, 1)}})
		refusals := 2
		r.prop.fail = func(proposal) error {
			if refusals == 0 {
				return nil
			}
			refusals--
			return errStore
		}
		startPlace(t, r)
		testkit.Wait(t, "m placed after two refusals", func() bool { return len(r.desired.State().Replicas) == 1 })
		wantProposals(t, r.prop.proposed(), []proposal{place("m", "n1", 0), place("m", "n1", 0), place("m", "n1", 0)})
		if got := testkit.Metric(t, r.reg, placementsMetric, testkit.Labels{"action": "place", "result": "failed"}); got != 2 {
			t.Fatalf("failed placements %v, want 2", got)
		}
	})
}
