// Package watch keeps the router's copy of the cluster: desired state from
// the control plane's merged watch stream and the agents' ephemeral data
// (design §5.3, §7.2). Traffic never waits on it: the router routes from the
// last State it published, whether or not a control node is reachable.
package watch

import (
	"maps"

	"github.com/llmgw/llmgw/chunking"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/auth"
)

// State is one consistent view of the cluster as the router knows it.
//
// A published State is immutable: readers may hold it as long as they like
// and must not modify it or anything it points to. The client publishes a
// new State instead of changing an old one.
type State struct {
	// Revision is the last desired-state revision applied; 0 before any.
	Revision uint64
	// Synced is true once the client has applied a snapshot or a mark, so the
	// desired state is complete (not half a framed snapshot).
	Synced bool

	Models   map[string]*llmgwv1.Model   // by name
	Nodes    map[string]*llmgwv1.Node    // by id
	Replicas map[string]*llmgwv1.Replica // by replica id
	Config   *llmgwv1.ClusterConfig
	// Placements are the LoRA adapters' placements, by adapter name (plan
	// §7.6): the replicas that should hold each. A replica dropped from a
	// placement is being evicted, so routers stop sending it the adapter
	// before the agent unloads it.
	Placements map[string]*llmgwv1.AdapterPlacement
	// APIKeys are the router API keys (design §11), hashes included; nil
	// when there are none. A published State's set is never changed.
	APIKeys *auth.Set
	// keysOwned says APIKeys belongs to this State alone and may be
	// changed in place; clone shares the set and clears it on both, so a
	// key change copies the set once, not every publish.
	keysOwned bool
	// Tenants are the tenants and their limits (design §7.7), by name; a
	// published State's map is never changed.
	Tenants map[string]*llmgwv1.Tenant
	// Aliases are the model aliases (design §7.9), by name: the director
	// resolves a request's `model` through them and /v1/models lists
	// them. A published State's map is never changed.
	Aliases map[string]*llmgwv1.Alias

	// Ephemeral holds each agent's last accepted data, by node id. A
	// published State's (Epoch, Seq) may trail the client's: updates that
	// carry only KV blocks advance it without a publish (the statuses and
	// adapters are those of the latest update either way).
	Ephemeral map[string]*NodeEphemeral

	// Servers is the last control-server list received; the client also dials
	// these on failover (design §5.6).
	Servers []*llmgwv1.ControlServer
}

// NodeEphemeral is one agent's ephemeral data at (Epoch, Seq) (design §5.4).
// A replica missing from Statuses is unknown, not down.
type NodeEphemeral struct {
	Epoch    uint64
	Seq      uint64
	Statuses map[string]*llmgwv1.ReplicaStatus // by replica id
	// Adapters are the adapter states the agent reported, by replica id
	// then adapter name (design §7.6). An adapter missing is not held.
	Adapters map[string]map[string]*llmgwv1.AdapterStatus
}

// AdapterStatus returns what the replica's node last reported of adapter
// on it, or nil. As with Status, the caller compares uid and incarnation.
func (s *State) AdapterStatus(r *llmgwv1.Replica, adapter string) *llmgwv1.AdapterStatus {
	ne := s.Ephemeral[s.reportingNode(r)]
	if ne == nil {
		return nil
	}
	return ne.Adapters[r.GetId()][adapter]
}

// Status returns the latest status the replica's node reported for it, or
// nil. The caller compares uids: a status for another uid is for an old
// placement (design §4 "Identity").
func (s *State) Status(r *llmgwv1.Replica) *llmgwv1.ReplicaStatus {
	ne := s.Ephemeral[s.reportingNode(r)]
	if ne == nil {
		return nil
	}
	return ne.Statuses[r.GetId()]
}

// reportingNode is the node whose agent reports the replica: rank 0's.
func (s *State) reportingNode(r *llmgwv1.Replica) string {
	node := r.GetNode()
	for _, sh := range r.GetShards() {
		if sh.GetRank() == 0 && sh.GetNode() != "" {
			node = sh.GetNode()
		}
	}
	return node
}

func emptyState() *State {
	return &State{
		Models:     map[string]*llmgwv1.Model{},
		Nodes:      map[string]*llmgwv1.Node{},
		Replicas:   map[string]*llmgwv1.Replica{},
		Placements: map[string]*llmgwv1.AdapterPlacement{},
		Tenants:    map[string]*llmgwv1.Tenant{},
		Aliases:    map[string]*llmgwv1.Alias{},
		Ephemeral:  map[string]*NodeEphemeral{},
	}
}

// clone copies the top-level maps so the copy can be changed without
// touching a published State; the values are shared because nothing mutates
// them in place. The API keys are shared until either side changes them.
func (s *State) clone() *State {
	c := *s
	c.Models = maps.Clone(s.Models)
	c.Nodes = maps.Clone(s.Nodes)
	c.Replicas = maps.Clone(s.Replicas)
	c.Placements = maps.Clone(s.Placements)
	if c.Placements == nil {
		c.Placements = map[string]*llmgwv1.AdapterPlacement{} // a state saved before placements existed
	}
	c.Tenants = maps.Clone(s.Tenants)
	if c.Tenants == nil {
		c.Tenants = map[string]*llmgwv1.Tenant{} // a state saved before tenants existed
	}
	c.Aliases = maps.Clone(s.Aliases)
	if c.Aliases == nil {
		c.Aliases = map[string]*llmgwv1.Alias{} // a state saved before aliases existed
	}
	c.Ephemeral = maps.Clone(s.Ephemeral)
	c.keysOwned, s.keysOwned = false, false
	return &c
}

