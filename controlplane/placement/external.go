package placement

import (
	"cmp"
	"slices"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// External engines (design §5.5, §6): llmgw runs nothing for a model of
// engine "external", but every one of its endpoints is a replica, so that
// routers see it through the same status, scheduler and breakers as any
// other. A replica's node is its owner: the agent that probes the engine,
// reports its status with the endpoint as address, reads its load and
// subscribes to its KV events. Owning costs an agent a probe a second and
// one scrape every 50 ms, no GPU.
//
// The rules, per endpoint:
//   - each endpoint has one replica; one that has none gets one, owned by
//     the ACTIVE node matching the node selector that owns the fewest
//     replicas of this model, then the fewest external replicas of any
//     model, then the lowest id: spread, and independent of map order;
//   - an owner that is DOWN, DRAINING, gone or off the selector, or a
//     replica placed for an older model revision, is replaced: a new
//     replica for the same endpoint goes to another owner, and once it is
//     READY (or the old one is not serving anyway) the old one is removed
//     (DOWN or gone owner: no agent is left to drain it) or drained. There
//     is no grace before moving off a DOWN owner: the engine runs on, so
//     moving loses nothing, and staying leaves the endpoint unprobed;
//   - an owner that comes back gets nothing back: replicas stay where they
//     are (stable) — owning is too cheap for a rebalance to be worth a
//     moment of a replica not READY;
//   - a replica for an endpoint the model no longer lists is drained.
func (p *Plan) external(m *llmgwv1.Model, replicas []*llmgwv1.Replica, nodes map[string]*nodeFree, nodeByID map[string]*llmgwv1.Node,
	owned map[string]int, in Inputs, ready, drained func(*llmgwv1.Replica) bool) {
	byEndpoint := map[string][]*llmgwv1.Replica{}
	for _, r := range sortedReplicas(replicas, m.Name) {
		switch {
		case in.Lost[r.Node]:
			p.Remove = append(p.Remove, ref(r))
		case r.Draining:
			if drained(r) {
				p.Remove = append(p.Remove, ref(r))
			}
		case !slices.Contains(m.Endpoints, r.Endpoint):
			p.Drain = append(p.Drain, ref(r))
		default:
			byEndpoint[r.Endpoint] = append(byEndpoint[r.Endpoint], r)
		}
	}
	perNode := map[string]int{}
	for _, rs := range byEndpoint {
		for _, r := range rs {
			perNode[r.Node]++
		}
	}
	seen := map[string]bool{}
	for _, ep := range m.Endpoints {
		if seen[ep] {
			continue // the entry points refuse duplicates; an older entry may hold one
		}
		seen[ep] = true
		var keep, moving []*llmgwv1.Replica
		for _, r := range byEndpoint[ep] {
			if ownerGone(r, m, nodeByID[r.Node]) {
				moving = append(moving, r)
			} else {
				keep = append(keep, r)
			}
		}
		if len(keep) == 0 {
			owner := pickOwner(nodes, perNode, owned, m)
			if owner == nil {
				p.Unplaceable[m.Name]++
				continue
			}
			perNode[owner.Id]++
			owned[owner.Id]++
			p.Place = append(p.Place, &llmgwv1.Replica{Model: m.Name, Node: owner.Id, Endpoint: ep, Weight: 1})
			continue
		}
		// The replica kept is the first ready one by ordinal, else the
		// first; the rest are a move's surplus.
		kept := keep[0]
		if i := slices.IndexFunc(keep, ready); i >= 0 {
			kept = keep[i]
		}
		for _, r := range keep {
			if r != kept && (ready(kept) || !ready(r)) {
				p.Drain = append(p.Drain, ref(r))
			}
		}
		for _, r := range moving {
			if !ready(kept) && ready(r) {
				continue // the old owner still serves it until the new one does
			}
			if n := nodeByID[r.Node]; n == nil || n.State == llmgwv1.NodeState_NODE_STATE_DOWN {
				p.Remove = append(p.Remove, ref(r))
			} else {
				p.Drain = append(p.Drain, ref(r))
			}
		}
	}
	if n := p.Unplaceable[m.Name]; n > 0 {
		p.Unplaced[m.Name] = whyNoOwner(m, n, nodes)
	}
}

// ownerGone reports whether an external replica must move to another
// owner: its node is not ACTIVE (DOWN, DRAINING or gone), no longer
// matches the model's selector, or the replica was placed for an older
// revision of the model (its agent would keep the old KV-event sockets).
func ownerGone(r *llmgwv1.Replica, m *llmgwv1.Model, n *llmgwv1.Node) bool {
	return n == nil || n.State != llmgwv1.NodeState_NODE_STATE_ACTIVE || !Matches(n, m.NodeSelector) ||
		(r.ModelRevision != 0 && r.ModelRevision < m.Revision)
}

// pickOwner is the node a new external replica of m goes to: ACTIVE,
// matching the selector, owning the fewest replicas of m, then the fewest
// external replicas of any model, then the lowest id. GPUs do not count.
func pickOwner(nodes map[string]*nodeFree, perNode, owned map[string]int, m *llmgwv1.Model) *llmgwv1.Node {
	var best *llmgwv1.Node
	for _, nf := range nodes {
		n := nf.node
		if n.State != llmgwv1.NodeState_NODE_STATE_ACTIVE || !Matches(n, m.NodeSelector) {
			continue
		}
		if best == nil || cmp.Or(cmp.Compare(perNode[n.Id], perNode[best.Id]), cmp.Compare(owned[n.Id], owned[best.Id]),
			cmp.Compare(n.Id, best.Id)) < 0 {
			best = n
		}
	}
	return best
}
