package placement

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"go.uber.org/goleak"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func node(id string, gpus uint32, labels ...string) *llmgwv1.Node {
	n := &llmgwv1.Node{Id: id, Gpus: gpus, State: llmgwv1.NodeState_NODE_STATE_ACTIVE, Labels: map[string]string{}}
	for i := 0; i+1 < len(labels); i += 2 {
		n.Labels[labels[i]] = labels[i+1]
	}
	return n
}

func model(name string, replicas, gpus uint32) *llmgwv1.Model {
	return &llmgwv1.Model{Name: name, Engine: "sim", Replicas: replicas, GpusPerReplica: gpus}
}

func replica(id, model, node string, uid uint64, gpus ...uint32) *llmgwv1.Replica {
	return &llmgwv1.Replica{Id: id, Uid: uid, Model: model, Node: node, GpuIndices: gpus}
}

func drainingOn(id, node string, uid uint64, gpus ...uint32) *llmgwv1.Replica {
	r := replica(id, "m", node, uid, gpus...)
	r.Draining = true
	return r
}

func revised(replicas, gpus uint32, revision uint64) *llmgwv1.Model {
	m := model("m", replicas, gpus)
	m.Revision = revision
	return m
}

func atRevision(r *llmgwv1.Replica, rev uint64) *llmgwv1.Replica {
	r.ModelRevision = rev
	return r
}

// render prints a plan compactly: "+model@node[gpus]" (an external
// replica's as "+model@node=endpoint[]"), "~id" and "-id".
func render(p Plan) string {
	s := ""
	for _, r := range p.Place {
		ep := ""
		if r.Endpoint != "" {
			ep = "=" + r.Endpoint
		}
		s += fmt.Sprintf("+%s@%s%s%v ", r.Model, r.Node, ep, r.GpuIndices)
	}
	for _, r := range p.Drain {
		s += fmt.Sprintf("~%s ", r.Id)
	}
	for _, r := range p.Remove {
		s += fmt.Sprintf("-%s ", r.Id)
	}
	for m, n := range p.Unplaceable {
		s += fmt.Sprintf("!%s:%d ", m, n)
	}
	return s
}

