// Package placement decides where replicas run (design §5.5). It is pure: it
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

	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Plan is what to change so every model has its replica count.
type Plan struct {
	// Place holds new replicas (empty id and uid; model, node and GPU
	// indices set), in the order they should be proposed.
	Place []*llmgwv1.Replica
	// Drain holds replicas to mark draining (id and uid set): routers stop
	// choosing them and the agent stops each engine once idle (design §4
	// "Changes roll").
	Drain []*llmgwv1.Replica
	// Remove holds replicas to remove now (id and uid set): drained ones,
	// and those on lost nodes, which serve nothing.
	Remove []*llmgwv1.Replica
	// Unplaceable counts, per model, replicas that fit on no node now.
	// The leader reports it; placement retries on the next state change.
	Unplaceable map[string]int
	// Unplaced says, in words, why each model of Unplaceable is short
	// (why.go): which nodes match, how many GPUs each has free for it and
	// what holds the rest, bounded to a few nodes and holders (design §5.7
	// "Saying why").
	Unplaced map[string]string
	// Spread holds the spread moves this plan starts (its replacement is
	// in Place), so the leader can say why it places a replica beyond the
	// count.
	Spread []SpreadMove
	// Sleep and Wake hold replicas of models with autoscale.sleep to put
	// to sleep (a surplus, instead of a drain) and to wake (a shortfall,
	// before a new replica is placed) (design §5.7 "Sharing GPUs").
	Sleep, Wake []*llmgwv1.Replica
	// Take holds replicas of idle models of lower priority that give their
	// GPUs to a model no node has room for (sharing.go).
	Take []Taking
}

// SpreadMove is the start of one spread move: a replica of Model leaves
// From, the node holding the most of them, for To, the least-loaded node
// with room (Reconcile's spread rule). When nodes tie for the most, the
// replica that drains may be another one's (keepSpread chooses it).
type SpreadMove struct {
	Model, From, To string
}

// Empty reports whether the plan changes nothing.
func (p Plan) Empty() bool {
	return len(p.Place) == 0 && len(p.Drain) == 0 && len(p.Remove) == 0 && len(p.Sleep) == 0 && len(p.Wake) == 0 && len(p.Take) == 0
}

// Inputs is what the leader knows beyond the desired state: readiness from
// the ephemeral plane and time-based judgements from its own clock, so that
// Reconcile stays pure. Nil functions answer false.
type Inputs struct {
	// Ready reports whether the replica's latest status (same uid) is
	// READY.
	Ready func(r *llmgwv1.Replica) bool
	// Drained reports whether a draining replica may be removed: its engine
	// stopped, or the drain timeout passed.
	Drained func(r *llmgwv1.Replica) bool
	// Lost holds nodes that have been DOWN longer than the grace period:
	// their replicas are removed and placed elsewhere.
	Lost map[string]bool
	// Idle reports whether nothing asks for a model and nothing runs on
	// it (the routers' demand, design §5.7): only an idle model gives a
	// GPU to another. Nil: none is idle.
	Idle func(model string) bool
}

// nodeFree is a node's GPUs as one Reconcile sees them, changed by the
// placements it plans.
type nodeFree struct {
	node *llmgwv1.Node
	free []uint32 // GPU indices no replica holds, ascending
	// asleep holds the GPUs whose every holder sleeps, with the models of
	// those holders: free to any other model, since a sleeping engine has
	// given its GPU memory back (design §5.7 "Sharing GPUs"); not to the
	// sleepers' own model, which wakes one instead.
	asleep map[uint32][]string
	// holders are the replicas holding GPUs here, by id (why.go names
	// them); added counts this plan's new replicas here, per model.
	holders []*llmgwv1.Replica
	added   map[string]int
}

// avail is how many GPUs a new replica of model may take here.
func (nf *nodeFree) avail(model string) int {
	n := len(nf.free)
	for _, models := range nf.asleep {
		if !slices.Contains(models, model) {
			n++
		}
	}
	return n
}

