package adapter

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/controlplane/service"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Ensurer places and waits for adapters on the leader (package leader).
// It waits up to wait and returns the answer with a one-word result for
// the log (loaded, failed, busy, timeout); its errors are mapped by
// service.ToStatus (an adapter no catalog lists is NOT_FOUND).
type Ensurer interface {
	// req has been checked (adapter set, waiting bounded); wait is its
	// timeout as capped.
	EnsureAdapter(ctx context.Context, req *llmgwv1.EnsureAdapterRequest, wait time.Duration) (*llmgwv1.EnsureAdapterResponse, string, error)
}

// Service is the AdapterService.
type Service struct {
	llmgwv1.UnimplementedAdapterServiceServer
	// waitMax caps each call's wait, and is the wait when it names none.
	waitMax time.Duration
	ensurer Ensurer
	log     *slog.Logger
}

// New returns the AdapterService; waitMax is AdapterWaitMax.
func New(waitMax time.Duration, e Ensurer, log *slog.Logger) *Service {
	return &Service{waitMax: waitMax, ensurer: e, log: log}
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
	resp, result, err := a.ensurer.EnsureAdapter(ctx, req, wait)
	if err != nil {
		return nil, service.ToStatus(err)
	}
	a.log.Debug("ensure adapter", "model", req.Adapter, "result", result, "loaded_on", resp.LoadedOn)
	return resp, nil
}
