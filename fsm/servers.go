package fsm

import (
	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Removed control-plane servers (design §5.2). The control plane keeps a
// server an operator removed from Raft (remove-peer, leave) out of it when
// the server shows up alive over gossip, until an explicit join. Gossip's
// last-writer-wins tombstones carry that in memory only, so a restart of
// every server forgot it and the removed server was added back; these
// records are in the replicated state, so they survive any restart. The
// command is gated (gate_new.go): while a cluster still has servers that
// predate it, the control plane keeps gossip's tombstones alone.

// setServerRemoved records (or clears) a server's removal, last writer
// wins by the verb's time: a command older than the record changes
// nothing (two proposals may be logged in either order, and the leader
// also copies newer gossip tombstones in). A cleared record stays, so the
// FSM's word outranks an older gossip tombstone.
func (a *applier) setServerRemoved(p *llmgwv1.SetServerRemovedCommand) (any, error) {
	if p.ServerId == "" {
		return nil, invalid("server_id", "required")
	}
	if p.AtUnixNano <= 0 {
		return nil, invalid("at_unix_nano", "required: the time of the removal or join")
	}
	if old, ok := a.f.removals[p.ServerId]; ok && old.AtUnixNano > p.AtUnixNano {
		return proto.Clone(old), nil
	}
	r := &llmgwv1.ServerRemoval{ServerId: p.ServerId, Removed: p.Removed, Revision: a.index, AtUnixNano: p.AtUnixNano}
	a.f.removals[r.ServerId] = r
	// No Change: routers and agents watch models, nodes and replicas;
	// watchers see the revision move with a mark.
	return proto.Clone(r), nil
}

// ServerRemoved returns a copy of the replicated record of control-plane
// server id: whether it is to be kept out of Raft and since when. ok is
// false when no command named it; the control plane then falls back to
// gossip's tombstones.
func (f *FSM) ServerRemoved(id string) (*llmgwv1.ServerRemoval, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	r, ok := f.removals[id]
	if !ok {
		return nil, false
	}
	return proto.Clone(r).(*llmgwv1.ServerRemoval), true
}

// ServerRemovals returns copies of every removal record, sorted by server
// id.
func (f *FSM) ServerRemovals() []*llmgwv1.ServerRemoval {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return cloneSorted(f.removals, func(r *llmgwv1.ServerRemoval) string { return r.ServerId })
}
