// Package quota is the leader's side of the tenants' limits (design §7.7,
// "leased shares"): it grants each router session a share of every limit
// the router claims, valid for one lease term, so the routers admit
// requests without a round trip and the shares in force never sum past
// the limit while every router renews.
//
// The Allocator is pure and deterministic: the clock is an argument of
// every call and the limits come through the Limits interface, so tests
// drive it step by step and the leader (package leader) holds one per
// node, told when this node becomes leader (Elected) and stops (Resigned).
// Nothing of it is replicated: a new leader knows no leases, so it grants
// nothing until the old leader's have run out (Settle).
//
// Decisions where the design is silent:
//   - Accounting of rates and concurrency. A session counts as the largest
//     share that may be in force at it: while its newest grant is not
//     acknowledged (a later claim carrying that grant's seq) and not
//     expired, the larger of what it last said it holds and what was
//     issued; once acknowledged, the issued share alone; once expired
//     without a renewal, its fallback — until Hold has passed since it was
//     last heard from, when it is forgotten. A caller's grant is its
//     max-min fair part of the limit over the live sessions' demands (what
//     demand leaves is spread equally), capped by what the others'
//     accounting leaves of the limit. So a shrunk share is reclaimed only
//     once the router has acknowledged it, and a grown one is given only
//     from what is free.
//   - Accounting of budgets. A session counts as what it last said it
//     holds (unspent slices and tokens spent but not yet committed to the
//     roll-up) plus every slice issued since its last acknowledgment of
//     the newest grant. A slice is at most the caller's max-min fair part
//     of what the limit leaves after the committed roll-up and every
//     session's accounting, and at most what it needs for two terms at its
//     demand less what it holds (at least a small minimum, so a router
//     with no demand yet can admit its first request).
//   - Seqs come from one counter per allocator, started at the election's
//     Unix nanoseconds: a new leader's seqs are above the old one's, so a
//     claim never acknowledges a grant of this leader with the seq of
//     another's.
//   - Claims received while settling are kept (what a router holds from
//     the old leader counts), but nothing is granted.
//   - Bounds: MaxClaims per request, scopes per session and MaxSessions
//     sessions; only scopes whose limit exists are kept.
package quota
