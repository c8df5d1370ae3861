// Package placement decides where replicas run (plan §5.5). It is pure: it
// reads a copy of the desired state and returns decisions; the leader turns
// each decision into a Raft command, and the FSM re-checks every one of them
// (a GPU given twice is refused there), so a decision made on a stale view is
// harmless.
package placement

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Plan is what to change so every model has its replica count.
type Plan struct {
	// Place holds new replicas (empty id and uid; model, node and GPU
	// indices set), in the order they should be proposed.
	Place []*llmgwv1.Replica
	// Remove holds replicas to remove (id and uid set).
	Remove []*llmgwv1.Replica
	// Unplaceable counts, per model, replicas that fit on no node now.
	// The leader reports it; placement retries on the next state change.
	Unplaceable map[string]int
}

// Empty reports whether the plan changes nothing.
func (p Plan) Empty() bool { return len(p.Place) == 0 && len(p.Remove) == 0 }

type nodeFree struct {
	node *llmgwv1.Node
	free []uint32 // free GPU indices, ascending
}

// Reconcile compares each model's replica count with its placements:
//   - missing replicas go to ACTIVE nodes that match the model's
//     node_selector and have gpus_per_replica free GPUs, spread over nodes:
//     fewest replicas of this model first, then most free GPUs, then node id
//     (so the result does not depend on map order);
//   - extra replicas are removed, highest ordinal first (the newest go
//     first, so ids stay low and stable);
//   - draining replicas are on their way out: they count for neither;
//   - engine "external" runs nothing on the nodes and is left alone.
//
// Not yet: rescheduling off DOWN nodes after a grace period and moving
// replicas off DRAINING nodes one at a time (both need the leader's clock).
func Reconcile(st *llmgwv1.State) Plan {
	plan := Plan{Unplaceable: map[string]int{}}
	nodes := map[string]*nodeFree{}
	for _, n := range st.GetNodes() {
		nf := &nodeFree{node: n}
		used := map[uint32]bool{}
		for _, r := range st.GetReplicas() {
			if r.Node == n.Id {
				for _, g := range r.GpuIndices {
					used[g] = true
				}
			}
		}
		for g := uint32(0); g < n.Gpus; g++ {
			if !used[g] {
				nf.free = append(nf.free, g)
			}
		}
		nodes[n.Id] = nf
	}
	models := slices.Clone(st.GetModels())
	slices.SortFunc(models, func(a, b *llmgwv1.Model) int { return cmp.Compare(a.Name, b.Name) })
	for _, m := range models {
		if m.Engine == "external" {
			continue
		}
		var live []*llmgwv1.Replica
		perNode := map[string]int{}
		for _, r := range st.GetReplicas() {
			if r.Model == m.Name && !r.Draining {
				live = append(live, r)
				perNode[r.Node]++
			}
		}
		want := int(m.Replicas)
		if len(live) > want {
			slices.SortFunc(live, func(a, b *llmgwv1.Replica) int {
				return cmp.Or(cmp.Compare(ordinal(b.Id, m.Name), ordinal(a.Id, m.Name)), cmp.Compare(a.Id, b.Id))
			})
			for _, r := range live[:len(live)-want] {
				plan.Remove = append(plan.Remove, &llmgwv1.Replica{Id: r.Id, Uid: r.Uid, Model: r.Model, Node: r.Node})
			}
			continue
		}
		for i := len(live); i < want; i++ {
			best := pick(nodes, perNode, m)
			if best == nil {
				plan.Unplaceable[m.Name] = want - i
				break
			}
			gpus := slices.Clone(best.free[:m.GpusPerReplica])
			best.free = best.free[m.GpusPerReplica:]
			perNode[best.node.Id]++
			plan.Place = append(plan.Place, &llmgwv1.Replica{Model: m.Name, Node: best.node.Id, GpuIndices: gpus, Weight: 1})
		}
	}
	return plan
}

func pick(nodes map[string]*nodeFree, perNode map[string]int, m *llmgwv1.Model) *nodeFree {
	var best *nodeFree
	for _, nf := range nodes {
		if nf.node.State != llmgwv1.NodeState_NODE_STATE_ACTIVE || len(nf.free) < int(m.GpusPerReplica) || !Matches(nf.node, m.NodeSelector) {
			continue
		}
		if best == nil || better(nf, best, perNode) {
			best = nf
		}
	}
	return best
}

func better(a, b *nodeFree, perNode map[string]int) bool {
	return cmp.Or(
		cmp.Compare(perNode[a.node.Id], perNode[b.node.Id]),
		cmp.Compare(len(b.free), len(a.free)),
		cmp.Compare(a.node.Id, b.node.Id),
	) < 0
}

// Matches reports whether a node carries every label of the selector.
func Matches(n *llmgwv1.Node, selector map[string]string) bool {
	for k, v := range selector {
		if got, ok := n.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// ordinal is the number after "<model>-" in a replica id; ids that do not
// have one sort last-removed (-1).
func ordinal(id, model string) int64 {
	s, ok := strings.CutPrefix(id, model+"-")
	if !ok {
		return -1
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return -1
	}
	return n
}
