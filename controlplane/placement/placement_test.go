package placement

import (
	"fmt"
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

// render prints a plan compactly: "+model@node[gpus]" and "-id".
func render(p Plan) string {
	s := ""
	for _, r := range p.Place {
		s += fmt.Sprintf("+%s@%s%v ", r.Model, r.Node, r.GpuIndices)
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
	ext := model("e", 3, 0)
	ext.Engine = "external"
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
		{"the next replacement once it is ready",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 2, 1)}, Nodes: []*llmgwv1.Node{drainingNode, node("b", 4)},
				Replicas: []*llmgwv1.Replica{replica("m-0", "m", "a", 1, 0), replica("m-1", "m", "a", 2, 1), replica("m-2", "m", "b", 3, 0)}},
			Inputs{Ready: func(*llmgwv1.Replica) bool { return true }}, "+m@b[1] "},
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
		{"external places nothing", &llmgwv1.State{Models: []*llmgwv1.Model{ext}, Nodes: []*llmgwv1.Node{node("a", 4)}}, Inputs{}, ""},
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
