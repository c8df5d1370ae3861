// Package cluster is a control server's membership (design §5.2): who the
// control servers are, how a cluster forms and changes, and how to reach
// the others.
//
//   - Bootstrap (--bootstrap-expect). Of the servers with the same
//     expectation, only the lowest id bootstraps (with all of them as
//     voters), after asking each whether it already has voters or a leader;
//     the others are brought in by its heartbeats. A peer with another
//     expectation stops the bootstrap (logged, and in /readyz), and a
//     leader does not add it later.
//   - Join. --join addresses are retried in the background, backing off
//     with jitter, until one answers; then the loop ends. An explicit Join (`llmgwctl join`)
//     also clears the removal of this server and of those it names.
//   - Reconnect. Gossip retries the servers it sees failed for its
//     reconnect window (package gossip's Reconnect), started by Run; a
//     server removed from Raft (tombstone or replicated record) is not
//     retried, and one that left never is, so only the operator's leave
//     and remove-peer are final. GossipRaftMismatch counts the servers
//     of the Raft configuration gossip does not see alive, for the
//     LlmgwGossipRaftMismatch alert.
//   - While leading, Raft membership follows gossip (Consul's reconcile):
//     a live server gossip knows and Raft does not is added as a non-voter,
//     one that left is removed; raft-autopilot promotes stable non-voters
//     and cleans up dead servers, never below --bootstrap-expect voters.
//     Autopilot's per-server figures (last log index and term, last
//     contact) are each server's ClusterStatus raft_last_* fields, or the
//     gRPC headers a server older than them sends instead.
//   - Removed servers. `raft remove-peer` and a graceful leave tombstone the
//     server id; a tombstoned server is not added back when it shows up
//     alive. Package gossip spreads the tombstones; once every server can
//     apply it, the replicated state keeps them too, so they survive a
//     restart of every server (removals.go).
//   - Leave ends the process: after leaving, Left is closed and the node
//     stops (Consul's servers do the same). Stopping by signal does not
//     leave: a restart must not shrink the cluster.
//   - The minimum version (design §13.3): a server below the cluster's
//     committed minimum is refused at join (not added to Raft; Members,
//     /readyz and the log say why), and a refused server learns why by
//     asking its peers.
//   - The server list clients fail over along (design §5.6), the leader's
//     gRPC address for forwarding, and one pooled connection per peer.
//
// Package cluster depends on the Raft store and on gossip only through the
// interfaces Raft and Gossip below; without gossip (no --gossip-addr) it
// knows only this server and membership is the operator's.
package cluster
