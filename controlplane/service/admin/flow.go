package admin

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/controlplane/service"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// FlowStatus is every router's flow-control queues as the leader last
// heard them, and their sum per model and class (design §7.8). Only the
// leader holds the reports: the forwarding interceptor sends the call
// there, and a server that no longer leads when it arrives refuses it
// naming the leader, so the forwarding server tries again.
func (a *Service) FlowStatus(context.Context, *llmgwv1.FlowStatusRequest) (*llmgwv1.FlowStatusResponse, error) {
	if a.flows == nil {
		return nil, status.Error(codes.Unimplemented, "flow status: this server holds no flow-control reports")
	}
	if !a.raft.IsLeader() {
		return nil, service.ToStatus(fmt.Errorf("flow status: %w", a.raft.NotLeader()))
	}
	return a.flows.Status(), nil
}