// take gives n GPUs to a new replica of model: free ones first (a sleeper
// keeps its GPU while there is another), then sleeping ones, lowest index
// first.
func (nf *nodeFree) take(model string, n int) []uint32 {
	out := slices.Clone(nf.free[:min(n, len(nf.free))])
	nf.free = nf.free[len(out):]
	if len(out) < n {
		gs := make([]uint32, 0, len(nf.asleep))
		for g, models := range nf.asleep {
			if !slices.Contains(models, model) {
				gs = append(gs, g)
			}
		}
		slices.Sort(gs)
		for _, g := range gs[:n-len(out)] {
			out = append(out, g)
			delete(nf.asleep, g)
		}
		slices.Sort(out)
	}
	return out
}

// Reconcile compares each model's effective replica count
// (fsm.EffectiveReplicas) with its placements:
//   - draining replicas count for nothing; a drained one is removed;
//   - replicas on lost nodes are removed, and count for nothing;
//   - missing replicas go to ACTIVE nodes that match the model's
//     node_selector and have gpus_per_replica free GPUs, spread over nodes:
//     fewest replicas of this model first, then most free GPUs, then node id
//     (so the result does not depend on map order);
//   - extra replicas are drained, highest ordinal first (the newest go
//     first, so ids stay low and stable);
//   - replicas that must move (on a DRAINING node, off the node_selector,
//     of another size than gpus_per_replica, or placed for an older model
//     revision — a re-apply that needs a restart) move one at a time: a
//     replacement is placed while every other replica is ready; once it is
//     ready too, one moving replica drains; then the next — capacity never
//     dips during a move (design §4 "Changes roll", §5.5);
//   - spread: a model none of whose replicas is missing, surplus or
//     moving, all of them ready and on ACTIVE nodes, whose busiest node
//     holds at least two more of them than the least-loaded ACTIVE
//     matching node with room, moves one replica there by the same
//     rolling move: a replacement is placed there; once it is ready one
//     replica of the busiest node drains (see spreadRule for why two, and
//     why this cannot flap);
//   - a surplus is drained from the nodes holding the most replicas of
//     the model first (not-ready ones, then the highest ordinal, first
//     among equals), so a scale-down keeps the spread; a ready one drains
//     only once every replica kept is ready, so a spread move never dips
//     below the count either;
//   - a sleeping replica (design §5.7) counts as placed, but its GPUs
//     are free to other models' new replicas (nodeFree.asleep);
//   - engine "external" runs nothing on the nodes: each of its endpoints is
//     one replica, owned by an agent that probes it (Plan.external);
//   - a model still short of replicas gets the reason in words
//     (Plan.Unplaced).
func Reconcile(st *llmgwv1.State, in Inputs) Plan {
	ready := orFalse(in.Ready)
	drained := orFalse(in.Drained)
	plan := Plan{Unplaceable: map[string]int{}, Unplaced: map[string]string{}}
	// One pass over the replicas: GPUs held awake and asleep per node,
	// replicas per model and per node.
	awake := map[string]map[uint32]bool{}
	asleep := map[string]map[uint32][]string{}
	// parked holds every GPU a sleeper is parked on, whoever else holds
	// it: a surplus there drains first, so the sleeper can wake.
	parked := map[string]map[uint32]bool{}
	byModel := map[string][]*llmgwv1.Replica{}
	onNode := map[string][]*llmgwv1.Replica{}
	for _, r := range st.GetReplicas() {
		byModel[r.Model] = append(byModel[r.Model], r)
		if in.Lost[r.Node] || len(r.GpuIndices) == 0 {
			continue
		}
		onNode[r.Node] = append(onNode[r.Node], r)
		for _, g := range r.GpuIndices {
			if r.Sleeping {
				if parked[r.Node] == nil {
					parked[r.Node] = map[uint32]bool{}
				}
				parked[r.Node][g] = true
				if asleep[r.Node] == nil {
					asleep[r.Node] = map[uint32][]string{}
				}
				if !slices.Contains(asleep[r.Node][g], r.Model) {
					asleep[r.Node][g] = append(asleep[r.Node][g], r.Model)
				}
				continue
			}
			if awake[r.Node] == nil {
				awake[r.Node] = map[uint32]bool{}
			}
			awake[r.Node][g] = true
		}
	}
	nodeByID := map[string]*llmgwv1.Node{}
	nodes := map[string]*nodeFree{}
	for _, n := range st.GetNodes() {
		nodeByID[n.Id] = n
		nf := &nodeFree{node: n, holders: onNode[n.Id], asleep: map[uint32][]string{}, added: map[string]int{}}
		for g := uint32(0); g < n.Gpus; g++ {
			switch {
			case awake[n.Id][g]:
			case asleep[n.Id][g] != nil:
				nf.asleep[g] = asleep[n.Id][g]
			default:
				nf.free = append(nf.free, g)
			}
		}
		nodes[n.Id] = nf
	}
	models := slices.Clone(st.GetModels())
	// Higher priority first: a GPU a sleeper left is offered to the model
	// that outranks it before the sleeper's own model may wake on it.
	slices.SortFunc(models, func(a, b *llmgwv1.Model) int {
		return cmp.Or(cmp.Compare(b.Priority, a.Priority), cmp.Compare(a.Name, b.Name))
	})
	// owned counts each node's external replicas of every model, which
	// spreads the owning of them (external.go).
	owned := map[string]int{}
	for _, m := range models {
		if m.Engine != "external" {
			continue
		}
		for _, r := range byModel[m.Name] {
			if !r.Draining && !in.Lost[r.Node] {
				owned[r.Node]++
			}
		}
	}
	for _, m := range models {
		if m.Engine == "external" {
			plan.external(m, byModel[m.Name], nodes, nodeByID, owned, in, ready, drained)
			continue
		}
		var stay, moving, sleeping []*llmgwv1.Replica
		// perNode counts the replicas that stay: a moving one is leaving,
		// so it holds no share of its node.
		perNode := map[string]int{}
		sleeps := m.GetAutoscale().GetSleep()
		for _, r := range sortedReplicas(byModel[m.Name], m.Name) {
			switch {
			case in.Lost[r.Node]:
				plan.Remove = append(plan.Remove, ref(r))
			case r.Draining:
				if drained(r) {
					plan.Remove = append(plan.Remove, ref(r))
				}
			case r.Sleeping && sleeps:
				// Parked: not serving, so not of the count; woken first
				// when the count grows (design §5.7).
				sleeping = append(sleeping, r)
			case misplaced(r, m, nodeByID[r.Node]):
				moving = append(moving, r)
			default:
				stay = append(stay, r)
				perNode[r.Node]++
			}
		}
		want := int(fsm.EffectiveReplicas(st, m))
		if sleeps {
			plan.parkSleepers(m, sleeping, len(stay))
		}
		if len(stay) == want && len(moving) == 0 && countReady(stay, ready) == want && allActive(stay, nodeByID) {
			if mv, ok := spreadRule(nodes, perNode, m); ok {
				plan.Spread = append(plan.Spread, mv)
				plan.place(nodes[mv.To], perNode, m)
				continue
			}
		}
		if len(stay) >= want {
			onParked := func(r *llmgwv1.Replica) bool {
				return slices.ContainsFunc(r.GpuIndices, func(g uint32) bool { return parked[r.Node][g] })
			}
			keep, extra := keepSpread(stay, want, ready, onParked)
			keptReady := countReady(keep, ready) == want
			for _, r := range extra {
				switch {
				case sleeps && ready(r) && len(moving) == 0:
					// A ready surplus of a model that sleeps is parked,
					// not stopped: a wake is seconds, a start a load.
					plan.Sleep = append(plan.Sleep, ref(r))
				case keptReady || !ready(r):
					plan.Drain = append(plan.Drain, ref(r))
				}
			}
			if keptReady {
				for _, r := range moving {
					plan.Drain = append(plan.Drain, ref(r))
				}
			}
			continue
		}
		short := max(want-len(stay)-len(moving), 0)
		if sleeps {
			short -= plan.wake(sleeping, short, nodes)
		}
		missing := short
		if len(moving) > 0 && countReady(stay, ready) == len(stay) {
			// One move at a time: while every replica that stays is ready,
			// either a replacement is up (a surplus over the count), so one
			// moving replica drains, or none is, so one is placed. Serving
			// capacity never dips below the count, and rises by at most one.
			if surplus := len(stay) + len(moving) - want; surplus > 0 {
				for _, r := range moving[:min(surplus, len(moving))] {
					plan.Drain = append(plan.Drain, ref(r))
				}
			} else {
				missing++
			}
		}
		for i := 0; i < missing; i++ {
			best := pick(nodes, perNode, m)
			if best == nil {
				plan.Unplaceable[m.Name] = missing - i
				plan.Unplaced[m.Name] = whyUnplaced(m, min(missing-i, short), want, nodes)
				plan.takeFor(m, missing-i, st, byModel, nodes, in, ready)
				break
			}
			plan.place(best, perNode, m)
		}
	}
	return plan
}

