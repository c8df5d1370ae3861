package flow

import (
	"context"
	"fmt"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/controlplane/service"
	"github.com/llmgw/llmgw/internal/mtls"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Table is the leader's table of the routers' reports (package flowview).
// Its errors are mapped by service.ToStatus: a report outside the bounds
// is INVALID_ARGUMENT, one from a router more than the table may hold
// RESOURCE_EXHAUSTED.
type Table interface {
	// Report replaces the router's report with r and answers every other
	// router's queues; r is checked by the table.
	Report(r *llmgwv1.FlowReport) (*llmgwv1.FlowView, error)
}

// Leadership is whether this server leads (package store): only the
// leader's table is the fleet's.
type Leadership interface {
	IsLeader() bool
	// NotLeader is the error naming the leader (UNAVAILABLE).
	NotLeader() error
}

// Service is the FlowService.
type Service struct {
	llmgwv1.UnimplementedFlowServiceServer
	table Table
	raft  Leadership
	log   *slog.Logger
}

// New returns the FlowService answering from table while raft leads.
func New(table Table, raft Leadership, log *slog.Logger) *Service {
	return &Service{table: table, raft: raft, log: log}
}

// Report takes a router's queues and answers the others' (design §7.8).
// A report reaching a server that does not lead — forwarded to a leader
// that has just lost office — is refused with the leader's name, so the
// forwarding server tries the new one.
func (s *Service) Report(ctx context.Context, req *llmgwv1.FlowReport) (*llmgwv1.FlowView, error) {
	if err := ownName(ctx, req.GetRouter()); err != nil {
		return nil, err
	}
	if !s.raft.IsLeader() {
		return nil, service.ToStatus(fmt.Errorf("flow report: %w", s.raft.NotLeader()))
	}
	view, err := s.table.Report(req)
	if err != nil {
		s.log.Debug("flow report refused", "router", req.GetRouter(), "err", err)
		return nil, service.ToStatus(err)
	}
	return view, nil
}

// ownName refuses a router that speaks under another's name, when its
// certificate is known. A call a follower forwarded carries the
// follower's server certificate and is let through: the forwarding
// interceptor runs before any handler, so the name is checked where a
// router reaches the leader itself, as in the QuotaService.
func ownName(ctx context.Context, router string) error {
	if id, ok := mtls.FromContext(ctx); ok && id.Role == mtls.RoleRouter && id.Name != router {
		return status.Errorf(codes.PermissionDenied, "router: %q is not the caller's name %q", router, id.Name)
	}
	return nil
}