// applyChange puts or deletes one object. It ignores revisions: the caller
// decides whether the change is new.
func (s *State) applyChange(ch *llmgwv1.Change) {
	put := ch.GetOp() == llmgwv1.ChangeOp_CHANGE_OP_PUT
	del := ch.GetOp() == llmgwv1.ChangeOp_CHANGE_OP_DELETE
	switch o := ch.GetObject().(type) {
	case *llmgwv1.Change_Model:
		if put {
			s.Models[o.Model.GetName()] = o.Model
		} else if del {
			delete(s.Models, o.Model.GetName())
		}
	case *llmgwv1.Change_Node:
		if put {
			s.Nodes[o.Node.GetId()] = o.Node
		} else if del {
			delete(s.Nodes, o.Node.GetId())
		}
	case *llmgwv1.Change_Replica:
		if put {
			s.Replicas[o.Replica.GetId()] = o.Replica
		} else if del {
			delete(s.Replicas, o.Replica.GetId())
		}
	case *llmgwv1.Change_Config:
		if put {
			s.Config = o.Config
		} else if del {
			s.Config = nil
		}
	case *llmgwv1.Change_AdapterPlacement:
		if put {
			s.Placements[o.AdapterPlacement.GetAdapter()] = o.AdapterPlacement
		} else if del {
			delete(s.Placements, o.AdapterPlacement.GetAdapter())
		}
	case *llmgwv1.Change_ApiKey:
		if !put && !del {
			return
		}
		if !s.keysOwned {
			s.APIKeys = s.APIKeys.Clone()
			s.keysOwned = true
		}
		if put {
			s.APIKeys.Put(o.ApiKey)
		} else {
			s.APIKeys.Delete(o.ApiKey.GetName())
		}
	case *llmgwv1.Change_Tenant:
		if put {
			s.Tenants[o.Tenant.GetName()] = o.Tenant
		} else if del {
			delete(s.Tenants, o.Tenant.GetName())
		}
	case *llmgwv1.Change_Alias:
		if put {
			s.Aliases[o.Alias.GetName()] = o.Alias
		} else if del {
			delete(s.Aliases, o.Alias.GetName())
		}
	}
}

// ephemeralVerdict is what the (epoch, seq) rule of design §5.4 says about an
// update relative to what is held for its node.
type ephemeralVerdict int

const (
	// accept: a full copy newer than what is held, or the next delta.
	accept ephemeralVerdict = iota
	// stale: old or duplicate data (an earlier epoch's late delta, a seq
	// already applied); drop it quietly.
	stale
	// gap: a delta the client cannot apply because it missed something;
	// drop it and resynchronise with full copies.
	gap
)

// judgeEphemeral is the rule in chunking.Position's order of (epoch, seq),
// the one every hop judges by.
func judgeEphemeral(held *NodeEphemeral, u *llmgwv1.EphemeralUpdate) ephemeralVerdict {
	pos := chunking.PositionOf(u)
	var at chunking.Position
	if held != nil {
		at = chunking.Position{Epoch: held.Epoch, Seq: held.Seq}
	}
	if u.GetFull() {
		// A full copy at the held (epoch, seq) is the same data again, and
		// is accepted: a router restarted from its saved state holds the
		// seq but not what it does not save (the KV index), and the copy
		// every new stream begins with is how that is rebuilt.
		if held == nil || pos.Compare(at) >= 0 {
			return accept
		}
		return stale
	}
	switch {
	case held == nil:
		return gap // a delta with nothing held to apply it to
	case pos.Compare(at) <= 0:
		return stale
	case pos == at.Next():
		return accept
	default:
		return gap // a seq skipped, or a newer session's delta without its full copy
	}
}

// applyEphemeral applies an accepted update, replacing the node's entry with
// a new one so published States stay untouched.
func (s *State) applyEphemeral(u *llmgwv1.EphemeralUpdate) {
	ne := &NodeEphemeral{Epoch: u.GetEpoch(), Seq: u.GetSeq()}
	if held := s.Ephemeral[u.GetNode()]; held != nil && !u.GetFull() {
		ne.Statuses = maps.Clone(held.Statuses)
		ne.Adapters = maps.Clone(held.Adapters)
	} else {
		ne.Statuses = make(map[string]*llmgwv1.ReplicaStatus, len(u.GetStatuses()))
	}
	if ne.Adapters == nil {
		ne.Adapters = map[string]map[string]*llmgwv1.AdapterStatus{}
	}
	for _, st := range u.GetStatuses() {
		ne.Statuses[st.GetReplicaId()] = st
	}
	// Each replica's adapter map is copied once before its first change, so
	// published States keep theirs.
	copied := map[string]bool{}
	for _, a := range u.GetAdapters() {
		id := a.GetReplicaId()
		if !copied[id] {
			ne.Adapters[id] = maps.Clone(ne.Adapters[id])
			if ne.Adapters[id] == nil {
				ne.Adapters[id] = map[string]*llmgwv1.AdapterStatus{}
			}
			copied[id] = true
		}
		// UNSPECIFIED in a delta is the agent's removal (it unloaded it).
		if a.GetState() == llmgwv1.AdapterState_ADAPTER_STATE_UNSPECIFIED {
			delete(ne.Adapters[id], a.GetAdapter())
		} else {
			ne.Adapters[id][a.GetAdapter()] = a
		}
	}
	for _, id := range u.GetRemovedReplicas() {
		delete(ne.Statuses, id)
		delete(ne.Adapters, id)
	}
	s.Ephemeral[u.GetNode()] = ne
}
