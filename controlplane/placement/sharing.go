package placement

import (
	"cmp"
	"slices"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// GPUs shared between models (design §5.7 "Sharing GPUs"). A model with
// autoscale.sleep parks the replicas its count no longer needs (vLLM's
// sleep mode: the weights wait in host memory, the GPU's memory is free)
// and wakes them first when the count grows. A model that no node has room
// for may take the GPUs of an idle model of lower priority: that model's
// replica is put to sleep if it sleeps, else drained, and the GPU goes to
// the model that asked on a later round, once the FSM shows it free.

// Taking is a replica of an idle model of lower priority giving its GPUs
// to model For: put to sleep when its model sleeps, else drained.
type Taking struct {
	Replica *llmgwv1.Replica
	For     string
	Sleep   bool
}

// parkSleepers drains the sleepers of m beyond what its autoscale.max
// leaves room for beside its awake replicas (the highest ordinal first): a
// parked replica still holds host memory and a process. A sleeper the
// count wants awake is within that room: it is the one to wake.
func (p *Plan) parkSleepers(m *llmgwv1.Model, sleeping []*llmgwv1.Replica, awake int) {
	room := max(int(m.GetAutoscale().GetMax())-awake, 0)
	for i := len(sleeping) - 1; i >= room; i-- {
		p.Drain = append(p.Drain, ref(sleeping[i]))
	}
}

// wake wakes up to n of m's sleepers (lowest ordinal first) whose GPUs no
// other replica holds awake, taking those GPUs out of the round's asleep
// set so that no other model is given them too; it returns how many,
// counting as woken the sleepers whose GPUs only draining replicas hold
// awake: those wake once the drain ends (a later round), and a start
// elsewhere — a full load, tens of seconds — would cost more than the
// drain's seconds, and would leave the weights parked in host memory
// unused. drain_timeout bounds the wait.
func (p *Plan) wake(sleeping []*llmgwv1.Replica, n int, nodes map[string]*nodeFree) int {
	woken := 0
	for _, r := range sleeping {
		if woken == n {
			break
		}
		nf := nodes[r.Node]
		if nf == nil || nf.node.GetState() != llmgwv1.NodeState_NODE_STATE_ACTIVE {
			continue
		}
		free := true
		for _, g := range r.GpuIndices {
			if models, ok := nf.asleep[g]; !ok || !slices.Contains(models, r.Model) {
				free = false // another model's replica took it
			}
		}
		if !free {
			if nf.onlyDraining(r) {
				woken++
			}
			continue
		}
		for _, g := range r.GpuIndices {
			delete(nf.asleep, g)
		}
		p.Wake = append(p.Wake, ref(r))
		woken++
	}
	return woken
}

// onlyDraining reports whether every awake replica holding one of
// sleeper's GPUs here is draining (at least one holds one).
func (nf *nodeFree) onlyDraining(sleeper *llmgwv1.Replica) bool {
	held := false
	for _, h := range nf.holders {
		if h.Sleeping || h.Id == sleeper.Id {
			continue
		}
		for _, g := range h.GpuIndices {
			if !slices.Contains(sleeper.GpuIndices, g) {
				continue
			}
			if !h.Draining {
				return false
			}
			held = true
		}
	}
	return held
}

// takeFor finds GPUs for n replicas of m, which no node has room for,
// among the ready replicas of idle models of lower priority that are not
// pinned (the lowest priority first, then the model's name, then the
// highest ordinal), on ACTIVE nodes m's selector matches. Nothing is taken
// while GPUs on such nodes are already on their way to being free (a
// replica draining, or given up earlier in this plan): a drain takes time,
// and each round would otherwise take one more.
func (p *Plan) takeFor(m *llmgwv1.Model, n int, st *llmgwv1.State, byModel map[string][]*llmgwv1.Replica,
	nodes map[string]*nodeFree, in Inputs, ready func(*llmgwv1.Replica) bool) {
	if in.Idle == nil {
		return
	}
	need := n * int(m.GetGpusPerReplica())
	fits := func(r *llmgwv1.Replica) bool {
		nf := nodes[r.Node]
		return nf != nil && nf.node.GetState() == llmgwv1.NodeState_NODE_STATE_ACTIVE && Matches(nf.node, m.GetNodeSelector())
	}
	coming := 0
	for _, r := range st.GetReplicas() {
		if r.Draining && r.Model != m.Name && fits(r) {
			coming += len(r.GpuIndices)
		}
	}
	taken := map[string]bool{}
	for _, t := range p.Take {
		taken[t.Replica.Id] = true
		if fits(t.Replica) {
			coming += len(nodes[t.Replica.Node].holderGPUs(t.Replica.Id))
		}
	}
	if coming >= need {
		return
	}
	var donors []*llmgwv1.Model
	for _, d := range st.GetModels() {
		if d.Name != m.Name && d.Priority < m.Priority && !d.Pinned && d.Engine != "external" && in.Idle(d.Name) {
			donors = append(donors, d)
		}
	}
	slices.SortFunc(donors, func(a, b *llmgwv1.Model) int {
		return cmp.Or(cmp.Compare(a.Priority, b.Priority), cmp.Compare(a.Name, b.Name))
	})
	for _, d := range donors {
		rs := sortedReplicas(byModel[d.Name], d.Name)
		for i := len(rs) - 1; i >= 0 && coming < need; i-- {
			r := rs[i]
			if r.Draining || r.Sleeping || taken[r.Id] || !ready(r) || !fits(r) {
				continue
			}
			p.Take = append(p.Take, Taking{Replica: ref(r), For: m.Name, Sleep: d.GetAutoscale().GetSleep()})
			taken[r.Id] = true
			coming += len(r.GpuIndices)
		}
	}
}

// holderGPUs is the GPUs replica id holds on this node.
func (nf *nodeFree) holderGPUs(id string) []uint32 {
	for _, r := range nf.holders {
		if r.Id == id {
			return r.GpuIndices
		}
	}
	return nil
}

// Idle is the autoscaler's notion of a model nothing uses, for Inputs.Idle:
// no request held, none sent in the routers' last minute, none running or
// waiting on its engines.
func Idle(d *llmgwv1.ModelDemand) bool {
	return d != nil && d.GetHeld() == 0 && d.GetRequests() == 0 && d.GetRunning() == 0 && d.GetWaiting() == 0
}