// place adds a new replica of m on nf, taking its GPUs from nf's free
// ones.
func (p *Plan) place(nf *nodeFree, perNode map[string]int, m *llmgwv1.Model) {
	gpus := nf.take(m.Name, int(m.GpusPerReplica))
	nf.added[m.Name]++
	perNode[nf.node.Id]++
	p.Place = append(p.Place, &llmgwv1.Replica{Model: m.Name, Node: nf.node.Id, GpuIndices: gpus, Weight: 1})
}

// spreadRule says whether a model whose replicas are all placed and ready
// should move one (perNode: its replicas per node). It does when the node
// holding the most of them (ties: the lowest id) holds at least two more
// than the node pick would place a new one on — the least-loaded ACTIVE
// node matching the selector with room. So a model never keeps all its
// replicas (two or more) on one node while another such node has room.
//
// Why a gap of two, not one: a move takes one from the busiest node and
// gives one to the other, so the gap between them shrinks by two. With a
// gap of two or more no move can undo another (the reverse would need the
// receiving node to end two above the giving one), and each move lowers
// the sum of squares of the per-node counts by at least two, so moves
// end; with a gap of one a move would only swap which node has the extra
// replica, and flap. An odd count on two nodes (3 as 2+1) is as spread as
// it gets.
func spreadRule(nodes map[string]*nodeFree, perNode map[string]int, m *llmgwv1.Model) (SpreadMove, bool) {
	from, most := "", 0
	for id, n := range perNode {
		if n > most || (n == most && id < from) {
			from, most = id, n
		}
	}
	to := pick(nodes, perNode, m)
	if to == nil || most-perNode[to.node.Id] < 2 {
		return SpreadMove{}, false
	}
	return SpreadMove{Model: m.Name, From: from, To: to.node.Id}, true
}

