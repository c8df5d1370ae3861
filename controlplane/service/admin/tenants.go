package admin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/controlplane/service"
	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Tenants and their usage (design §7.7). Writes are gated commands
// answered by the leader (the forwarding interceptor sends them there);
// each is checked here first with the FSM's own validation, so a bad
// tenant is refused naming its field before it costs a log entry, and
// the FSM checks again when applying. Reads are served from this
// server's FSM unless a consistent list is asked.

// PutTenant creates a tenant (create: ALREADY_EXISTS for a name in use)
// or replaces one whole (NOT_FOUND for an unknown name). Per-model limits
// are sorted by model here, so a caller may give them in any order; the
// FSM stores them sorted. A new tenant's creation time is this server's
// clock; an update keeps the stored one. Every other field, the priority
// classes included, passes through as given: the tenant is cloned whole.
func (a *Service) PutTenant(ctx context.Context, req *llmgwv1.PutTenantRequest) (*llmgwv1.PutTenantResponse, error) {
	if req.GetTenant() == nil {
		return nil, service.ToStatus(errValidation("tenant", "required"))
	}
	t := proto.Clone(req.Tenant).(*llmgwv1.Tenant)
	slices.SortStableFunc(t.ModelLimits, func(x, y *llmgwv1.TenantModelLimits) int { return cmp.Compare(x.GetModel(), y.GetModel()) })
	t.Revision = 0
	if req.Create {
		t.CreatedUnix = a.now().Unix()
	}
	if err := fsm.ValidateTenant(t); err != nil {
		return nil, service.ToStatus(fmt.Errorf("put tenant: %w", err))
	}
	verb := "update"
	if req.Create {
		verb = "create"
	}
	// Refused here too when this state already says so, without a log
	// entry; the FSM decides for a put racing another.
	switch _, exists := a.state.Tenant(t.Name); {
	case req.Create && exists:
		return nil, status.Errorf(codes.AlreadyExists, "tenant %q already exists (llmgwctl tenant update %s changes it)", t.Name, t.Name)
	case !req.Create && !exists:
		return nil, status.Errorf(codes.NotFound, "tenant %q not found: create it first (llmgwctl tenant create %s)", t.Name, t.Name)
	}
	res, rev, err := a.propose.Propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_PUT_TENANT, &llmgwv1.PutTenantCommand{Tenant: t, Create: req.Create})
	if err != nil {
		return nil, existsStatus(fmt.Errorf("%s tenant %s: %w", verb, t.Name, err))
	}
	stored, _ := res.(*llmgwv1.Tenant)
	if req.Create {
		a.log.Info("tenant created", "tenant", t.Name, "shadow", t.Shadow, "default_class", t.DefaultClass, "max_class", t.MaxClass, "revision", rev)
	} else {
		a.log.Info("tenant updated", "tenant", t.Name, "shadow", t.Shadow, "default_class", t.DefaultClass, "max_class", t.MaxClass, "revision", rev)
	}
	return &llmgwv1.PutTenantResponse{Tenant: stored, Revision: rev}, nil
}

// GetTenant is one tenant (NOT_FOUND for an unknown name).
func (a *Service) GetTenant(_ context.Context, req *llmgwv1.GetTenantRequest) (*llmgwv1.Tenant, error) {
	if req.GetName() == "" {
		return nil, service.ToStatus(errValidation("name", "required"))
	}
	t, ok := a.state.Tenant(req.Name)
	if !ok {
		return nil, service.ToStatus(fmt.Errorf("tenant %q: %w", req.Name, fsm.ErrNotFound))
	}
	return t, nil
}

// ListTenants is every tenant, sorted by name.
func (a *Service) ListTenants(_ context.Context, req *llmgwv1.ListRequest) (*llmgwv1.ListTenantsResponse, error) {
	if err := a.readable(req); err != nil {
		return nil, err
	}
	// The revision first: the tenants read after it are at least as new.
	rev := a.state.Revision()
	return &llmgwv1.ListTenantsResponse{Tenants: a.state.Tenants(), Revision: rev}, nil
}

