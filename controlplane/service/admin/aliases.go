package admin

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/controlplane/service"
	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Model aliases (design §7.9). Writes are gated commands answered by the
// leader (the forwarding interceptor sends them there); each is checked
// here first with the FSM's own validation — the shape, then the names
// against this server's models — so a bad alias is refused naming its
// field before it costs a log entry, and the FSM checks again when
// applying. The list is served from this server's FSM unless a
// consistent one is asked.

// ApplyAlias creates an alias or replaces it whole.
func (a *Service) ApplyAlias(ctx context.Context, req *llmgwv1.ApplyAliasRequest) (*llmgwv1.ApplyAliasResponse, error) {
	if req.GetAlias() == nil {
		return nil, service.ToStatus(errValidation("alias", "required"))
	}
	al := proto.Clone(req.Alias).(*llmgwv1.Alias)
	al.Revision = 0
	if err := fsm.ValidateAlias(al); err != nil {
		return nil, service.ToStatus(fmt.Errorf("apply alias: %w", err))
	}
	// Answered by the leader, whose state holds every earlier write; the
	// FSM decides for an apply racing a model's.
	if err := fsm.ValidateAliasNames(al, a.state.State().GetModels()); err != nil {
		return nil, service.ToStatus(fmt.Errorf("apply alias: %w", err))
	}
	res, rev, err := a.propose.Propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_PUT_ALIAS, &llmgwv1.PutAliasCommand{Alias: al})
	if err != nil {
		return nil, service.ToStatus(fmt.Errorf("apply alias %s: %w", al.Name, err))
	}
	stored, _ := res.(*llmgwv1.Alias)
	a.log.Info("alias applied", "alias", al.Name, "targets", aliasTargetsLog(al), "sticky", al.Sticky, "fallbacks", al.Fallbacks, "revision", rev)
	return &llmgwv1.ApplyAliasResponse{Alias: stored, Revision: rev}, nil
}

// ListAliases is every alias, sorted by name.
func (a *Service) ListAliases(_ context.Context, req *llmgwv1.ListRequest) (*llmgwv1.ListAliasesResponse, error) {
	if err := a.readable(req); err != nil {
		return nil, err
	}
	// The revision first: the aliases read after it are at least as new.
	rev := a.state.Revision()
	return &llmgwv1.ListAliasesResponse{Aliases: a.state.Aliases(), Revision: rev}, nil
}

// DeleteAlias removes an alias (NOT_FOUND for an unknown name): routers
// answer its name 404 once the change reaches them.
func (a *Service) DeleteAlias(ctx context.Context, req *llmgwv1.DeleteAliasRequest) (*llmgwv1.DeleteAliasResponse, error) {
	if req.GetName() == "" {
		return nil, service.ToStatus(errValidation("name", "required"))
	}
	if _, ok := a.state.Alias(req.Name); !ok {
		return nil, service.ToStatus(fmt.Errorf("alias %q: %w", req.Name, fsm.ErrNotFound))
	}
	_, rev, err := a.propose.Propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_DELETE_ALIAS, &llmgwv1.DeleteAliasCommand{Name: req.Name})
	if err != nil {
		return nil, service.ToStatus(fmt.Errorf("delete alias %s: %w", req.Name, err))
	}
	a.log.Info("alias deleted", "alias", req.Name, "revision", rev)
	return &llmgwv1.DeleteAliasResponse{Revision: rev}, nil
}

// aliasTargetsLog is an alias's targets as a log line shows them:
// name=weight each.
func aliasTargetsLog(al *llmgwv1.Alias) []string {
	out := make([]string, 0, len(al.GetTargets()))
	for _, t := range al.GetTargets() {
		out = append(out, fmt.Sprintf("%s=%d", t.GetTarget(), t.GetWeight()))
	}
	return out
}
