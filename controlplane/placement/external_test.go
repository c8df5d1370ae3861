package placement

import (
	"fmt"
	"slices"
	"testing"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func externalModel(name string, endpoints ...string) *llmgwv1.Model {
	return &llmgwv1.Model{Name: name, Engine: "external", Endpoints: endpoints}
}

func externalReplica(id, model, node, endpoint string, uid uint64) *llmgwv1.Replica {
	return &llmgwv1.Replica{Id: id, Uid: uid, Model: model, Node: node, Endpoint: endpoint}
}

func nodeIn(id string, state llmgwv1.NodeState) *llmgwv1.Node {
	n := node(id, 0)
	n.State = state
	return n
}

// TestReconcileExternal holds the placement of external engines (design
// §5.5): one replica per endpoint, owned by a live agent, spread, stable,
// and moved to another owner — replacement first — when its owner goes.
func TestReconcileExternal(t *testing.T) {
	const a, b = "http://10.0.0.7:8000", "http://10.0.0.8:8000"
	two := externalModel("e", a, b)
	selective := externalModel("e", a)
	selective.NodeSelector = map[string]string{"zone": "x"}
	revisedExt := externalModel("e", a)
	revisedExt.Revision = 9
	all := func(*llmgwv1.Replica) bool { return true }
	readyIDs := func(ids ...string) func(*llmgwv1.Replica) bool {
		return func(r *llmgwv1.Replica) bool { return slices.Contains(ids, r.Id) }
	}
	down, draining := llmgwv1.NodeState_NODE_STATE_DOWN, llmgwv1.NodeState_NODE_STATE_DRAINING
	tests := []struct {
		name  string
		state *llmgwv1.State
		in    Inputs
		want  string
	}{
		{"one replica per endpoint, spread over owners, no GPUs",
			&llmgwv1.State{Models: []*llmgwv1.Model{two}, Nodes: []*llmgwv1.Node{node("n2", 4), node("n1", 0)}},
			Inputs{}, "+e@n1=" + a + "[] +e@n2=" + b + "[] "},
		{"owners that own the fewest external replicas of any model first",
			&llmgwv1.State{Models: []*llmgwv1.Model{externalModel("d", "http://10.0.0.9:8000"), externalModel("e", a)}, Nodes: []*llmgwv1.Node{node("n1", 0), node("n2", 0)},
				Replicas: []*llmgwv1.Replica{externalReplica("d-0", "d", "n1", "http://10.0.0.9:8000", 1)}},
			Inputs{Ready: all}, "+e@n2=" + a + "[] "},
		{"no agent: unplaceable", &llmgwv1.State{Models: []*llmgwv1.Model{two}}, Inputs{}, "!e:2 "},
		{"a DOWN or DRAINING node owns nothing new",
			&llmgwv1.State{Models: []*llmgwv1.Model{two}, Nodes: []*llmgwv1.Node{nodeIn("n1", down), nodeIn("n2", draining)}},
			Inputs{}, "!e:2 "},
		{"the selector picks the owners",
			&llmgwv1.State{Models: []*llmgwv1.Model{selective}, Nodes: []*llmgwv1.Node{node("n1", 0), node("n2", 0, "zone", "x")}},
			Inputs{}, "+e@n2=" + a + "[] "},
		{"settled: stable",
			&llmgwv1.State{Models: []*llmgwv1.Model{two}, Nodes: []*llmgwv1.Node{node("n1", 0), node("n2", 0), node("n3", 0)},
				Replicas: []*llmgwv1.Replica{externalReplica("e-0", "e", "n1", a, 1), externalReplica("e-1", "e", "n1", b, 2)}},
			Inputs{Ready: all}, ""},
		{"not ready is no reason to move",
			&llmgwv1.State{Models: []*llmgwv1.Model{two}, Nodes: []*llmgwv1.Node{node("n1", 0), node("n2", 0)},
				Replicas: []*llmgwv1.Replica{externalReplica("e-0", "e", "n1", a, 1), externalReplica("e-1", "e", "n2", b, 2)}},
			Inputs{}, ""},
		{"owner DOWN: a replacement goes to a live agent at once",
			&llmgwv1.State{Models: []*llmgwv1.Model{two}, Nodes: []*llmgwv1.Node{nodeIn("n1", down), node("n2", 0)},
				Replicas: []*llmgwv1.Replica{externalReplica("e-0", "e", "n1", a, 1), externalReplica("e-1", "e", "n2", b, 2)}},
			Inputs{Ready: all}, "+e@n2=" + a + "[] "},
		{"owner DOWN: the old replica is removed once the new one is ready",
			&llmgwv1.State{Models: []*llmgwv1.Model{two}, Nodes: []*llmgwv1.Node{nodeIn("n1", down), node("n2", 0)},
				Replicas: []*llmgwv1.Replica{externalReplica("e-0", "e", "n1", a, 1), externalReplica("e-1", "e", "n2", b, 2), externalReplica("e-2", "e", "n2", a, 3)}},
			Inputs{Ready: all}, "-e-0 "},
		{"owner DOWN: the old replica stays while it is the one ready",
			&llmgwv1.State{Models: []*llmgwv1.Model{two}, Nodes: []*llmgwv1.Node{nodeIn("n1", down), node("n2", 0)},
				Replicas: []*llmgwv1.Replica{externalReplica("e-0", "e", "n1", a, 1), externalReplica("e-1", "e", "n2", b, 2), externalReplica("e-2", "e", "n2", a, 3)}},
			Inputs{Ready: readyIDs("e-0", "e-1")}, ""},
		{"owner DOWN, engine down too: nothing to wait for",
			&llmgwv1.State{Models: []*llmgwv1.Model{two}, Nodes: []*llmgwv1.Node{nodeIn("n1", down), node("n2", 0)},
				Replicas: []*llmgwv1.Replica{externalReplica("e-0", "e", "n1", a, 1), externalReplica("e-1", "e", "n2", b, 2), externalReplica("e-2", "e", "n2", a, 3)}},
			Inputs{Ready: readyIDs("e-1")}, "-e-0 "},
		{"owner gone for good: removed and re-placed in one plan",
			&llmgwv1.State{Models: []*llmgwv1.Model{two}, Nodes: []*llmgwv1.Node{nodeIn("n1", down), node("n2", 0)},
				Replicas: []*llmgwv1.Replica{externalReplica("e-0", "e", "n1", a, 1), externalReplica("e-1", "e", "n2", b, 2)}},
			Inputs{Ready: all, Lost: map[string]bool{"n1": true}}, "+e@n2=" + a + "[] -e-0 "},
		{"owner DRAINING: replaced, then drained, not removed",
			&llmgwv1.State{Models: []*llmgwv1.Model{externalModel("e", a)}, Nodes: []*llmgwv1.Node{nodeIn("n1", draining), node("n2", 0)},
				Replicas: []*llmgwv1.Replica{externalReplica("e-0", "e", "n1", a, 1), externalReplica("e-1", "e", "n2", a, 3)}},
			Inputs{Ready: all}, "~e-0 "},
		{"placed for an older revision: rolled",
			&llmgwv1.State{Models: []*llmgwv1.Model{revisedExt}, Nodes: []*llmgwv1.Node{node("n1", 0)},
				Replicas: []*llmgwv1.Replica{atRevision(externalReplica("e-0", "e", "n1", a, 1), 5)}},
			Inputs{Ready: all}, "+e@n1=" + a + "[] "},
		{"an endpoint the model no longer lists is drained",
			&llmgwv1.State{Models: []*llmgwv1.Model{externalModel("e", a)}, Nodes: []*llmgwv1.Node{node("n1", 0)},
				Replicas: []*llmgwv1.Replica{externalReplica("e-0", "e", "n1", a, 1), externalReplica("e-1", "e", "n1", b, 2)}},
			Inputs{Ready: all}, "~e-1 "},
		{"two for one endpoint: the ready one stays",
			&llmgwv1.State{Models: []*llmgwv1.Model{externalModel("e", a)}, Nodes: []*llmgwv1.Node{node("n1", 0), node("n2", 0)},
				Replicas: []*llmgwv1.Replica{externalReplica("e-0", "e", "n1", a, 1), externalReplica("e-1", "e", "n2", a, 2)}},
			Inputs{Ready: readyIDs("e-1")}, "~e-0 "},
		{"a drained external replica is removed",
			&llmgwv1.State{Models: []*llmgwv1.Model{externalModel("e", a)}, Nodes: []*llmgwv1.Node{node("n1", 0)},
				Replicas: []*llmgwv1.Replica{{Id: "e-0", Uid: 1, Model: "e", Node: "n1", Endpoint: a, Draining: true}, externalReplica("e-1", "e", "n1", a, 2)}},
			Inputs{Ready: all, Drained: all}, "-e-0 "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := render(Reconcile(tt.state, tt.in)); got != tt.want {
				t.Fatalf("Reconcile = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestExternalOwnerGoes plays an owner going DOWN forward: every placed
// replica becomes ready a round later and every removed one goes (so it
// settles when two rounds in a row decide nothing); at no
// round is an endpoint without a ready replica, and it ends with each
// endpoint owned once, by the live node.
func TestExternalOwnerGoes(t *testing.T) {
	const a, b = "http://10.0.0.7:8000", "http://10.0.0.8:8000"
	st := &llmgwv1.State{Models: []*llmgwv1.Model{externalModel("e", a, b)}, Nodes: []*llmgwv1.Node{node("n1", 0), node("n2", 0)}}
	ready := map[uint64]bool{}
	uid := uint64(0)
	round := func() Plan {
		p := Reconcile(st, Inputs{Ready: func(r *llmgwv1.Replica) bool { return ready[r.Uid] }})
		for _, r := range p.Remove {
			st.Replicas = slices.DeleteFunc(st.Replicas, func(x *llmgwv1.Replica) bool { return x.Uid == r.Uid })
		}
		for _, r := range st.Replicas {
			ready[r.Uid] = true // placed a round ago
		}
		for _, r := range p.Place {
			uid++
			r.Id, r.Uid = fmt.Sprintf("e-%d", uid), uid
			st.Replicas = append(st.Replicas, r)
		}
		return p
	}
	for range 3 {
		round()
	}
	if len(st.Replicas) != 2 || st.Replicas[0].Node == st.Replicas[1].Node {
		t.Fatalf("not one replica per endpoint over two owners: %v", st.Replicas)
	}
	st.Nodes[0].State = llmgwv1.NodeState_NODE_STATE_DOWN
	for i := 0; ; i++ {
		if i > 10 {
			t.Fatalf("did not settle: %v", st.Replicas)
		}
		for _, ep := range []string{a, b} {
			if !slices.ContainsFunc(st.Replicas, func(r *llmgwv1.Replica) bool { return r.Endpoint == ep && ready[r.Uid] }) {
				t.Fatalf("round %d: endpoint %s has no ready replica: %v", i, ep, st.Replicas)
			}
		}
		// round has effects: the second call is the next round.
		if first := round(); first.Empty() {
			if second := round(); second.Empty() {
				break
			}
		}
	}
	if len(st.Replicas) != 2 || st.Replicas[0].Node != "n2" || st.Replicas[1].Node != "n2" {
		t.Fatalf("after n1 went DOWN: %v, want both endpoints owned by n2", st.Replicas)
	}
}
