// Package adapter is the AdapterService (design §7.6): EnsureAdapter, a
// router's request that a LoRA adapter be loaded somewhere before it sends
// a request for it, and ReportAdapterUse, a router's requests in flight
// per adapter and replica, which the leader's evictions respect.
//
// Every server accepts the calls; the node's forwarding (package service)
// sends them to the leader, which alone places and evicts adapters, so
// concurrent calls from many routers meet in one place (package leader
// does the work). The wait is the request's timeout capped by
// AdapterWaitMax; an answer with retry_after_ms becomes the router's 503
// Retry-After. A use report is checked here against its bounds before the
// leader keeps it.
package adapter
