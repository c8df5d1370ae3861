// Package controlplane is one control-plane node (plan §5): a Raft member
// holding the desired state (package fsm), the gRPC services agents, routers
// and llmgwctl talk to, the leader-only placement loop, and the node's own
// /metrics, /healthz and /readyz.
//
// This milestone runs a single node (--bootstrap). What HA needs later —
// gossip, joins, forwarding writes to the leader — has its place in Config
// and in the shutdown order, and is refused clearly until it exists.
//
// Decisions where the plan is silent:
//
//   - Revisions. A log entry the FSM rejects (bad model, stale remove) still
//     moves the revision to its index, with no change; watchers get a mark.
//   - Writes and consistent reads on a follower answer UNAVAILABLE naming the
//     leader; forwarding comes with HA. A consistent read on a leader also
//     waits for its post-election Barrier, since hashicorp/raft has no
//     ReadIndex: a fresh leader may not have applied earlier terms yet.
//   - Ready means: a leader is known, and when that is this node, it has
//     passed the Barrier.
//   - Removal drains first: placement marks an extra replica draining, and
//     removes it once its agent reports it STOPPED or FAILED (or stops
//     reporting it), or after DrainTimeout.
//   - Liveness. An ACTIVE node without an agent session for NodeDownAfter
//     (counted from the later of the session's end and the leader's
//     election) is marked DOWN; after RescheduleAfter DOWN its replicas are
//     placed elsewhere. Only a leader that is the only server judges, since
//     sessions on other servers are invisible until gossip carries them.
//   - A replica's status is read from its own node's reports and only for
//     its uid, so an agent cannot speak for another node's replicas.
//   - A fatal apply error (an unknown non-ignorable command) freezes the FSM
//     at its last good revision and stops Run with the error, rather than
//     panic inside raft's goroutine.
package controlplane
