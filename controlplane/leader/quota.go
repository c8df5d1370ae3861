package leader

import (
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Elected starts a term of the leased shares (design §7.7): the allocator
// forgets what an earlier term held and grants nothing until the old
// leader's leases have run out (quota.Config.Settle). The node calls it
// when it becomes leader, before Place, and Resigned when the term ends.
func (l *Leader) Elected() {
	l.quota.Elected(l.now())
	l.metrics.quotaSettling.Set(1)
	l.metrics.quotaSessions.Set(0)
}

// Resigned ends the term: the allocator forgets every session and answers
// settling until the next Elected.
func (l *Leader) Resigned() {
	l.quota.Resigned()
	l.metrics.quotaSettling.Set(0)
	l.metrics.quotaSessions.Set(0)
}

// Lease answers a router's renewal of its shares of the tenants' limits
// (design §7.7), read from the replicated state; the QuotaService has
// checked req's bounds. A request the allocator may not hold is refused
// with quota.ErrFull, and changes nothing.
func (l *Leader) Lease(req *llmgwv1.LeaseRequest) (*llmgwv1.LeaseResponse, error) {
	now := l.now()
	resp, err := l.quota.Lease(now, req, l.limits)
	if l.quota.Leading() {
		l.metrics.quotaSessions.Set(float64(l.quota.Sessions()))
		settling := 0.0
		if l.quota.Settling(now) {
			settling = 1
		}
		l.metrics.quotaSettling.Set(settling)
	}
	return resp, err
}
