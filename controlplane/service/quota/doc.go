// Package quota is the QuotaService (design §7.7): Lease, a router's
// renewal of its shares of the tenants' limits, and RecordUsage, a batch
// of its metered usage for the replicated roll-up.
//
// Only routers may call it (service.allowed), and one whose certificate is
// known may speak only under its own name. Every server accepts the calls;
// the node's forwarding (package service) sends them to the leader, which
// alone grants shares (package leader, over package quota's allocator) and
// proposes the batches. A request is checked here against its bounds
// before the leader sees it; a batch goes through the minimum-version gate
// like every command of tenants, so a cluster with a server older than
// tenants refuses it (FAILED_PRECONDITION) and the router keeps it.
package quota
