package placement

import (
	"fmt"
	"testing"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// sleeper is an autoscaled model that sleeps, of priority prio.
func sleeper(name string, prio int32) *llmgwv1.Model {
	m := autoscaled(name, 1, 0, 4)
	m.Autoscale.Sleep, m.Priority = true, prio
	return m
}

// renderSharing prints a plan's sharing decisions: "z id" sleep, "^id"
// wake, "<id>for" a GPU taken (s when by sleep), then render's.
func renderSharing(p Plan) string {
	s := ""
	for _, r := range p.Sleep {
		s += fmt.Sprintf("z%s ", r.Id)
	}
	for _, r := range p.Wake {
		s += fmt.Sprintf("^%s ", r.Id)
	}
	for _, t := range p.Take {
		how := "d"
		if t.Sleep {
			how = "s"
		}
		s += fmt.Sprintf("<%s>%s%s ", t.Replica.Id, t.For, how)
	}
	return s + render(p)
}

// TestSharing: a model that sleeps parks its surplus and wakes a sleeper
// before placing anew, but not on a GPU another model took; a model no
// node has room for takes the GPU of an idle model of lower priority —
// asleep when that model sleeps, drained otherwise — never of a pinned,
// busy or equal one, and not while GPUs are on their way to being free.
func TestSharing(t *testing.T) {
	ready := func(*llmgwv1.Replica) bool { return true }
	idle := func(m string) bool { return m != "busy" }
	withPrio := func(m *llmgwv1.Model, p int32) *llmgwv1.Model { m.Priority = p; return m }
	pinned := func(m *llmgwv1.Model) *llmgwv1.Model { m.Pinned = true; return m }
	draining := func(r *llmgwv1.Replica) *llmgwv1.Replica { r.Draining = true; return r }
	tests := []struct {
		name     string
		models   []*llmgwv1.Model
		scales   []*llmgwv1.ModelScale
		replicas []*llmgwv1.Replica
		gpus     uint32
		want     string
	}{
		{"a surplus of a sleeping model parks", []*llmgwv1.Model{sleeper("a", 0)}, []*llmgwv1.ModelScale{scale("a", 1)},
			[]*llmgwv1.Replica{replica("a-0", "a", "n1", 1, 0), replica("a-1", "a", "n1", 2, 1)}, 2, "za-1 "},
		{"short: wake before placing", []*llmgwv1.Model{sleeper("a", 0)}, []*llmgwv1.ModelScale{scale("a", 2)},
			[]*llmgwv1.Replica{replica("a-0", "a", "n1", 1, 0), asleep(replica("a-1", "a", "n1", 2, 1))}, 3, "^a-1 "},
		{"short beyond the sleepers: wake, then place", []*llmgwv1.Model{sleeper("a", 0)}, []*llmgwv1.ModelScale{scale("a", 2)},
			[]*llmgwv1.Replica{asleep(replica("a-1", "a", "n1", 2, 1))}, 3, "^a-1 +a@n1[0] "},
		{"no wake on a GPU another took", []*llmgwv1.Model{sleeper("a", 0), withPrio(model("b", 1, 1), 1)}, []*llmgwv1.ModelScale{scale("a", 1)},
			[]*llmgwv1.Replica{asleep(replica("a-0", "a", "n1", 1, 0)), replica("b-0", "b", "n1", 2, 0)}, 2, "+a@n1[1] "},
		{"a sleeper's GPU only a draining replica holds: wait for it, no start elsewhere", []*llmgwv1.Model{sleeper("a", 0), withPrio(model("b", 1, 1), 1)},
			[]*llmgwv1.ModelScale{scale("a", 1)},
			[]*llmgwv1.Replica{asleep(replica("a-0", "a", "n1", 1, 0)), replica("b-0", "b", "n1", 2, 1), draining(replica("b-1", "b", "n1", 3, 0))}, 3, ""},
		{"the drain over: wake", []*llmgwv1.Model{sleeper("a", 0), withPrio(model("b", 1, 1), 1)}, []*llmgwv1.ModelScale{scale("a", 1)},
			[]*llmgwv1.Replica{asleep(replica("a-0", "a", "n1", 1, 0)), replica("b-0", "b", "n1", 2, 1)}, 3, "^a-0 "},
		{"the higher model takes a sleeper's GPU before it wakes", []*llmgwv1.Model{sleeper("a", 0), withPrio(model("b", 2, 1), 1)},
			[]*llmgwv1.ModelScale{scale("a", 1)},
			[]*llmgwv1.Replica{asleep(replica("a-0", "a", "n1", 1, 0)), replica("b-0", "b", "n1", 2, 1)}, 2, "+b@n1[0] !a:1 "},
		{"no room: take an idle sleeper's GPU, asleep", []*llmgwv1.Model{sleeper("a", 0), withPrio(model("b", 2, 1), 1)}, nil,
			[]*llmgwv1.Replica{replica("a-0", "a", "n1", 1, 0), replica("b-0", "b", "n1", 2, 1)}, 2, "<a-0>bs !b:1 "},
		{"no room: take an idle model's GPU, drained", []*llmgwv1.Model{autoscaled("a", 1, 0, 2), withPrio(model("b", 2, 1), 1)}, nil,
			[]*llmgwv1.Replica{replica("a-0", "a", "n1", 1, 0), replica("b-0", "b", "n1", 2, 1)}, 2, "<a-0>bd !b:1 "},
		{"never a pinned model's", []*llmgwv1.Model{pinned(sleeper("a", 0)), withPrio(model("b", 2, 1), 1)}, nil,
			[]*llmgwv1.Replica{replica("a-0", "a", "n1", 1, 0), replica("b-0", "b", "n1", 2, 1)}, 2, "!b:1 "},
		{"never a busy model's", []*llmgwv1.Model{sleeper("busy", 0), withPrio(model("b", 2, 1), 1)}, nil,
			[]*llmgwv1.Replica{replica("busy-0", "busy", "n1", 1, 0), replica("b-0", "b", "n1", 2, 1)}, 2, "!b:1 "},
		{"never an equal's", []*llmgwv1.Model{sleeper("a", 1), withPrio(model("b", 2, 1), 1)}, nil,
			[]*llmgwv1.Replica{replica("a-0", "a", "n1", 1, 0), replica("b-0", "b", "n1", 2, 1)}, 2, "!b:1 "},
		{"a sleeper whose GPU was taken stays parked for the count", []*llmgwv1.Model{sleeper("a", 0), withPrio(model("b", 1, 1), 1)}, []*llmgwv1.ModelScale{scale("a", 1)},
			[]*llmgwv1.Replica{asleep(replica("a-0", "a", "n1", 1, 0)), replica("b-0", "b", "n1", 2, 0)}, 1, "!a:1 "},
		{"sleepers beyond max drain", []*llmgwv1.Model{sleeper("a", 0)}, []*llmgwv1.ModelScale{scale("a", 4)},
			[]*llmgwv1.Replica{replica("a-0", "a", "n1", 1, 0), replica("a-1", "a", "n1", 2, 1), replica("a-2", "a", "n1", 3, 2), replica("a-3", "a", "n1", 4, 3), asleep(replica("a-4", "a", "n2", 5, 0))}, 4, "~a-4 "},
		{"a surplus on a sleeper's GPU drains first", []*llmgwv1.Model{sleeper("a", 0), withPrio(autoscaled("b", 3, 1, 3), 1)}, []*llmgwv1.ModelScale{scale("a", 0), scale("b", 2)},
			[]*llmgwv1.Replica{asleep(replica("a-0", "a", "n1", 1, 0)), replica("b-0", "b", "n1", 2, 0), replica("b-1", "b", "n1", 3, 1), replica("b-2", "b", "n1", 4, 2)}, 3, "~b-0 "},
		{"not while a GPU is on its way", []*llmgwv1.Model{sleeper("a", 0), withPrio(model("b", 2, 1), 1), model("c", 0, 1)}, nil,
			[]*llmgwv1.Replica{replica("a-0", "a", "n1", 1, 0), replica("b-0", "b", "n1", 2, 1), draining(replica("c-0", "c", "n1", 3, 2))}, 3, "!b:1 "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := &llmgwv1.State{Models: tc.models, Scales: tc.scales, Replicas: tc.replicas, Nodes: []*llmgwv1.Node{node("n1", tc.gpus)}}
			if got := renderSharing(Reconcile(st, Inputs{Ready: ready, Idle: idle})); got != tc.want {
				t.Fatalf("plan %q, want %q", got, tc.want)
			}
		})
	}
}
