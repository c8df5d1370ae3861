package router

import (
	"context"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/flowshare"
)

// The control plane as the flow-share loop reports to it.
var _ flowshare.Reporter = (*controlAdapters)(nil)

// ReportFlow sends the router's flow-control queues to the next control
// server (followers forward it to the leader) and returns the other
// routers' queues (router/flowshare's Reporter, design §7.8). A failed
// report is not sent again: the next tick's replaces it.
func (c *controlAdapters) ReportFlow(ctx context.Context, r *llmgwv1.FlowReport) (*llmgwv1.FlowView, error) {
	conn, _, err := c.conn(c.addrs())
	if err != nil {
		return nil, err
	}
	return llmgwv1.NewFlowServiceClient(conn).Report(ctx, r)
}
