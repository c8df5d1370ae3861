// Package flowview is the leader's table of the routers' flow-control
// queues (design §7.8): each router reports the depth of its non-empty
// queues, per model and priority class, every 250 ms (FlowService.Report),
// and is answered every other router's queues summed per model and class,
// so a router holding only low-class work does not dispatch it while
// another router's higher class waits.
//
// Nothing here is replicated, and nothing needs to be: a report counts for
// Valid (3 s, twelve reports) from when the leader received it, so a new
// leader starts empty and is whole again within one report interval, and
// a router that stops reporting — dead, cut off, or stopped — drops out of
// every view within Valid. Expired reports are removed lazily, by the next
// call, so the table owns no goroutine.
//
// Decisions where the design is silent:
//   - A router is keyed by its name: a report replaces whatever that router
//     said before, under whichever session. A restarted router's new
//     session so replaces its old one at once, rather than the two counting
//     side by side until the old one expires.
//   - A report's queues are kept as sent but normalized: a queue reported
//     empty is dropped, a (model, class) reported twice is merged, a
//     negative wait is read as 0. Only what bounds the leader's memory and
//     work is refused (ErrInvalid): more than MaxDepths queues, a name
//     longer than MaxNameLen bytes, no router name or session.
//   - Waits are as reported, not aged by the time since: a view is at most
//     one report interval older than its reports, and aging a queue that
//     may have been served meanwhile would invent a wait.
//   - Sums saturate rather than wrap.
//   - At most MaxRouters routers are held; a report from one more is
//     refused (ErrFull) and nothing of it kept, so a flood of names cannot
//     grow the leader's memory or every view's cost.
package flowview
