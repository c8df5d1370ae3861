// Package agent is the AgentService (design §5.3): Attach, one session per
// agent. This server owns the sessions attached to it (design §5.4): it
// applies their updates by the (epoch, seq) rule, forwards the accepted
// ones to the other servers over the ephemeral plane, and sends each agent
// its node's desired replicas, the server list it fails over along
// (design §5.6), and heartbeats.
//
// Decisions where the design is silent:
//   - An agent's node registration is committed through the leader: a
//     follower has the leader commit it with ServerService.RegisterNode
//     (package service/server). A leader older than that RPC answers
//     UNIMPLEMENTED; the follower then forwards the registration as those
//     releases did, on an Attach marked forwarded: the hello registers, the
//     welcome confirms, and the leader keeps no session for it. The leader
//     still answers such an Attach for one release, for older followers.
//     The session counts from before registration, so the leader never
//     sees the node re-activated yet detached, and marks it down again.
//   - A session whose node has a newer epoch held here is closed with
//     ABORTED: it must never speak for the node again; a hello older than
//     the epoch held is refused the same way at once. Both carry the held
//     epoch in the trailer llmgw-held-epoch, and the agent's next epoch
//     goes above it (agent/session): a newer session — one opened with
//     the node's certificate elsewhere, or the agent's own from before its
//     data dir was lost — never locks the real agent out.
//   - A server without a leader for three election timeouts (counted from
//     its last contact with one) ends its sessions, so agents move to the
//     majority side of a partition (design §5.4).
//   - A replica's status, and its adapters' (design §7.6), are kept only
//     from the node that runs it; KV entries only from the node of its
//     rank-0 shard (design §7.5): an agent cannot speak for another node's
//     replicas. Statuses of other nodes' replicas are dropped and counted
//     (llmgw_control_status_foreign_total), the session kept: a stale
//     status after a re-placement is an agent's honest mistake, and what
//     matters is that no router reads it.
//   - With mutual TLS an agent attaches only as the node its certificate
//     names (design §11), refused with PERMISSION_DENIED otherwise; a
//     server's certificate may send any hello marked forwarded (a follower
//     forwarding a registration it has checked), which registers the node
//     and holds no session, and no other. Which roles may call Attach at
//     all, and that a server is a member, is service.Authorizer's.
//   - A hello whose epoch is more than five minutes past this server's
//     clock is refused (INVALID_ARGUMENT): such an epoch would outrank
//     every later session of the node, so whoever sent it — a stolen
//     certificate, or on plain text anyone — would lock the real agent out
//     until then (a day, under the bound before).
package agent
