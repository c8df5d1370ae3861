package fsm

import (
	"maps"
	"slices"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// replicaIndex holds the replicas' ids by node and by model, so what reads
// one node's replicas — every agent session on every applied entry
// (NodeDesired), the GPU check of a placement — costs that node's
// replicas, not the fleet's. Placing 2,000 replicas once took 43–45 s
// because each entry sorted every replica for every session (issue 30).
//
// It holds ids only: a command that replaces a replica's record with the
// same id, node and model (draining, sleeping) needs no index work. A
// replica is added and removed only through FSM.putReplica and
// FSM.dropReplica, which keep it.
type replicaIndex struct {
	byNode  map[string]map[string]struct{}
	byModel map[string]map[string]struct{}
}

func newReplicaIndex() replicaIndex {
	return replicaIndex{byNode: map[string]map[string]struct{}{}, byModel: map[string]map[string]struct{}{}}
}

func (x replicaIndex) add(r *llmgwv1.Replica) {
	addID(x.byNode, r.Node, r.Id)
	addID(x.byModel, r.Model, r.Id)
}

func (x replicaIndex) remove(r *llmgwv1.Replica) {
	dropID(x.byNode, r.Node, r.Id)
	dropID(x.byModel, r.Model, r.Id)
}

// onNode returns the ids of node's replicas, sorted.
func (x replicaIndex) onNode(node string) []string {
	return slices.Sorted(maps.Keys(x.byNode[node]))
}

// ofModel returns the ids of model's replicas, sorted.
func (x replicaIndex) ofModel(model string) []string {
	return slices.Sorted(maps.Keys(x.byModel[model]))
}

func addID(m map[string]map[string]struct{}, key, id string) {
	set, ok := m[key]
	if !ok {
		set = map[string]struct{}{}
		m[key] = set
	}
	set[id] = struct{}{}
}

func dropID(m map[string]map[string]struct{}, key, id string) {
	set := m[key]
	delete(set, id)
	if len(set) == 0 {
		delete(m, key)
	}
}

// putReplica stores r, a new replica or a new record of one (its node may
// have changed: a re-placement), and keeps the index.
func (f *FSM) putReplica(r *llmgwv1.Replica) {
	if old, ok := f.replicas[r.Id]; ok {
		f.index.remove(old)
	}
	f.replicas[r.Id] = r
	f.index.add(r)
}

// dropReplica forgets replica id and its index entries.
func (f *FSM) dropReplica(id string) {
	if old, ok := f.replicas[id]; ok {
		f.index.remove(old)
		delete(f.replicas, id)
	}
}