// DeleteTenant deletes a tenant no key belongs to: FAILED_PRECONDITION
// naming the keys otherwise (fsm/tenants.go), NOT_FOUND for an unknown
// name. Its usage rows stay until they age out: last month's bill.
func (a *Service) DeleteTenant(ctx context.Context, req *llmgwv1.DeleteTenantRequest) (*llmgwv1.DeleteTenantResponse, error) {
	if req.GetName() == "" {
		return nil, service.ToStatus(errValidation("name", "required"))
	}
	if _, ok := a.state.Tenant(req.Name); !ok {
		return nil, service.ToStatus(fmt.Errorf("tenant %q: %w", req.Name, fsm.ErrNotFound))
	}
	// The FSM refuses it too (a key may move in meanwhile); said here
	// plainly and without a log entry when this state already knows. A
	// copy of the whole state, as a delete is rare.
	var keys []string
	for _, k := range a.state.State().GetApiKeys() {
		if k.GetTenant() == req.Name {
			keys = append(keys, k.Name)
		}
	}
	if len(keys) > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "tenant %q: keys %v belong to it; move them (llmgwctl apikey update NAME --tenant T) or revoke them first", req.Name, keys)
	}
	_, rev, err := a.propose.Propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_DELETE_TENANT, &llmgwv1.DeleteTenantCommand{Name: req.Name})
	if err != nil {
		return nil, service.ToStatus(fmt.Errorf("delete tenant %s: %w", req.Name, err))
	}
	a.log.Info("tenant deleted", "tenant", req.Name, "revision", rev)
	return &llmgwv1.DeleteTenantResponse{Revision: rev}, nil
}

// SetApiKeyTenant moves a key to a tenant that exists, or with "" back to
// its own: NOT_FOUND for an unknown key or tenant, nothing changed.
func (a *Service) SetApiKeyTenant(ctx context.Context, req *llmgwv1.SetApiKeyTenantRequest) (*llmgwv1.SetApiKeyTenantResponse, error) { //nolint:staticcheck // ST1003: the generated AdminServiceServer method
	if req.GetName() == "" {
		return nil, service.ToStatus(errValidation("name", "required"))
	}
	if req.GetTenant() != "" {
		// The name's shape, as a tenant's own is checked.
		var ve *fsm.ValidationError
		if err := fsm.ValidateTenant(&llmgwv1.Tenant{Name: req.Tenant}); errors.As(err, &ve) {
			return nil, service.ToStatus(errValidation("tenant", ve.Reason))
		}
	}
	if err := a.tenantExists(req.GetTenant()); err != nil {
		return nil, err
	}
	_, rev, err := a.propose.Propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_SET_API_KEY_TENANT,
		&llmgwv1.SetApiKeyTenantCommand{Name: req.Name, Tenant: req.Tenant})
	if err != nil {
		return nil, service.ToStatus(fmt.Errorf("set api key %s tenant: %w", req.Name, err))
	}
	a.log.Info("api key moved to a tenant", "key", req.Name, "tenant", req.Tenant, "revision", rev)
	return &llmgwv1.SetApiKeyTenantResponse{Revision: rev}, nil
}

// Usage is the roll-up's rows of a tenant and a model ("" for every one)
// from the hour holding since_unix on, sorted by tenant, model and hour.
func (a *Service) Usage(_ context.Context, req *llmgwv1.UsageRequest) (*llmgwv1.UsageResponse, error) {
	if req.GetSinceUnix() < 0 {
		return nil, service.ToStatus(errValidation("since_unix", fmt.Sprintf("must not be negative, got %d", req.SinceUnix)))
	}
	rev := a.state.Revision()
	return &llmgwv1.UsageResponse{Rows: a.state.Usage(req.GetTenant(), req.GetModel(), req.GetSinceUnix()), Revision: rev}, nil
}

// tenantExists refuses a key's tenant the state does not hold, with what
// to do about it; "" (the key's own tenant) always exists. Writes are
// answered by the leader, whose state holds every earlier write; the FSM
// checks again when applying.
func (a *Service) tenantExists(name string) error {
	if name == "" {
		return nil
	}
	if _, ok := a.state.Tenant(name); !ok {
		return status.Errorf(codes.NotFound, "tenant %q not found: create it first (llmgwctl tenant create %s)", name, name)
	}
	return nil
}
