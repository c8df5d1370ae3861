// Package gossip is a control server's memberlist member (design §5.2,
// §5.4): what each server tells the others about itself (Meta: id, version,
// gRPC, Raft and HTTP addresses, bootstrap expectation), its view of every
// server ever seen and its status, the tombstones of servers removed from
// Raft, and the reliable transport the ephemeral plane (package plane)
// sends over.
//
// It is mechanism, not policy: package cluster decides what membership
// means for Raft (bootstrap, reconcile, autopilot, the operators' verbs)
// from what this package reports.
//
// Design:
//   - The node name is the server id, so a restarted server replaces its
//     old entry rather than appearing twice. Metadata is outside input: a
//     member whose metadata does not decode, or whose name and id differ,
//     is ignored with a warning, never a crash.
//   - Statuses come from memberlist's event delegate, kept in this
//     package's own table: memberlist forgets dead members from Members(),
//     and its node structs are mutated under its own lock (reading them
//     raced under -race). A suspect server therefore shows as alive until
//     it is declared dead.
//   - Failed servers are retried (Reconnect, design §5.2): memberlist
//     never contacts a member it declared dead again, so after a partition
//     longer than its dead timeout both sides stayed dead to each other.
//     Serf's reconnect runs here on this package's table: every
//     reconnect_interval (3 s, jittered) each dead member is dialed and,
//     if it answers, joined by push/pull; one dead past reconnect_timeout
//     (72 h) is reaped. A member that left is never retried, nor one
//     package cluster says was removed from Raft.
//   - Leaves are told from deaths by a leave intent of this package's own,
//     broadcast before memberlist's leave: memberlist hands the event
//     delegate the node without the state that records "left".
//   - Why not hashicorp/serf, which does the above: Serf takes
//     memberlist's delegates for itself (its NotifyMsg drops message types
//     it does not know; its push/pull state is its own), and ours carry
//     the ephemeral plane's reliable sends and digest and the tombstones,
//     which over Serf would become broadcast, unreliable, size-capped user
//     events (the path design §5.4 left because it lost messages); its key
//     manager would replace the persisted keyring. Reconnect, reaping and
//     leave intents cost a few hundred lines here.
//   - Tombstones are last-writer-wins records (removed or cleared, with a
//     time), spread by broadcast and, as the backstop, in push/pull state,
//     so any later leader honours a removal. They live in memory: a full
//     restart of every server forgets them, which is why package cluster
//     also keeps them in the replicated state once every server can apply
//     that (fsm's SET_SERVER_REMOVED), and uses these alone before.
//   - Memberlist's user messages and push/pull state are shared with the
//     ephemeral plane: a kind byte tells plane messages from tombstones,
//     and the state is framed (kind byte, tombstones' length, tombstones,
//     the plane's digest); state starting with '{' is tombstones alone, as
//     servers before the plane sent it.
//   - Encryption (design §11): with --gossip-key-file every message, UDP
//     and TCP, is encrypted and authenticated with memberlist's keyring,
//     and anything not encrypted with one of its keys is refused both ways,
//     so a process without the key can neither read gossip nor join it.
//     The keyring is persisted in the data dir (gossip.keyring, 0600, the
//     primary first) before each change takes effect, and wins over the
//     key file on restart, so a rotated cluster restarts with the keys it
//     now uses. Rotation is install, use, remove, each on every server
//     before the next (llmgwctl keyring).
//   - TLS (design §11: only servers join gossip): with a TLS source,
//     memberlist's streams — joins, push/pull, reliable sends — run over
//     mutual TLS demanding a server certificate of the cluster's CA, and a
//     stream dialed to a named member demands a certificate naming it. UDP
//     has no TLS: with no keyring beside TLS, forged UDP gossip is still
//     possible, though such a sender can join neither Raft nor any stream.
package gossip
