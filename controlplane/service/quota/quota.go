package quota

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/controlplane/service"
	"github.com/llmgw/llmgw/fsm"
	"github.com/llmgw/llmgw/internal/mtls"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Leader is the leased shares' work of the leader (package leader). Its
// errors are mapped by service.ToStatus: a request the allocator may not
// hold is RESOURCE_EXHAUSTED.
type Leader interface {
	// Lease answers a router's renewal; req has been checked (checkLease).
	Lease(req *llmgwv1.LeaseRequest) (*llmgwv1.LeaseResponse, error)
}

// Proposer commits commands on the leader through the minimum-version gate
// (package gate): the FSM's result and the revision it was applied at.
type Proposer interface {
	Propose(ctx context.Context, t llmgwv1.CommandType, payload proto.Message) (any, uint64, error)
}

// Service is the QuotaService.
type Service struct {
	llmgwv1.UnimplementedQuotaServiceServer
	leader  Leader
	propose Proposer
	// minVersion is the cluster's committed minimum version (the
	// replicated ClusterConfig's).
	minVersion func() string
	log        *slog.Logger
}

// New returns the QuotaService; minVersion reads the cluster's committed
// minimum version.
func New(l Leader, p Proposer, minVersion func() string, log *slog.Logger) *Service {
	return &Service{leader: l, propose: p, minVersion: minVersion, log: log}
}

// The bounds of a renewal: what one router may make the leader read and
// hold. A router claims one scope per limit of the tenants it served
// lately, far fewer than this.
const (
	maxClaims  = 4096
	maxNameLen = 253
	// maxDemand bounds a claim's demand and held: a trillion a minute,
	// fsm.MaxTokensLimit, is beyond any limit.
	maxDemand = fsm.MaxTokensLimit
)

// Lease renews a router's shares of the tenants' limits (design §7.7): it
// reports what it holds and its demand per scope, the leader answers a
// grant for each scope with a limit, or settling. Bounded: at most
// maxClaims claims, names of at most maxNameLen bytes.
func (s *Service) Lease(ctx context.Context, req *llmgwv1.LeaseRequest) (*llmgwv1.LeaseResponse, error) {
	if err := checkLease(req); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := ownName(ctx, req.GetRouter()); err != nil {
		return nil, err
	}
	resp, err := s.leader.Lease(req)
	if err != nil {
		return nil, service.ToStatus(err)
	}
	return resp, nil
}

// RecordUsage commits one batch of a router session's metered usage to
// the roll-up (one Raft write); a batch sent again is applied once
// (fsm/tenants.go). A cluster whose committed minimum version does not
// admit tenants' commands yet refuses it with FAILED_PRECONDITION, and
// never opens the gate for it.
func (s *Service) RecordUsage(ctx context.Context, req *llmgwv1.RecordUsageCommand) (*llmgwv1.RecordUsageResponse, error) {
	if err := fsm.ValidateUsageBatch(req); err != nil {
		return nil, service.ToStatus(fmt.Errorf("record usage: %w", err))
	}
	if err := ownName(ctx, req.GetRouter()); err != nil {
		return nil, err
	}
	// Routers meter every request, tenants or not: a batch is background
	// work, and background work never opens the minimum-version gate by
	// itself (design §13.3) — that would commit, during a rolling upgrade,
	// a minimum version no operator asked for. An operator's first
	// tenant or key command opens it; until then the router keeps its
	// batch.
	if min := s.minVersion(); !fsm.Admitted(llmgwv1.CommandType_COMMAND_TYPE_RECORD_USAGE, min) {
		return nil, status.Errorf(codes.FailedPrecondition,
			"record usage: the cluster's minimum version %q does not admit tenants' commands yet; the first tenant or API key command opens it", min)
	}
	res, rev, err := s.propose.Propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_RECORD_USAGE, req)
	if err != nil {
		return nil, service.ToStatus(fmt.Errorf("record usage of router %s: %w", req.GetRouter(), err))
	}
	applied, _ := res.(bool)
	s.log.Debug("usage recorded", "router", req.GetRouter(), "seq", req.GetSeq(), "rows", len(req.GetRows()), "applied", applied, "revision", rev)
	return &llmgwv1.RecordUsageResponse{Revision: rev}, nil
}

// ownName refuses a router that speaks under another's name, when its
// certificate is known (a server forwarding a router's call is let
// through: the router's own server checked it).
func ownName(ctx context.Context, router string) error {
	if id, ok := mtls.FromContext(ctx); ok && id.Role == mtls.RoleRouter && id.Name != router {
		return status.Errorf(codes.PermissionDenied, "router: %q is not the caller's name %q", router, id.Name)
	}
	return nil
}

// checkLease checks a renewal's bounds; the error names the field.
func checkLease(r *llmgwv1.LeaseRequest) error {
	switch {
	case r.GetRouter() == "" || len(r.GetRouter()) > maxNameLen:
		return fmt.Errorf("router: 1 to %d bytes, got %d", maxNameLen, len(r.GetRouter()))
	case r.GetSession() == 0:
		return errors.New("session: required")
	case len(r.GetClaims()) > maxClaims:
		return fmt.Errorf("claims: at most %d, got %d", maxClaims, len(r.GetClaims()))
	}
	for i, c := range r.GetClaims() {
		sc := c.GetScope()
		switch {
		case sc == nil:
			return fmt.Errorf("claims[%d].scope: required", i)
		case len(sc.GetTenant()) > maxNameLen:
			return fmt.Errorf("claims[%d].scope.tenant: at most %d bytes, got %d", i, maxNameLen, len(sc.GetTenant()))
		case len(sc.GetModel()) > maxNameLen:
			return fmt.Errorf("claims[%d].scope.model: at most %d bytes, got %d", i, maxNameLen, len(sc.GetModel()))
		case sc.GetKind() == llmgwv1.LimitKind_LIMIT_KIND_UNSPECIFIED || llmgwv1.LimitKind_name[int32(sc.GetKind())] == "":
			return fmt.Errorf("claims[%d].scope.kind: a limit kind is required, got %d", i, sc.GetKind())
		case c.GetHeld() > maxDemand:
			return fmt.Errorf("claims[%d].held: at most %d, got %d", i, uint64(maxDemand), c.GetHeld())
		case c.GetDemand() > maxDemand:
			return fmt.Errorf("claims[%d].demand: at most %d, got %d", i, uint64(maxDemand), c.GetDemand())
		}
	}
	return nil
}
