// Package controlplane is one control-plane node (plan §5): a Raft member
// holding the desired state (package fsm), the gRPC services agents, routers
// and llmgwctl talk to, the leader-only placement loop, and the node's own
// /metrics, /healthz and /readyz.
//
// A node runs alone (--bootstrap) or in a cluster of 3 or 5 (plan §5.2):
// memberlist among the servers carries each one's id, version, addresses and
// --bootstrap-expect; Raft membership follows gossip on the leader, with
// hashicorp/raft-autopilot promoting stable non-voters and cleaning up dead
// servers, never below --bootstrap-expect voters.
//
// Decisions where the plan is silent:
//
//   - Bootstrap. Of the servers with the same expectation, only the lowest
//     id bootstraps (with all of them as voters), after asking each whether
//     it already has voters or a leader; the others are brought in by its
//     heartbeats. A peer with another expectation stops the bootstrap
//     (logged, and in /readyz), and a leader does not add it later.
//   - Removed servers. `raft remove-peer` and a graceful leave tombstone the
//     server id; tombstones spread over gossip (broadcast, push/pull as the
//     backstop; last writer wins) so any later leader honours them. A
//     tombstoned server is not added back when it shows up alive; an
//     explicit Join (`llmgwctl join`, on it or naming its gossip address)
//     clears the tombstone. Tombstones live in memory: a full restart of
//     every server forgets them.
//   - Leave ends the process: after leaving, Run returns nil (Consul's
//     servers do the same). Stopping by signal does not leave: a restart
//     must not shrink the cluster.
//   - Forwarding. Writes, consistent reads and the raft verbs go to the
//     leader's gRPC address (from gossip), marked so they are never
//     forwarded twice; while there is no leader, or it refuses before
//     logging the entry, the call is held and retried up to RPCHoldTimeout.
//     A leader that loses office mid-commit answers ABORTED (the write may
//     have been applied) rather than retry blindly. An agent's node
//     registration rides a forwarded Attach (hello, welcome) because the
//     proto has no registration RPC.
//   - Autopilot's per-server figures (last log index and term, last
//     contact) travel as gRPC headers on ClusterStatus, for want of proto
//     fields. ClusterStatus' health and failure tolerance are autopilot's on
//     the leader and a gossip-based estimate on other servers.

//   - Revisions. A log entry the FSM rejects (bad model, stale remove) still
//     moves the revision to its index, with no change; watchers get a mark.
//   - Without gossip (no --gossip-addr) a follower cannot find the leader's
//     gRPC address: writes and consistent reads there answer UNAVAILABLE
//     naming the leader. A consistent read on a leader also waits for its
//     post-election Barrier, since hashicorp/raft has no ReadIndex: a fresh
//     leader may not have applied earlier terms yet.
//   - Ready means: a leader is known, and when that is this node, it has
//     passed the Barrier.
//   - Removal drains first: placement marks an extra replica draining, and
//     removes it once its agent reports it STOPPED or FAILED (or stops
//     reporting it), or after DrainTimeout.
//   - Liveness. An ACTIVE node without an agent session on any server for
//     NodeDownAfter (counted from the later of the last session's end and
//     the leader's election: the grace after winning office) is marked
//     DOWN; after RescheduleAfter DOWN its replicas are placed elsewhere
//     with new uids. Sessions on other servers are known from the ephemeral
//     plane's session lists (package plane); a server gossip no longer sees
//     alive holds none. Without gossip only a lone leader judges.
//   - The ephemeral plane (package plane) forwards each owned session's
//     accepted updates to every other server over memberlist's reliable
//     send, in a hand-written framing that shares memberlist's user
//     messages and push/pull state with the tombstones (a kind byte tells
//     them apart). A session whose node has a newer epoch held here is
//     closed with ABORTED. An agent with no session anywhere keeps its data
//     (routers keep routing while their own checks pass): the proto has no
//     "stale" mark, so ListNodes.connected and the node's state say it.
//   - Drain and roll. DrainNode sets DRAINING (undrain: ACTIVE; a DOWN node
//     is refused). Model.revision moves only on changes that need a restart
//     (fsm.NeedsRestart); replicas record model_revision, and placement
//     rolls older ones like any move: one replacement, ready, then one
//     drain.
//   - A replica's status is read from its own node's reports and only for
//     its uid, so an agent cannot speak for another node's replicas.
//   - LoRA adapters (plan §7.6). EnsureAdapter is answered by the leader
//     (forwarded like writes). Its placement decisions run one at a time
//     under one lock; re-reading the placement under it is the single
//     flight, and the committed placement is the record, so a cold adapter
//     is placed once however many calls and routers ask. An adapter the
//     agent has not reported, or reports LOADING, is never evicted; nor one
//     with requests running or waiting, nor one used (or placed by this
//     leader) within AdapterMinIdle. A load FAILED on every placed replica
//     answers FAILED until its retry-after; after it the placement is
//     removed and made anew, once per call that finds it expired — never
//     in a loop; a failure without a retry-after is final until the model
//     is re-applied. With max_loaded_adapters 0 a ready replica of the
//     model counts as holding every adapter. Adapter statuses are kept only
//     from the node that runs the replica.
//   - A fatal apply error (an unknown non-ignorable command) freezes the FSM
//     at its last good revision and stops Run with the error, rather than
//     panic inside raft's goroutine.
//   - The minimum-version gate (plan §4, §13.3). A command type newer than
//     the first release (fsm.Introduced) is proposed only when every server
//     of the Raft configuration, voters and non-voters, reports that
//     release or newer in its gossip metadata; otherwise FAILED_PRECONDITION
//     names the servers below it. The gate is committed lazily, as
//     ClusterConfig.min_version, right before the first such command, so a
//     fully upgraded cluster can still be rolled back until a new command
//     is used. After that a server below the minimum is refused at join
//     (not added to Raft; Members.refused, /readyz and the log say why) and
//     a server that applies the minimum entry with an older build stops.
//     Versions compare as fsm.CompareVersions: "dev" builds above every
//     release, an unknown version below.
package controlplane
