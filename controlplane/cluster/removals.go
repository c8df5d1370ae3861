package cluster

import (
	"context"
	"fmt"
	"slices"

	"github.com/llmgw/llmgw/controlplane/gossip"
	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Removed servers (design §5.2). `raft remove-peer` (and a graceful leave,
// which asks the leader for one) keeps a server out of Raft when it shows
// up alive over gossip, until an explicit join brings it back. Two records
// say so, last writer wins by the time of the operator's verb:
//
//   - gossip's tombstones, spread to every server but held in memory: a
//     restart of every server forgets them;
//   - the replicated state's (fsm SET_SERVER_REMOVED), which survive any
//     restart. The command is gated: while a server of the configuration
//     runs a release older than fsm.ServerRemovedVersion, the gate refuses
//     it and the removal lives in gossip alone, as before that release.
//
// The replicated record decides; a gossip tombstone decides only where it
// is newer — a join on a server that does not lead (it clears its own
// tombstone, and the leader has not copied that in yet), or a removal from
// before the gate was committed. While leading, membership copies such
// newer tombstones into the replicated state, but only once the gate is
// committed: background work never commits a minimum version by itself,
// which would make a rollback of the upgrade impossible.

// removedCommand is the replicated removal record's command type.
const removedCommand = llmgwv1.CommandType_COMMAND_TYPE_SET_SERVER_REMOVED

// removedNow decides whether a server is to be kept out of Raft from its
// replicated record (rec, nil when none) and its gossip tombstone (t, ok
// false when none): the newer of the two, the replicated one on a tie;
// neither means not removed.
func removedNow(rec *llmgwv1.ServerRemoval, t gossip.Tombstone, ok bool) bool {
	switch {
	case rec != nil && ok && t.At > rec.AtUnixNano:
		return t.Removed
	case rec != nil:
		return rec.Removed
	case ok:
		return t.Removed
	}
	return false
}

// removedServers is every server id to be kept out of Raft now (see
// removedNow), for one reconcile round or one autopilot query.
func (c *Cluster) removedServers() map[string]bool {
	recs := map[string]*llmgwv1.ServerRemoval{}
	for _, r := range c.state.ServerRemovals() {
		recs[r.ServerId] = r
	}
	var ts map[string]gossip.Tombstone
	if c.g != nil {
		ts = c.g.Tombstones()
	}
	out := map[string]bool{}
	for id, r := range recs {
		t, ok := ts[id]
		if removedNow(r, t, ok) {
			out[id] = true
		}
	}
	for id, t := range ts {
		if _, ok := recs[id]; !ok && t.Removed {
			out[id] = true
		}
	}
	return out
}

// recordRemoval records an operator's removal (or its clearing) of server
// id at time at (Unix ns, the gossip tombstone's) in the replicated state,
// on the leader. The gate refuses it in a cluster with servers older than
// the command: the removal then lives in gossip alone, as it did before,
// and that is no error. Any other failure is logged: the gossip tombstone
// holds meanwhile, and the leader copies it in on a later round
// (syncRemovals).
func (c *Cluster) recordRemoval(ctx context.Context, id string, removed bool, at int64) {
	if c.propose == nil {
		return
	}
	_, rev, err := c.propose.Propose(ctx, removedCommand, &llmgwv1.SetServerRemovedCommand{ServerId: id, Removed: removed, AtUnixNano: at})
	switch {
	case err != nil && !fsm.Admitted(removedCommand, c.state.Config().GetMinVersion()):
		c.log.Info("server removal kept in gossip only: not every server can apply it in the replicated state yet", "member", id, "removed", removed, "reason", err)
	case err != nil:
		c.log.Warn("server removal not recorded in the replicated state yet; gossip holds it meanwhile", "member", id, "removed", removed, "err", err)
	default:
		c.log.Info("server removal recorded in the replicated state", "member", id, "removed", removed, "revision", rev)
	}
}

// syncRemovals copies into the replicated state every gossip tombstone
// newer than the server's replicated record (or for a server without
// one), while this server leads and once the gate is committed. reported
// keeps a failure from being logged every round.
func (c *Cluster) syncRemovals(ctx context.Context, reported map[string]bool) {
	if c.propose == nil || c.g == nil || !fsm.Admitted(removedCommand, c.state.Config().GetMinVersion()) {
		return
	}
	ts := c.g.Tombstones()
	for _, id := range sortedKeys(ts) {
		t := ts[id]
		if rec, ok := c.state.ServerRemoved(id); ok && rec.AtUnixNano >= t.At {
			continue
		}
		_, rev, err := c.propose.Propose(ctx, removedCommand, &llmgwv1.SetServerRemovedCommand{ServerId: id, Removed: t.Removed, AtUnixNano: t.At})
		key := fmt.Sprintf("sync/%s/%d", id, t.At)
		if err != nil {
			if !reported[key] {
				reported[key] = true
				c.log.Warn("copying a gossip tombstone into the replicated state failed; retried next round", "member", id, "removed", t.Removed, "err", err)
			}
			return
		}
		c.log.Info("gossip tombstone copied into the replicated state", "member", id, "removed", t.Removed, "revision", rev)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
