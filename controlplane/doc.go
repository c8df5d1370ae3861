// Package controlplane is one control-plane node (design §5): the wiring of
// a Raft member holding the desired state (package fsm), the gRPC services
// agents, routers and llmgwctl talk to, the leader's work, the membership,
// and the node's own /metrics, /healthz and /readyz. Create a node with
// New, run it with Run.
//
// The node is split by job, in the shape rqlite uses (store / cluster /
// http); each package's doc says what it decides and why:
//
//	store        the Raft store: raft, raft-boltdb, snapshots, transport,
//	             Propose, the FSM adapter, Barrier and leadership (§5.1)
//	gate         the minimum-version gate every write passes (§4, §13.3)
//	gossip       the memberlist member: metadata, statuses, tombstones (§5.4)
//	cluster      membership: bootstrap-expect, join/leave, autopilot, the
//	             server list, connections to peers (§5.2)
//	plane        the ephemeral plane between control nodes (§5.4)
//	ephemeral    the agents' data held on this node (§5.4)
//	sessions     which nodes have an agent session, here or anywhere (§5.4)
//	leader       the leader's work: placement, liveness, adapters (§5.5, §7.6)
//	placement    the pure placement decisions (§5.5)
//	service      error mapping, authorization by certificate (§11) and
//	             forwarding to the leader (§5.3), and one
//	             package per gRPC service: service/admin, service/agent,
//	             service/watch, service/adapter, service/server
//	snapfile     the snapshot file format (§13.4)
//	logadapt     hashicorp libraries' logs through slog (§9)
//
// Services depend on small interfaces they declare, never on this package;
// this package is the only one that knows every other.
//
// A node runs alone (--bootstrap) or in a cluster of 3 or 5 (design §5.2):
// memberlist among the servers carries each one's id, version, addresses
// and --bootstrap-expect; Raft membership follows gossip on the leader,
// with hashicorp/raft-autopilot promoting stable non-voters and cleaning up
// dead servers, never below --bootstrap-expect voters.
//
// Decisions where the design is silent, at the node's level (the others
// are in the packages that make them):
//
//   - Ready means: a leader is known, and when that is this node, it has
//     passed the Barrier. /readyz also fails while the cluster refuses this
//     server (its version is below the cluster's minimum) or its bootstrap
//     is refused (a mismatched --bootstrap-expect).
//   - Leave ends the process: after a graceful Leave, Run returns nil
//     (Consul's servers do the same). Stopping by signal does not leave: a
//     restart must not shrink the cluster.
//   - A fatal apply error (an unknown non-ignorable command, or a committed
//     minimum version above this build) freezes the FSM at its last good
//     revision and stops Run with the error, rather than panic inside
//     raft's goroutine.
//   - Mutual TLS (design §11). With --tls-ca/--tls-cert/--tls-key, gRPC and
//     the Raft transport require a certificate of the cluster's CA; the
//     node's own must be a server's named as --node-id, or it refuses to
//     start. Every call is authorized by its caller's role before it is
//     forwarded (service.Authorizer); the Raft transport admits servers
//     only; the leader adds a gossip member to Raft, and a bootstrapper
//     counts it, only after a handshake with its Raft address shows a
//     server certificate naming it (cluster.VerifyByTLS). Without TLS every
//     listener must be on loopback, or --insecure given.
//   - Revisions. A log entry the FSM rejects (bad model, stale remove) still
//     moves the revision to its index, with no change; watchers get a mark.
package controlplane
