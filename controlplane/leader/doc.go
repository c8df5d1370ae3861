// Package leader is what only the leader of the control plane does:
// placement (design §5.5), liveness (design §5.4), the placement of LoRA
// adapters (design §7.6) and the routers' leased shares of tenants' limits
// (design §7.7, package quota's allocator, which the node tells of each
// term through Elected and Resigned). Every decision is a Raft command,
// proposed through the minimum-version gate (package gate); the leased
// shares are in memory only, and a new leader settles before it grants.
//
// Place runs for one term of leadership: the node starts it after the
// term's Barrier (package store, RunLeadership), so the FSM has applied
// everything earlier leaders committed, and cancels it when the term ends
// (design §5.1). What it remembers — when it took office, since when it has
// seen each node DOWN and each replica draining — is per term and by its
// own clock, so a new leader never judges by a clock it did not watch.
//
// Decisions where the design is silent:
//   - Liveness. An ACTIVE node without an agent session on any server for
//     NodeDownAfter (counted from the later of the last session's end and
//     the leader's election: the grace after winning office) is marked
//     DOWN; after RescheduleAfter DOWN its replicas are placed elsewhere
//     with new uids. Without gossip only a lone leader judges.
//   - Removal drains first: placement marks an extra replica draining, and
//     removes it once its agent reports it STOPPED or FAILED (or stops
//     reporting it), or after DrainTimeout.
//   - A refused decision is not retried until the next tick: it would be
//     recomputed identically on the revision its refusal made.
//   - Adapters. EnsureAdapter's placement decisions run one at a time under
//     one lock; re-reading the placement under it is the single flight, and
//     the committed placement is the record, so a cold adapter is placed
//     once however many calls and routers ask. An adapter the agent has not
//     reported, or reports LOADING, is never evicted; nor one with requests
//     running or waiting, nor one used (or placed by this leader) within
//     AdapterMinIdle. A load FAILED on every placed replica answers FAILED
//     until its retry-after; after it the placement is removed and made
//     anew, once per call that finds it expired — never in a loop; a
//     failure without a retry-after is final until the model is
//     re-applied. With max_loaded_adapters 0 a ready replica of the model
//     counts as holding every adapter.
package leader
