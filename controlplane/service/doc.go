// Package service holds what the control plane's gRPC services (design
// §5.3) share, and each service lives in a subpackage of its own:
//
//   - service/admin   AdminService: everything llmgwctl needs;
//   - service/agent   AgentService.Attach: one session per agent;
//   - service/watch   WatchService.Watch: the routers' merged stream;
//   - service/adapter AdapterService.EnsureAdapter (design §7.6);
//   - service/quota   QuotaService: the routers' leased shares of tenants'
//     limits and their usage batches (design §7.7);
//   - service/flow    FlowService: the routers' flow-control queues,
//     shared through the leader (design §7.8);
//   - service/server  ServerService: what control servers ask of each
//     other (RegisterNode, a follower's agent registration).
//
// Each declares the small interfaces it needs of the rest of the node (the
// Raft store, the replicated state, the membership, the agents' reports),
// with the contract written on them, and takes nothing else: a service
// never sees the node's wiring, so it can be read, and tested, on its own.
//
// What lives here, because it must be one thing for all of them:
//   - The Authorizer (design §11): who may call which method, by the
//     certificate's role, and for a server certificate that its server is
//     of this server's Raft configuration (ConfigMembers, a cached read of
//     it): a certificate of the CA whose server never joined, or was
//     removed, has no power but ClusterStatus.
//   - ToStatus, the one place errors become gRPC codes (design §5.3:
//     NotLeader is UNAVAILABLE and carries the leader's address).
//   - Forwarding (design §5.3): writes, consistent reads and the raft verbs
//     go to the leader's gRPC address (from gossip), marked so they are
//     never forwarded twice; while there is no leader, or it refuses before
//     logging the entry, the call is held and retried, backing off with
//     jitter, up to RPCHoldTimeout (Consul's rpc_hold_timeout) or just
//     before the client's deadline (ReplyBy), so the client gets an answer
//     that says why — no leader, and how many voters this server reaches —
//     rather than its stream reset by the deadline. A leader
//     that loses office mid-commit answers ABORTED (the write may have been
//     applied) rather than retry blindly. Without gossip a follower cannot
//     find the leader's address: such calls answer UNAVAILABLE naming the
//     leader.
package service