// allActive: every replica's node is ACTIVE. A DOWN node within its grace
// is left to the liveness rules (design §5.4): a spread move does not
// start from it, or the grace would move replicas that may still serve.
func allActive(rs []*llmgwv1.Replica, nodeByID map[string]*llmgwv1.Node) bool {
	for _, r := range rs {
		if nodeByID[r.Node].GetState() != llmgwv1.NodeState_NODE_STATE_ACTIVE {
			return false
		}
	}
	return true
}

// keepSpread splits the replicas that stay (sorted by ordinal) into the
// want to keep and the extra to drain. Extras are taken one by one from
// the node holding the most of those left; among equals a not-ready one
// goes first (draining it costs no serving capacity), then one on a GPU
// another model's sleeper is parked on (design §5.7: that model can then
// wake rather than start anew), then the highest ordinal (so ids stay low
// and stable). Taking from the busiest node is what ends a spread move on
// the right replica: its replacement, on a node with fewer, stays.
func keepSpread(stay []*llmgwv1.Replica, want int, ready, onParked func(*llmgwv1.Replica) bool) (keep, extra []*llmgwv1.Replica) {
	keep = slices.Clone(stay)
	count := map[string]int{}
	for _, r := range keep {
		count[r.Node]++
	}
	for len(keep) > want {
		victim := 0
		for i := 1; i < len(keep); i++ {
			if goesFirst(keep[i], keep[victim], count, ready, onParked) {
				victim = i
			}
		}
		r := keep[victim]
		extra = append(extra, r)
		count[r.Node]--
		keep = slices.Delete(keep, victim, victim+1)
	}
	return keep, extra
}

