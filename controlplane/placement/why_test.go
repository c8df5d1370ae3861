package placement

import (
	"fmt"
	"testing"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestUnplacedReason: a model short of replicas says why in words — the
// matching nodes with their GPUs free and what holds the rest, the nodes
// that match but are not active, those off the selector — naming a few of
// each and counting the rest (design §5.7 "Saying why").
func TestUnplacedReason(t *testing.T) {
	full := func(id string, model string, from int) []*llmgwv1.Replica {
		var out []*llmgwv1.Replica
		for g := range 8 {
			out = append(out, replica(fmt.Sprintf("%s-%d", model, from+g), model, id, uint64(from+g+1), uint32(g)))
		}
		return out
	}
	selective := func(m *llmgwv1.Model, sel ...string) *llmgwv1.Model {
		m.NodeSelector = map[string]string{}
		for i := 0; i+1 < len(sel); i += 2 {
			m.NodeSelector[sel[i]] = sel[i+1]
		}
		return m
	}
	inState := func(n *llmgwv1.Node, s llmgwv1.NodeState) *llmgwv1.Node {
		n.State = s
		return n
	}
	many := &llmgwv1.State{Models: []*llmgwv1.Model{model("m", 1, 1)}}
	for i := range 6 {
		n := fmt.Sprintf("n%d", i)
		many.Nodes = append(many.Nodes, node(n, 6))
		for g := range 6 {
			many.Replicas = append(many.Replicas, replica(fmt.Sprintf("o%d-%d", g, i), fmt.Sprintf("o%d", g), n, uint64(10*i+g+1), uint32(g)))
		}
	}
	many.Models[0].Replicas = 1
	tests := []struct {
		name  string
		state *llmgwv1.State
		model string
		want  string
	}{
		{"ten replicas on the 8-GPU dev node, eight placed",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("chat", 10, 1)}, Nodes: []*llmgwv1.Node{node("dev", 8)}, Replicas: full("dev", "chat", 0)},
			"chat", "2 of 10 replicas cannot be placed: each needs 1 GPU; matching nodes: dev (8 GPUs, 0 free: 8 held by chat-0..chat-7)"},
		{"ten replicas on the 8-GPU dev node, from nothing",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("chat", 10, 1)}, Nodes: []*llmgwv1.Node{node("dev", 8)}},
			"chat", "2 of 10 replicas cannot be placed: each needs 1 GPU; matching nodes: dev (8 GPUs, 0 free: 8 held by 8 new of chat)"},
		{"held by other models, one run each, single and paired ids",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 1, 2), model("a", 1, 1), model("b", 2, 1)}, Nodes: []*llmgwv1.Node{node("n1", 4)},
				Replicas: []*llmgwv1.Replica{replica("a-3", "a", "n1", 1, 0), replica("b-0", "b", "n1", 2, 1), replica("b-1", "b", "n1", 3, 2)}},
			"m", "1 of 1 replicas cannot be placed: each needs 2 GPUs; matching nodes: n1 (4 GPUs, 1 free: 3 held by a-3, b-0, b-1)"},
		{"a replica larger than any node",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("big", 1, 16)}, Nodes: []*llmgwv1.Node{node("dev", 8), node("dev2", 4)}},
			"big", "1 of 1 replicas cannot be placed: each needs 16 GPUs; matching nodes: dev (8 GPUs, 8 free), dev2 (4 GPUs, 4 free)"},
		{"no node matches the selector",
			&llmgwv1.State{Models: []*llmgwv1.Model{selective(model("m", 1, 1), "gpu", "a100")},
				Nodes: []*llmgwv1.Node{node("n1", 8), node("n2", 8, "gpu", "h100")}},
			"m", "1 of 1 replicas cannot be placed: each needs 1 GPU; no active node matches the selector {gpu: a100}; nodes not matching the selector {gpu: a100}: n1, n2"},
		{"the matching node is full, others do not match",
			&llmgwv1.State{Models: []*llmgwv1.Model{selective(model("chat", 9, 1), "gpu", "a100", "zone", "b")},
				Nodes:    []*llmgwv1.Node{node("dev", 8, "gpu", "a100", "zone", "b"), node("n2", 8), node("n3", 8), node("n4", 8), node("n5", 8)},
				Replicas: full("dev", "chat", 0)},
			"chat", "1 of 9 replicas cannot be placed: each needs 1 GPU; matching nodes: dev (8 GPUs, 0 free: 8 held by chat-0..chat-7); nodes not matching the selector {gpu: a100, zone: b}: n2, n3, n4 and 1 more node"},
		{"matching nodes that are not active",
			&llmgwv1.State{Models: []*llmgwv1.Model{selective(model("m", 1, 1), "gpu", "a100")},
				Nodes: []*llmgwv1.Node{inState(node("a", 8, "gpu", "a100"), llmgwv1.NodeState_NODE_STATE_DRAINING), inState(node("b", 8, "gpu", "a100"), llmgwv1.NodeState_NODE_STATE_DOWN)}},
			"m", "1 of 1 replicas cannot be placed: each needs 1 GPU; no active node matches the selector {gpu: a100}; matching but not active: a (draining), b (down)"},
		{"no node active, no selector",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 2, 1)}, Nodes: []*llmgwv1.Node{inState(node("a", 8), llmgwv1.NodeState_NODE_STATE_DOWN)}},
			"m", "2 of 2 replicas cannot be placed: each needs 1 GPU; no node is active; nodes not active: a (down)"},
		{"no node at all",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 1, 1)}},
			"m", "1 of 1 replicas cannot be placed: each needs 1 GPU; no node has registered"},
		{"a few nodes and holders named, the rest counted",
			many, "m", "1 of 1 replicas cannot be placed: each needs 1 GPU; matching nodes: n0 (6 GPUs, 0 free: 6 held by o0-0, o1-0, o2-0, o3-0 and 2 more replicas), " +
				"n1 (6 GPUs, 0 free: 6 held by o0-1, o1-1, o2-1, o3-1 and 2 more replicas), n2 (6 GPUs, 0 free: 6 held by o0-2, o1-2, o2-2, o3-2 and 2 more replicas) and 3 more nodes"},
		{"another model's sleeping replica leaves its GPU free; the model's own holds it",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 3, 2), model("s", 1, 1)}, Nodes: []*llmgwv1.Node{node("n1", 3)},
				Replicas: []*llmgwv1.Replica{asleep(replica("s-0", "s", "n1", 1, 0)), asleep(replica("m-0", "m", "n1", 2, 1))}},
			"m", "2 of 3 replicas cannot be placed: each needs 2 GPUs; matching nodes: n1 (3 GPUs, 0 free: 3 held by m-0, 1 new of m)"},
		{"a replica that must move has nowhere to go",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 1, 1), model("o", 1, 1)},
				Nodes:    []*llmgwv1.Node{inState(node("a", 1), llmgwv1.NodeState_NODE_STATE_DRAINING), node("b", 1)},
				Replicas: []*llmgwv1.Replica{replica("m-0", "m", "a", 1, 0), replica("o-0", "o", "b", 2, 0)}},
			"m", "a replica that must move (node draining, selector, size or revision changed) cannot be replaced, so it stays: each needs 1 GPU; matching nodes: b (1 GPU, 0 free: 1 held by o-0); nodes not active: a (draining)"},
		{"external endpoints without an owner",
			&llmgwv1.State{Models: []*llmgwv1.Model{selective(externalModel("ext", "http://127.0.0.1:8000", "http://127.0.0.1:8001"), "role", "probe")},
				Nodes: []*llmgwv1.Node{node("n1", 0), inState(node("n2", 0, "role", "probe"), llmgwv1.NodeState_NODE_STATE_DOWN)}},
			"ext", "2 of 2 endpoints have no owner: no active node matches the selector {role: probe}; matching but not active: n2 (down); nodes not matching the selector {role: probe}: n1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Reconcile(tt.state, Inputs{})
			if got := p.Unplaced[tt.model]; got != tt.want {
				t.Errorf("reason\n got %q\nwant %q", got, tt.want)
			}
			if len(p.Unplaced) != len(p.Unplaceable) {
				t.Errorf("reasons for %d models, %d short", len(p.Unplaced), len(p.Unplaceable))
			}
		})
	}
}

// TestUnplacedReasonOnlyWhenShort: a model with all its replicas placed
// has no reason, and a reason does not change from round to round while
// nothing changes.
func TestUnplacedReasonOnlyWhenShort(t *testing.T) {
	st := &llmgwv1.State{Models: []*llmgwv1.Model{model("a", 2, 1), model("b", 3, 2)}, Nodes: []*llmgwv1.Node{node("n1", 4), node("n2", 2)}}
	first := Reconcile(st, Inputs{})
	if _, ok := first.Unplaced["a"]; ok {
		t.Fatalf("a fits, yet has a reason: %q", first.Unplaced["a"])
	}
	for i := range 10 {
		if got := Reconcile(st, Inputs{}).Unplaced["b"]; got != first.Unplaced["b"] || got == "" {
			t.Fatalf("round %d: %q, first %q", i, got, first.Unplaced["b"])
		}
	}
}
