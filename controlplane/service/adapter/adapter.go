package adapter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/controlplane/service"
	"github.com/llmgw/llmgw/internal/mtls"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Leader is the adapter work of the leader (package leader). Its errors
// are mapped by service.ToStatus (an adapter no catalog lists is
// NOT_FOUND).
type Leader interface {
	// EnsureAdapter places and waits for an adapter. It waits up to wait
	// and returns the answer with a one-word result for the log (loaded,
	// failed, busy, timeout). req has been checked (adapter set, waiting
	// bounded); wait is its timeout as capped.
	EnsureAdapter(ctx context.Context, req *llmgwv1.EnsureAdapterRequest, wait time.Duration) (*llmgwv1.EnsureAdapterResponse, string, error)
	// ReportAdapterUse keeps a router's requests in flight per adapter
	// and replica, r checked (checkUseReport), and gives the answer; ok
	// is false when r is of a new router session and the leader holds as
	// many as it may.
	ReportAdapterUse(r *llmgwv1.AdapterUseReport) (_ *llmgwv1.AdapterUseReportResponse, ok bool)
}

// Service is the AdapterService.
type Service struct {
	llmgwv1.UnimplementedAdapterServiceServer
	// waitMax caps each call's wait, and is the wait when it names none.
	waitMax time.Duration
	leader  Leader
	log     *slog.Logger
}

// New returns the AdapterService; waitMax is AdapterWaitMax.
func New(waitMax time.Duration, l Leader, log *slog.Logger) *Service {
	return &Service{waitMax: waitMax, leader: l, log: log}
}

// maxWaiting bounds the demand one call may claim.
const maxWaiting = 1 << 20

// EnsureAdapter places the adapter when no replica holds it, then waits for
// an agent's report: LOADED on any placed replica, FAILED on every one, or
// the timeout (the request's, capped by AdapterWaitMax). When every loaded
// adapter is busy, or no replica is ready, it answers at once with
// retry_after_ms and state UNSPECIFIED; the router answers 503 Retry-After.
func (a *Service) EnsureAdapter(ctx context.Context, req *llmgwv1.EnsureAdapterRequest) (*llmgwv1.EnsureAdapterResponse, error) {
	if req.GetAdapter() == "" {
		return nil, status.Error(codes.InvalidArgument, "adapter: required")
	}
	if req.TimeoutMs < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "timeout_ms: must not be negative, got %d", req.TimeoutMs)
	}
	wait := a.waitMax
	if req.TimeoutMs > 0 {
		wait = min(wait, time.Duration(req.TimeoutMs)*time.Millisecond)
	}
	if req.Waiting > maxWaiting {
		return nil, status.Errorf(codes.InvalidArgument, "waiting: at most %d, got %d", maxWaiting, req.Waiting)
	}
	resp, result, err := a.leader.EnsureAdapter(ctx, req, wait)
	if err != nil {
		return nil, service.ToStatus(err)
	}
	a.log.Debug("ensure adapter", "model", req.Adapter, "result", result, "loaded_on", resp.LoadedOn)
	return resp, nil
}

// The bounds of a use report: what one router may make the leader hold.
// A router reports the adapters it had requests for lately, each on the
// replicas it sent them to, far fewer than this.
const (
	maxUses    = 4096
	maxNameLen = 253
	maxActive  = 1 << 20
)

// ReportAdapterUse keeps a router's requests in flight per adapter and
// replica on the leader (design §7.6), whose evictions then leave alone
// what any router is using. Only routers may call it (service.allowed);
// one that reaches this server directly may report only under its own
// name, and the session number, never shown to anyone, keeps one router
// from overwriting another's report. Bounded: at most maxUses entries,
// names of at most maxNameLen bytes.
func (a *Service) ReportAdapterUse(ctx context.Context, r *llmgwv1.AdapterUseReport) (*llmgwv1.AdapterUseReportResponse, error) {
	if err := checkUseReport(r); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if id, ok := mtls.FromContext(ctx); ok && id.Role == mtls.RoleRouter && id.Name != r.GetRouter() {
		return nil, status.Errorf(codes.PermissionDenied, "router: %q is not the caller's name %q", r.GetRouter(), id.Name)
	}
	resp, ok := a.leader.ReportAdapterUse(r)
	if !ok {
		return nil, status.Errorf(codes.ResourceExhausted, "router %s: the leader holds the adapter use of as many router sessions as it may; this one's is not kept", r.GetRouter())
	}
	return resp, nil
}

// checkUseReport checks a use report's bounds; the error names the field.
func checkUseReport(r *llmgwv1.AdapterUseReport) error {
	switch {
	case r.GetRouter() == "" || len(r.GetRouter()) > maxNameLen:
		return fmt.Errorf("router: 1 to %d bytes, got %d", maxNameLen, len(r.GetRouter()))
	case r.GetSession() == 0:
		return errors.New("session: required")
	case len(r.GetUses()) > maxUses:
		return fmt.Errorf("uses: at most %d, got %d", maxUses, len(r.GetUses()))
	}
	for i, u := range r.GetUses() {
		switch {
		case u.GetAdapter() == "" || len(u.GetAdapter()) > maxNameLen:
			return fmt.Errorf("uses[%d].adapter: 1 to %d bytes, got %d", i, maxNameLen, len(u.GetAdapter()))
		case u.GetReplicaId() == "" || len(u.GetReplicaId()) > maxNameLen:
			return fmt.Errorf("uses[%d].replica_id: 1 to %d bytes, got %d", i, maxNameLen, len(u.GetReplicaId()))
		case u.GetActive() > maxActive:
			return fmt.Errorf("uses[%d].active: at most %d, got %d", i, maxActive, u.GetActive())
		case u.GetReason() != "":
			return fmt.Errorf("uses[%d].reason: not for a router to set", i)
		}
	}
	return nil
}
