// Package flow is the FlowService (design §7.8): Report, a router's
// flow-control queues per model and priority class, answered with every
// other router's, so each router holds back low-class work while another
// router's higher class waits.
//
// Only routers may call it (service.allowed), and one whose certificate is
// known may report only under its own name. Every server accepts the
// call; the node's forwarding (package service) sends it to the leader,
// which alone holds the reports, in memory (package flowview): a server
// that is not the leader when a report reaches it answers UNAVAILABLE
// naming the leader, which the forwarding server holds and retries like
// any leader-only call. A new leader starts with no report, and the
// routers report again within 250 ms.
package flow