// goesFirst: a is drained before b (keep is sorted by ordinal, so a later
// one of equal rank has the higher ordinal and wins the tie).
func goesFirst(a, b *llmgwv1.Replica, count map[string]int, ready, onParked func(*llmgwv1.Replica) bool) bool {
	if count[a.Node] != count[b.Node] {
		return count[a.Node] > count[b.Node]
	}
	if ra, rb := ready(a), ready(b); ra != rb {
		return !ra
	}
	if pa, pb := onParked(a), onParked(b); pa != pb {
		return pa
	}
	return true
}

// misplaced reports whether a replica must move, one at a time like any
// move: its node is draining (or gone), no longer matches the model's
// node_selector, the model now wants another number of GPUs per replica, or
// the replica runs an older revision of the model (fsm.NeedsRestart). So
// re-applying a model with a new spec, selector or size rolls its replicas.
// A replica without a model revision (placed before replicas recorded it)
// is taken as current rather than restarted for no change.
func misplaced(r *llmgwv1.Replica, m *llmgwv1.Model, n *llmgwv1.Node) bool {
	return n == nil || n.State == llmgwv1.NodeState_NODE_STATE_DRAINING ||
		!Matches(n, m.NodeSelector) || len(r.GpuIndices) != int(m.GpusPerReplica) ||
		(r.ModelRevision != 0 && r.ModelRevision < m.Revision)
}

func countReady(rs []*llmgwv1.Replica, ready func(*llmgwv1.Replica) bool) int {
	n := 0
	for _, r := range rs {
		if ready(r) {
			n++
		}
	}
	return n
}

func ref(r *llmgwv1.Replica) *llmgwv1.Replica {
	return &llmgwv1.Replica{Id: r.Id, Uid: r.Uid, Model: r.Model, Node: r.Node}
}

func orFalse(f func(*llmgwv1.Replica) bool) func(*llmgwv1.Replica) bool {
	if f == nil {
		return func(*llmgwv1.Replica) bool { return false }
	}
	return f
}

// sortedReplicas returns a model's replicas by ordinal, then id.
func sortedReplicas(rs []*llmgwv1.Replica, model string) []*llmgwv1.Replica {
	out := slices.Clone(rs)
	slices.SortFunc(out, func(a, b *llmgwv1.Replica) int {
		return cmp.Or(cmp.Compare(ordinal(a.Id, model), ordinal(b.Id, model)), cmp.Compare(a.Id, b.Id))
	})
	return out
}

func pick(nodes map[string]*nodeFree, perNode map[string]int, m *llmgwv1.Model) *nodeFree {
	var best *nodeFree
	for _, nf := range nodes {
		if nf.node.State != llmgwv1.NodeState_NODE_STATE_ACTIVE || nf.avail(m.Name) < int(m.GpusPerReplica) || !Matches(nf.node, m.NodeSelector) {
			continue
		}
		if best == nil || better(nf, best, perNode, m.Name) {
			best = nf
		}
	}
	return best
}

func better(a, b *nodeFree, perNode map[string]int, model string) bool {
	return cmp.Or(
		cmp.Compare(perNode[a.node.Id], perNode[b.node.Id]),
		cmp.Compare(b.avail(model), a.avail(model)),
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

// ordinal is the number after "<model>-" in a replica id; ids without one
// sort first, so they are drained last (-1).
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
