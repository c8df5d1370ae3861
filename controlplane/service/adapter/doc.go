// Package adapter is the AdapterService (design §7.6): EnsureAdapter, a
// router's request that a LoRA adapter be loaded somewhere before it sends
// a request for it.
//
// Every server accepts the call; the node's forwarding (package service)
// sends it to the leader, which alone places adapters, so concurrent calls
// from many routers meet in one place (package leader does the work). The
// wait is the request's timeout capped by AdapterWaitMax; an answer with
// retry_after_ms becomes the router's 503 Retry-After.
package adapter
