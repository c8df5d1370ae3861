// Package flowshare is the router's side of sharing flow-control queues
// (design §7.8): every Interval (250 ms) it reports this router's
// non-empty queues, per model and priority class, to the control plane
// (FlowService.Report, answered by the leader), and hands the answer —
// every other router's queues, summed — to the router's flow control, so
// a router holding only low-class work does not dispatch it while another
// router's higher class waits.
//
// A report is sent every tick, empty or not: it is a few hundred bytes,
// it keeps the leader's view of this router current (a router whose queues
// emptied must say so, or its last queues would count until they expire),
// and its answer is how the router learns the fleet. A failed or slow call
// (each bounded by Timeout) is logged at Debug and counted, and the loop
// goes on: the fleet view the router holds expires by itself at the
// "until" it was given, so a router cut off from the control plane falls
// back to its own queues alone within a few seconds rather than holding
// work back for queues that may have drained.
//
// The same report carries the router's demand per autoscaled model
// (design §5.7: held requests, engine readings, time to first token), which
// the leader's autoscaler decides on, so the loop runs whenever a model is
// autoscaled, flow control on or off. Off, and with no autoscaled model,
// it sends nothing. An idle router — nothing queued or held here, nothing
// queued elsewhere at the last answer — reports every fourth tick; a held
// request makes it report every tick, so the leader hears of a model
// waiting for its first replica within one interval.
//
// The view holds from when the report was sent for as long as the leader
// counts a report (the answer's valid_ms): the leader counted it from
// when it received it, later, so the router never holds a view longer
// than the leader would — as the leased shares count their term from the
// request (design §7.7).
package flowshare
