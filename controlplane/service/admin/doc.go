// Package admin is the AdminService (design §5.3): everything llmgwctl
// needs — models, nodes, replicas, the cluster's status, the servers'
// membership verbs, snapshots (design §13.4).
//
// Any server accepts any call. Writes, consistent reads and the raft verbs
// are answered by the leader: the node's forwarding interceptor (package
// service) sends them there, so the handlers here only refuse on a
// follower (NotLeader) when a call reached them anyway; snapshot streams
// are relayed by hand, since interceptors see no stream bodies. Reads are
// served from this server's FSM unless consistent is asked, when this
// server must lead, have passed its post-election Barrier (hashicorp/raft
// has no ReadIndex: a fresh leader may not have applied earlier terms
// yet), and confirm its leadership with a quorum (VerifyLeader).
//
// Decisions where the design is silent:
//   - DrainNode sets DRAINING (undrain: ACTIVE; a DOWN node is refused:
//     that is the leader's judgement, which its agent's return clears).
//   - ClusterStatus' health and failure tolerance are autopilot's on the
//     leader and a gossip-based estimate on other servers; its answer's
//     headers carry this server's Raft figures for the leader's autopilot.
//   - A snapshot restore keeps the cluster's current node registrations
//     (the agents', not the operator's intent) and puts the revision well
//     above Raft's last index, so revisions only grow and watchers take a
//     framed snapshot.
package admin