func TestReconcile(t *testing.T) {
	down := node("n2", 4)
	down.State = llmgwv1.NodeState_NODE_STATE_DOWN
	draining := replica("m-0", "m", "n1", 3, 0)
	draining.Draining = true
	drainingNode := node("a", 2)
	drainingNode.State = llmgwv1.NodeState_NODE_STATE_DRAINING
	selective := model("m", 2, 1)
	selective.NodeSelector = map[string]string{"gpu": "a100"}
	all := func(*llmgwv1.Replica) bool { return true }
	tests := []struct {
		name  string
		state *llmgwv1.State
		in    Inputs
		want  string
	}{
		{"nothing to do", &llmgwv1.State{}, Inputs{}, ""},
		{"two replicas on one node with two GPUs",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 2, 1)}, Nodes: []*llmgwv1.Node{node("n1", 2)}},
			Inputs{}, "+m@n1[0] +m@n1[1] "},
		{"spread over nodes, most free first, then id",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 3, 1)}, Nodes: []*llmgwv1.Node{node("b", 2), node("a", 2), node("c", 4)}},
			Inputs{}, "+m@c[0] +m@a[0] +m@b[0] "},
		{"fewest replicas of this model beats free GPUs",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 2, 1)}, Nodes: []*llmgwv1.Node{node("a", 8), node("b", 2)},
				Replicas: []*llmgwv1.Replica{replica("m-0", "m", "a", 1, 0)}},
			Inputs{}, "+m@b[0] "},
		{"multi-GPU replicas skip used GPUs",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 1, 2), model("o", 1, 1)}, Nodes: []*llmgwv1.Node{node("a", 3)},
				Replicas: []*llmgwv1.Replica{replica("o-0", "o", "a", 1, 1)}},
			Inputs{}, "+m@a[0 2] "},
		{"not enough GPUs",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 3, 2)}, Nodes: []*llmgwv1.Node{node("a", 5)}},
			Inputs{}, "+m@a[0 1] +m@a[2 3] !m:1 "},
		{"down nodes get nothing",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 1, 1)}, Nodes: []*llmgwv1.Node{down}},
			Inputs{}, "!m:1 "},
		{"selector",
			&llmgwv1.State{Models: []*llmgwv1.Model{selective}, Nodes: []*llmgwv1.Node{node("a", 4), node("b", 1, "gpu", "a100"), node("c", 1, "gpu", "h100")}},
			Inputs{}, "+m@b[0] !m:1 "},
		{"extras go highest ordinal first",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 1, 1)}, Nodes: []*llmgwv1.Node{node("a", 4)},
				Replicas: []*llmgwv1.Replica{replica("m-10", "m", "a", 5, 0), replica("m-2", "m", "a", 6, 1), replica("m-9", "m", "a", 7, 2)}},
			Inputs{}, "~m-10 ~m-9 "},
		{"draining replicas count for nothing but keep their GPUs",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 1, 1)}, Nodes: []*llmgwv1.Node{node("n1", 2)}, Replicas: []*llmgwv1.Replica{draining}},
			Inputs{}, "+m@n1[1] "},
		{"a drained replica is removed",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 1, 1)}, Nodes: []*llmgwv1.Node{node("n1", 2)},
				Replicas: []*llmgwv1.Replica{draining, replica("m-1", "m", "n1", 4, 1)}},
			Inputs{Drained: func(r *llmgwv1.Replica) bool { return r.Id == "m-0" }}, "-m-0 "},
		{"replicas on a lost node are removed and placed elsewhere",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 1, 1)}, Nodes: []*llmgwv1.Node{down, node("n3", 1)},
				Replicas: []*llmgwv1.Replica{replica("m-0", "m", "n2", 3, 0)}},
			Inputs{Lost: map[string]bool{"n2": true}}, "+m@n3[0] -m-0 "},
		{"a down node within its grace keeps its replicas",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 1, 1)}, Nodes: []*llmgwv1.Node{down, node("n3", 1)},
				Replicas: []*llmgwv1.Replica{replica("m-0", "m", "n2", 3, 0)}},
			Inputs{}, ""},
		{"moving off a draining node places one replacement",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 2, 1)}, Nodes: []*llmgwv1.Node{drainingNode, node("b", 4)},
				Replicas: []*llmgwv1.Replica{replica("m-0", "m", "a", 1, 0), replica("m-1", "m", "a", 2, 1)}},
			Inputs{}, "+m@b[0] "},
		{"no second replacement while one is not ready",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 2, 1)}, Nodes: []*llmgwv1.Node{drainingNode, node("b", 4)},
				Replicas: []*llmgwv1.Replica{replica("m-0", "m", "a", 1, 0), replica("m-1", "m", "a", 2, 1), replica("m-2", "m", "b", 3, 0)}},
			Inputs{}, ""},
		{"one moving replica drains once its replacement is ready",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 2, 1)}, Nodes: []*llmgwv1.Node{drainingNode, node("b", 4)},
				Replicas: []*llmgwv1.Replica{replica("m-0", "m", "a", 1, 0), replica("m-1", "m", "a", 2, 1), replica("m-2", "m", "b", 3, 0)}},
			Inputs{Ready: func(*llmgwv1.Replica) bool { return true }}, "~m-0 "},
		{"the next replacement once the first moved",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 2, 1)}, Nodes: []*llmgwv1.Node{drainingNode, node("b", 4)},
				Replicas: []*llmgwv1.Replica{drainingOn("m-0", "a", 1, 0), replica("m-1", "m", "a", 2, 1), replica("m-2", "m", "b", 3, 0)}},
			Inputs{Ready: func(r *llmgwv1.Replica) bool { return !r.Draining }}, "+m@b[1] "},
		{"the next replacement waits for the others to be ready",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 2, 1)}, Nodes: []*llmgwv1.Node{drainingNode, node("b", 4)},
				Replicas: []*llmgwv1.Replica{drainingOn("m-0", "a", 1, 0), replica("m-1", "m", "a", 2, 1), replica("m-2", "m", "b", 3, 0)}},
			Inputs{}, ""},
		{"a re-apply that needs a restart places one replacement",
			&llmgwv1.State{Models: []*llmgwv1.Model{revised(2, 1, 9)}, Nodes: []*llmgwv1.Node{node("a", 4)},
				Replicas: []*llmgwv1.Replica{atRevision(replica("m-0", "m", "a", 1, 0), 5), atRevision(replica("m-1", "m", "a", 2, 1), 5)}},
			Inputs{Ready: func(*llmgwv1.Replica) bool { return true }}, "+m@a[2] "},
		{"the old revision drains one at a time",
			&llmgwv1.State{Models: []*llmgwv1.Model{revised(2, 1, 9)}, Nodes: []*llmgwv1.Node{node("a", 4)},
				Replicas: []*llmgwv1.Replica{atRevision(replica("m-0", "m", "a", 1, 0), 5), atRevision(replica("m-1", "m", "a", 2, 1), 5), atRevision(replica("m-2", "m", "a", 10, 2), 9)}},
			Inputs{Ready: func(*llmgwv1.Replica) bool { return true }}, "~m-0 "},
		{"the replacement must be ready before the old one drains",
			&llmgwv1.State{Models: []*llmgwv1.Model{revised(2, 1, 9)}, Nodes: []*llmgwv1.Node{node("a", 4)},
				Replicas: []*llmgwv1.Replica{atRevision(replica("m-0", "m", "a", 1, 0), 5), atRevision(replica("m-1", "m", "a", 2, 1), 5), atRevision(replica("m-2", "m", "a", 10, 2), 9)}},
			Inputs{Ready: func(r *llmgwv1.Replica) bool { return r.Id != "m-2" }}, ""},
		{"a current replica is not rolled",
			&llmgwv1.State{Models: []*llmgwv1.Model{revised(1, 1, 9)}, Nodes: []*llmgwv1.Node{node("a", 4)},
				Replicas: []*llmgwv1.Replica{atRevision(replica("m-0", "m", "a", 10, 0), 9)}},
			Inputs{Ready: func(*llmgwv1.Replica) bool { return true }}, ""},
		{"a replica without a model revision is taken as current",
			&llmgwv1.State{Models: []*llmgwv1.Model{revised(1, 1, 9)}, Nodes: []*llmgwv1.Node{node("a", 4)},
				Replicas: []*llmgwv1.Replica{replica("m-0", "m", "a", 1, 0)}},
			Inputs{Ready: func(*llmgwv1.Replica) bool { return true }}, ""},
		{"moving replicas drain once the count is ready elsewhere",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 2, 1)}, Nodes: []*llmgwv1.Node{drainingNode, node("b", 4)},
				Replicas: []*llmgwv1.Replica{replica("m-0", "m", "a", 1, 0), replica("m-1", "m", "a", 2, 1), replica("m-2", "m", "b", 3, 0), replica("m-3", "m", "b", 4, 1)}},
			Inputs{Ready: func(r *llmgwv1.Replica) bool { return r.Node == "b" }}, "~m-0 ~m-1 "},
		{"a new node_selector rolls replicas to matching nodes",
			&llmgwv1.State{Models: []*llmgwv1.Model{selective}, Nodes: []*llmgwv1.Node{node("a", 2), node("b", 2, "gpu", "a100")},
				Replicas: []*llmgwv1.Replica{replica("m-0", "m", "a", 1, 0), replica("m-1", "m", "a", 2, 1)}},
			Inputs{}, "+m@b[0] "},
		{"a new size rolls replicas",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 1, 2)}, Nodes: []*llmgwv1.Node{node("a", 4)},
				Replicas: []*llmgwv1.Replica{replica("m-0", "m", "a", 1, 0)}},
			Inputs{}, "+m@a[1 2] "},
		{"the old size drains once the new one is ready",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 1, 2)}, Nodes: []*llmgwv1.Node{node("a", 4)},
				Replicas: []*llmgwv1.Replica{replica("m-0", "m", "a", 1, 0), replica("m-1", "m", "a", 2, 1, 2)}},
			Inputs{Ready: func(*llmgwv1.Replica) bool { return true }}, "~m-0 "},
		// The spread rule: a node that attached after the model was placed.
		{"spread: all on one node, one moves to a node with room",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 2, 1)}, Nodes: []*llmgwv1.Node{node("a", 2), node("b", 2)},
				Replicas: []*llmgwv1.Replica{replica("m-0", "m", "a", 1, 0), replica("m-1", "m", "a", 2, 1)}},
			Inputs{Ready: all}, "+m@b[0] "},
		{"spread: not while a replica is not ready",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 2, 1)}, Nodes: []*llmgwv1.Node{node("a", 2), node("b", 2)},
				Replicas: []*llmgwv1.Replica{replica("m-0", "m", "a", 1, 0), replica("m-1", "m", "a", 2, 1)}},
			Inputs{Ready: func(r *llmgwv1.Replica) bool { return r.Id == "m-0" }}, ""},
		{"spread: the busiest node's replica drains once the replacement is ready",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 2, 1)}, Nodes: []*llmgwv1.Node{node("a", 2), node("b", 2)},
				Replicas: []*llmgwv1.Replica{replica("m-0", "m", "a", 1, 0), replica("m-1", "m", "a", 2, 1), replica("m-2", "m", "b", 3, 0)}},
			Inputs{Ready: all}, "~m-1 "},
		{"spread: nothing drains before the replacement is ready",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 2, 1)}, Nodes: []*llmgwv1.Node{node("a", 2), node("b", 2)},
				Replicas: []*llmgwv1.Replica{replica("m-0", "m", "a", 1, 0), replica("m-1", "m", "a", 2, 1), replica("m-2", "m", "b", 3, 0)}},
			Inputs{Ready: func(r *llmgwv1.Replica) bool { return r.Id != "m-2" }}, ""},
		{"spread: balanced, no move",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 2, 1)}, Nodes: []*llmgwv1.Node{node("a", 2), node("b", 2), node("c", 8)},
				Replicas: []*llmgwv1.Replica{replica("m-0", "m", "a", 1, 0), replica("m-1", "m", "b", 2, 0)}},
			Inputs{Ready: all}, ""},
		{"spread: a gap of one does not move (it would only flap)",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 3, 1)}, Nodes: []*llmgwv1.Node{node("a", 4), node("b", 4)},
				Replicas: []*llmgwv1.Replica{replica("m-0", "m", "a", 1, 0), replica("m-1", "m", "a", 2, 1), replica("m-2", "m", "b", 3, 0)}},
			Inputs{Ready: all}, ""},
		{"spread: not to a node without room",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 2, 1), model("o", 1, 1)}, Nodes: []*llmgwv1.Node{node("a", 2), node("b", 1)},
				Replicas: []*llmgwv1.Replica{replica("m-0", "m", "a", 1, 0), replica("m-1", "m", "a", 2, 1), replica("o-0", "o", "b", 3, 0)}},
			Inputs{Ready: all}, ""},
		{"spread: not to a node off the selector",
			&llmgwv1.State{Models: []*llmgwv1.Model{selective}, Nodes: []*llmgwv1.Node{node("a", 2, "gpu", "a100"), node("b", 2, "gpu", "h100")},
				Replicas: []*llmgwv1.Replica{replica("m-0", "m", "a", 1, 0), replica("m-1", "m", "a", 2, 1)}},
			Inputs{Ready: all}, ""},
		{"spread: not to a node that is not active",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 2, 1)}, Nodes: []*llmgwv1.Node{node("b", 2), down},
				Replicas: []*llmgwv1.Replica{replica("m-0", "m", "b", 1, 0), replica("m-1", "m", "b", 2, 1)}},
			Inputs{Ready: all}, ""},
		{"spread: not off a down node within its grace",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 2, 1)}, Nodes: []*llmgwv1.Node{down, node("n3", 2)},
				Replicas: []*llmgwv1.Replica{replica("m-0", "m", "n2", 1, 0), replica("m-1", "m", "n2", 2, 1)}},
			Inputs{Ready: all}, ""},
		{"spread: one move at a time, to the least-loaded node with room",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 4, 1)}, Nodes: []*llmgwv1.Node{node("a", 4), node("b", 2), node("c", 4)},
				Replicas: []*llmgwv1.Replica{replica("m-0", "m", "a", 1, 0), replica("m-1", "m", "a", 2, 1), replica("m-2", "m", "a", 3, 2), replica("m-3", "m", "b", 4, 0)}},
			Inputs{Ready: all}, "+m@c[0] "},
		{"spread: not while another move is under way",
			&llmgwv1.State{Models: []*llmgwv1.Model{revised(2, 1, 9)}, Nodes: []*llmgwv1.Node{node("a", 2), node("b", 2)},
				Replicas: []*llmgwv1.Replica{atRevision(replica("m-0", "m", "a", 1, 0), 9), atRevision(replica("m-1", "m", "a", 2, 1), 9), atRevision(replica("m-2", "m", "b", 3, 0), 5)}},
			Inputs{Ready: all}, "~m-2 "},
		{"spread: a model of one replica stays",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 1, 1)}, Nodes: []*llmgwv1.Node{node("a", 2), node("b", 2)},
				Replicas: []*llmgwv1.Replica{replica("m-0", "m", "a", 1, 0)}},
			Inputs{Ready: all}, ""},
		{"a scale-down drains from the busiest node",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 2, 1)}, Nodes: []*llmgwv1.Node{node("a", 2), node("b", 2)},
				Replicas: []*llmgwv1.Replica{replica("m-0", "m", "a", 1, 0), replica("m-1", "m", "a", 2, 1), replica("m-2", "m", "b", 3, 0)}},
			Inputs{Ready: all}, "~m-1 "},
		{"a scale-down drains a not-ready replica first among equals",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 1, 1)}, Nodes: []*llmgwv1.Node{node("a", 2)},
				Replicas: []*llmgwv1.Replica{replica("m-0", "m", "a", 1, 0), replica("m-1", "m", "a", 2, 1)}},
			Inputs{Ready: func(r *llmgwv1.Replica) bool { return r.Id == "m-1" }}, "~m-0 "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := render(Reconcile(tt.state, tt.in)); got != tt.want {
				t.Fatalf("Reconcile = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestReconcileIsStable(t *testing.T) {
	st := &llmgwv1.State{Models: []*llmgwv1.Model{model("m", 4, 1), model("k", 2, 1)}, Nodes: []*llmgwv1.Node{node("a", 2), node("b", 2), node("c", 2)}}
	first := render(Reconcile(st, Inputs{}))
	for i := 0; i < 20; i++ {
		if got := render(Reconcile(st, Inputs{})); got != first {
			t.Fatalf("run %d: %q, first run %q", i, got, first)
		}
	}
}

// BenchmarkReconcile runs placement on a large, settled fleet: 500 nodes of
// 8 GPUs, 200 models of 10 replicas — the leader does this on every apply.
func BenchmarkReconcile(b *testing.B) {
	st := &llmgwv1.State{}
	for i := range 500 {
		st.Nodes = append(st.Nodes, node(fmt.Sprintf("n%03d", i), 8))
	}
	for i := range 200 {
		st.Models = append(st.Models, model(fmt.Sprintf("m%03d", i), 10, 1))
	}
	for len(st.Replicas) < 2000 {
		p := Reconcile(st, Inputs{})
		for i, r := range p.Place {
			r.Id = fmt.Sprintf("%s-%d", r.Model, len(st.Replicas)+i)
		}
		st.Replicas = append(st.Replicas, p.Place...)
	}
	b.ResetTimer()
	for b.Loop() {
		if p := Reconcile(st, Inputs{}); !p.Empty() {
			b.Fatal("a settled fleet got decisions")
		}
	}
}

// walk plays placement forward from st — every placed replica becomes
// ready on the next round, every drained one is removed — until a round
// decides nothing, and checks at every step, for every model, that it
// keeps its count of ready replicas, never runs more than one extra and
// never starts more than one move at once (design §4 "Changes roll",
// §5.5). Replicas in st are taken as ready. It returns the rounds taken.
func walk(t *testing.T, st *llmgwv1.State) int {
	t.Helper()
	ready := map[uint64]bool{}
	uid := uint64(0)
	for _, r := range st.Replicas {
		ready[r.Uid] = true
		uid = max(uid, r.Uid)
	}
	revision := map[string]uint64{}
	for _, m := range st.Models {
		revision[m.Name] = m.Revision
	}
	for step := 0; ; step++ {
		if step > 100 {
			t.Fatalf("did not settle in 100 rounds: %v", st.Replicas)
		}
		for _, m := range st.Models {
			serving, readyServing := 0, 0
			for _, r := range st.Replicas {
				if r.Model == m.Name && !r.Draining {
					serving++
					if ready[r.Uid] {
						readyServing++
					}
				}
			}
			if want := int(m.Replicas); serving > want+1 || readyServing < want {
				t.Fatalf("step %d: model %s: %d serving, %d of them ready (want %d ready, at most %d serving)", step, m.Name, serving, readyServing, want, want+1)
			}
		}
		// Placed replicas become ready a round after they appear.
		for _, r := range st.Replicas {
			ready[r.Uid] = ready[r.Uid] || !r.Draining
		}
		p := Reconcile(st, Inputs{
			Ready:   func(r *llmgwv1.Replica) bool { return ready[r.Uid] },
			Drained: func(*llmgwv1.Replica) bool { return true },
		})
		if len(p.Unplaceable) > 0 {
			t.Fatalf("step %d: unplaceable: %s", step, render(p))
		}
		perModel := map[string]int{}
		for _, r := range append(slices.Clone(p.Drain), p.Place...) {
			if perModel[r.Model]++; perModel[r.Model] > 1 {
				t.Fatalf("step %d: more than one move at once for %s: %s", step, r.Model, render(p))
			}
		}
		if p.Empty() {
			return step
		}
		gone := map[string]bool{}
		for _, r := range p.Remove {
			gone[r.Id] = true
		}
		var next []*llmgwv1.Replica
		for _, r := range st.Replicas {
			if gone[r.Id] {
				continue
			}
			for _, d := range p.Drain {
				if d.Id == r.Id {
					r.Draining = true
				}
			}
			next = append(next, r)
		}
		for _, r := range p.Place {
			uid++
			r.Id, r.Uid, r.ModelRevision = fmt.Sprintf("%s-%d", r.Model, uid), uid, revision[r.Model]
			next = append(next, r)
		}
		st.Replicas = next
	}
}

// perNodeOf counts a model's replicas per node.
func perNodeOf(st *llmgwv1.State, model string) map[string]int {
	out := map[string]int{}
	for _, r := range st.Replicas {
		if r.Model == model {
			out[r.Node]++
		}
	}
	return out
}

// TestMovesWalkOneAtATime walks a drained node, a rolling re-apply and a
// node that joined after the model was placed (the spread rule) to the
// end, one move at a time, and checks where the replicas end.
func TestMovesWalkOneAtATime(t *testing.T) {
	tests := []struct {
		name  string
		setup func(st *llmgwv1.State)
		done  func(st *llmgwv1.State) bool
	}{
		{"drain node a", func(st *llmgwv1.State) { st.Nodes[0].State = llmgwv1.NodeState_NODE_STATE_DRAINING },
			func(st *llmgwv1.State) bool { return maps.Equal(perNodeOf(st, "m"), map[string]int{"b": 3}) }},
		{"re-apply rolls", func(st *llmgwv1.State) { st.Models[0].Revision = 50 },
			func(st *llmgwv1.State) bool {
				return !slices.ContainsFunc(st.Replicas, func(r *llmgwv1.Replica) bool { return r.ModelRevision != 50 }) &&
					len(perNodeOf(st, "m")) == 2
			}},
		{"b joined after the placement", func(*llmgwv1.State) {},
			func(st *llmgwv1.State) bool { return maps.Equal(perNodeOf(st, "m"), map[string]int{"a": 2, "b": 1}) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const want = 3
			m := revised(want, 1, 1)
			st := &llmgwv1.State{Models: []*llmgwv1.Model{m}, Nodes: []*llmgwv1.Node{node("a", 4), node("b", 4)}}
			for i := range want {
				st.Replicas = append(st.Replicas, atRevision(replica(fmt.Sprintf("m-%d", i), "m", "a", uint64(i+1), uint32(i)), 1))
			}
			tt.setup(st)
			walk(t, st)
			if len(st.Replicas) != want {
				t.Fatalf("settled with %d replicas, want %d", len(st.Replicas), want)
			}
			for _, r := range st.Replicas {
				if r.Draining {
					t.Fatalf("settled with %v", r)
				}
			}
			if !tt.done(st) {
				t.Fatalf("settled with %v per node", perNodeOf(st, "m"))
			}
		})
	}
}

// TestSpreadSettles walks fleets whose replicas were all placed on the
// first node before the others attached, for several node sizes, labels,
// selectors and models sharing the GPUs, and checks that each settles
// (no flapping: a round that decides nothing comes) with every step
// within the count (walk), and that then no model has two more replicas
// on one node than on an ACTIVE matching node with room — in particular,
// none has all of two or more on one node while another could take one.
func TestSpreadSettles(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 5))
	moved := 0
	for i := range 200 {
		st := &llmgwv1.State{}
		nodes := 2 + rng.IntN(4)
		for n := range nodes {
			nd := node(fmt.Sprintf("n%d", n), uint32(1+rng.IntN(8)))
			if n == 0 {
				nd.Gpus = 16
			}
			if rng.IntN(3) == 0 {
				nd.Labels["gpu"] = "h100"
			}
			if n > 0 && rng.IntN(6) == 0 {
				nd.State = llmgwv1.NodeState_NODE_STATE_DRAINING
			}
			st.Nodes = append(st.Nodes, nd)
		}
		st.Nodes[0].Labels["gpu"] = "h100"
		free := uint32(16)
		for k := range 1 + rng.IntN(3) {
			gpus := uint32(1 + rng.IntN(2))
			count := uint32(1 + rng.IntN(4))
			if gpus*count > free {
				break
			}
			m := model(fmt.Sprintf("m%d", k), count, gpus)
			if rng.IntN(3) == 0 {
				m.NodeSelector = map[string]string{"gpu": "h100"}
			}
			st.Models = append(st.Models, m)
			for range count {
				var g []uint32
				for range gpus {
					free--
					g = append(g, 15-free)
				}
				uid := uint64(len(st.Replicas) + 1)
				st.Replicas = append(st.Replicas, replica(fmt.Sprintf("%s-%d", m.Name, uid), m.Name, "n0", uid, g...))
			}
		}
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			if walk(t, st) > 0 {
				moved++
			}
			used := map[string]int{}
			for _, r := range st.Replicas {
				used[r.Node] += len(r.GpuIndices)
			}
			for _, m := range st.Models {
				perNode := perNodeOf(st, m.Name)
				most := slices.Max(slices.Collect(maps.Values(perNode)))
				for _, n := range st.Nodes {
					room := int(n.Gpus)-used[n.Id] >= int(m.GpusPerReplica)
					if n.State == llmgwv1.NodeState_NODE_STATE_ACTIVE && Matches(n, m.NodeSelector) && room && most-perNode[n.Id] >= 2 {
						t.Errorf("settled with %s at %v per node, yet %s has room", m.Name, perNode, n.Id)
					}
				}
			}
		})
	}
	if moved < 100 {
		t.Fatalf("only %d of 200 fleets moved a replica: the walk did not exercise the spread rule", moved)
	}
}
