// Package store is a control node's Raft store (design §5.1): the
// hashicorp/raft member, its raft-boltdb log and stable store, file
// snapshots and TCP transport, and the raft.FSM around package fsm.
//
// It is the only package of the control plane that touches raft's write
// path. Everything above it — the gRPC services, the leader's loops, the
// membership — sees a Store through a small interface of its own: propose a
// command and learn what the FSM made of it, ask who leads, read the Raft
// configuration, change it.
//
// Design (in the manner of rqlite's store):
//   - Propose is the one way into the log. It refuses at once on a
//     follower with a NotLeaderError naming the leader (its gRPC address
//     when the node's gossip knows it), distinguishes a refusal before the
//     entry was logged (safe to retry elsewhere: NotLeaderError) from a
//     leadership lost mid-commit (ErrOutcomeUnknown: the write may have
//     been applied), and returns the FSM's own result and error with the
//     entry's index, which is the revision.
//   - A fatal apply error (an unknown command, or a committed minimum
//     version above this build, design §13.3) freezes the FSM at its last
//     good revision and is reported once to the node, which stops; raft's
//     goroutine never panics for it.
//   - Leadership: RunLeadership runs the caller's leader loops for each
//     term this node wins, only after a Barrier has applied every entry of
//     earlier terms, and stops them (and waits) when the term ends.
//     LeaderReady is true in between: hashicorp/raft has no ReadIndex, so a
//     consistent read waits for it. Observe counts leader changes.
//   - A node with Raft state never bootstraps again (design §5.2).
package store
