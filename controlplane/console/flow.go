package console

import (
	"context"
	"net/http"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// The flow page (design §7.8, §9): the routers' flow-control queues per
// model and priority class as the leader last heard them — what is queued,
// the longest wait and how many routers hold it — and each router's own.
// FlowStatus is answered by the leader (a follower forwards it), which
// holds each router's report for 3 s: a router that stopped reporting
// drops off the page within that.
func (c *Console) flow(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), c.timeout)
	defer cancel()
	p := newPage()
	st, err := c.admin.FlowStatus(ctx, &llmgwv1.FlowStatusRequest{})
	p.add("flow", st, err)
	p.write(w, c.log)
}
