package placement

import (
	"testing"

	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func autoscaled(name string, replicas, lo, hi uint32) *llmgwv1.Model {
	m := model(name, replicas, 1)
	m.Autoscale = &llmgwv1.Autoscale{Min: lo, Max: hi, TargetWaiting: 4}
	return m
}

func scale(model string, replicas uint32) *llmgwv1.ModelScale {
	return &llmgwv1.ModelScale{Model: model, Replicas: replicas, Reason: "test"}
}

func asleep(r *llmgwv1.Replica) *llmgwv1.Replica {
	r.Sleeping = true
	return r
}

func TestEffectiveReplicas(t *testing.T) {
	tests := []struct {
		name   string
		model  *llmgwv1.Model
		scales []*llmgwv1.ModelScale
		want   uint32
	}{
		{"no autoscale: the spec's count", model("m", 3, 1), nil, 3},
		{"no autoscale: a scale entry is not read", model("m", 3, 1), []*llmgwv1.ModelScale{scale("m", 7)}, 3},
		{"autoscale, no decision: the spec's count", autoscaled("m", 3, 1, 5), nil, 3},
		{"autoscale, no decision: raised to min", autoscaled("m", 1, 2, 5), nil, 2},
		{"autoscale, no decision: lowered to max", autoscaled("m", 9, 2, 5), nil, 5},
		{"the decision", autoscaled("m", 3, 0, 8), []*llmgwv1.ModelScale{scale("m", 6)}, 6},
		{"the decision to zero", autoscaled("m", 3, 0, 8), []*llmgwv1.ModelScale{scale("m", 0)}, 0},
		{"the decision, raised to min", autoscaled("m", 3, 2, 8), []*llmgwv1.ModelScale{scale("m", 1)}, 2},
		{"the decision, lowered to max (a spec re-applied narrower)", autoscaled("m", 3, 0, 4), []*llmgwv1.ModelScale{scale("m", 7)}, 4},
		{"another model's decision", autoscaled("m", 3, 0, 8), []*llmgwv1.ModelScale{scale("a", 1), scale("z", 6)}, 3},
		{"among others, sorted", autoscaled("m", 3, 0, 8), []*llmgwv1.ModelScale{scale("a", 1), scale("m", 5), scale("z", 6)}, 5},
		{"among others, unsorted", autoscaled("m", 3, 0, 8), []*llmgwv1.ModelScale{scale("z", 6), scale("m", 5), scale("a", 1)}, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := &llmgwv1.State{Models: []*llmgwv1.Model{tt.model}, Scales: tt.scales}
			if got := fsm.EffectiveReplicas(st, tt.model); got != tt.want {
				t.Errorf("EffectiveReplicas = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestReconcileElastic: placement works to the effective count, and a
// sleeping replica counts as placed while its GPUs are free to other
// models (design §5.7).
func TestReconcileElastic(t *testing.T) {
	ready := func(*llmgwv1.Replica) bool { return true }
	tests := []struct {
		name  string
		state *llmgwv1.State
		in    Inputs
		want  string
	}{
		{"the autoscaler's count is placed, not the spec's",
			&llmgwv1.State{Models: []*llmgwv1.Model{autoscaled("m", 1, 0, 4)}, Nodes: []*llmgwv1.Node{node("a", 4)},
				Scales: []*llmgwv1.ModelScale{scale("m", 3)}},
			Inputs{}, "+m@a[0] +m@a[1] +m@a[2] "},
		{"the spec's count until the autoscaler decides",
			&llmgwv1.State{Models: []*llmgwv1.Model{autoscaled("m", 2, 0, 4)}, Nodes: []*llmgwv1.Node{node("a", 4)}},
			Inputs{}, "+m@a[0] +m@a[1] "},
		{"a count beyond max is placed to max",
			&llmgwv1.State{Models: []*llmgwv1.Model{autoscaled("m", 1, 0, 2)}, Nodes: []*llmgwv1.Node{node("a", 4)},
				Scales: []*llmgwv1.ModelScale{scale("m", 4)}},
			Inputs{}, "+m@a[0] +m@a[1] "},
		{"scaled to zero: every replica drains",
			&llmgwv1.State{Models: []*llmgwv1.Model{autoscaled("m", 2, 0, 4)}, Nodes: []*llmgwv1.Node{node("a", 4)},
				Scales:   []*llmgwv1.ModelScale{scale("m", 0)},
				Replicas: []*llmgwv1.Replica{replica("m-0", "m", "a", 1, 0), replica("m-1", "m", "a", 2, 1)}},
			Inputs{Ready: ready}, "~m-1 ~m-0 "},
		{"a sleeping replica counts as placed",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("s", 1, 1)}, Nodes: []*llmgwv1.Node{node("a", 2)},
				Replicas: []*llmgwv1.Replica{asleep(replica("s-0", "s", "a", 1, 0))}},
			Inputs{}, ""},
		{"a sleeping replica's GPU goes to another model",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 1, 1), model("s", 1, 1)}, Nodes: []*llmgwv1.Node{node("a", 1)},
				Replicas: []*llmgwv1.Replica{asleep(replica("s-0", "s", "a", 1, 0))}},
			Inputs{}, "+m@a[0] "},
		{"free GPUs go first, sleeping ones after",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 2, 1), model("s", 1, 1)}, Nodes: []*llmgwv1.Node{node("a", 2)},
				Replicas: []*llmgwv1.Replica{asleep(replica("s-0", "s", "a", 1, 0))}},
			Inputs{}, "+m@a[1] +m@a[0] "},
		{"a replica of two GPUs over a free one and a sleeping one",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 1, 2), model("s", 1, 1)}, Nodes: []*llmgwv1.Node{node("a", 2)},
				Replicas: []*llmgwv1.Replica{asleep(replica("s-0", "s", "a", 1, 1))}},
			Inputs{}, "+m@a[0 1] "},
		{"not to the sleeper's own model: it wakes one instead",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("s", 2, 1)}, Nodes: []*llmgwv1.Node{node("a", 1)},
				Replicas: []*llmgwv1.Replica{asleep(replica("s-0", "s", "a", 1, 0))}},
			Inputs{}, "!s:1 "},
		{"a GPU also held by an awake replica is held",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 1, 1), model("s", 1, 1), model("o", 1, 1)}, Nodes: []*llmgwv1.Node{node("a", 1)},
				Replicas: []*llmgwv1.Replica{asleep(replica("s-0", "s", "a", 1, 0)), replica("o-0", "o", "a", 2, 0)}},
			Inputs{}, "!m:1 "},
		{"a sleeping GPU is given once",
			&llmgwv1.State{Models: []*llmgwv1.Model{model("m", 1, 1), model("k", 1, 1), model("s", 1, 1)}, Nodes: []*llmgwv1.Node{node("a", 1)},
				Replicas: []*llmgwv1.Replica{asleep(replica("s-0", "s", "a", 1, 0))}},
			Inputs{}, "+k@a[0] !m:1 "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := render(Reconcile(tt.state, tt.in)); got != tt.want {
				t.Errorf("plan %q, want %q", got, tt.want)
			}
		})
	}
}
