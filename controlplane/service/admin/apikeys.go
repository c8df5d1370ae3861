package admin

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/controlplane/service"
	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Router API keys (design §11). The caller makes the secret and sends only
// its SHA-256, so the secret never crosses the network nor reaches a log;
// the hash is replicated so every router can check requests against it,
// and no listing returns it. Create and revoke are gated commands,
// answered by the leader (the forwarding interceptor sends them there).

// CreateApiKey stores a new key under a name not in use (ALREADY_EXISTS
// otherwise). Its creation time is this server's clock. Models may name
// models not applied yet (fsm/apikeys.go); a tenant must exist (NOT_FOUND,
// saying to create it first), "" being the key's own.
func (a *Service) CreateApiKey(ctx context.Context, req *llmgwv1.CreateApiKeyRequest) (*llmgwv1.CreateApiKeyResponse, error) { //nolint:staticcheck // ST1003: the generated AdminServiceServer method
	k := &llmgwv1.ApiKey{Name: req.GetName(), SecretSha256: req.GetSecretSha256(), Models: req.GetModels(), Tenant: req.GetTenant(), CreatedUnix: a.now().Unix()}
	if err := fsm.ValidateAPIKey(k); err != nil {
		return nil, service.ToStatus(fmt.Errorf("create api key: %w", err))
	}
	if err := a.tenantExists(k.Tenant); err != nil {
		return nil, err
	}
	// Answered by the leader, whose state holds every earlier write: what
	// it says before the key is what the key changes.
	wasRequired := a.state.Config().GetApiKeysRequired()
	res, rev, err := a.propose.Propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_PUT_API_KEY, &llmgwv1.PutApiKeyCommand{Key: k})
	if err != nil {
		return nil, existsStatus(fmt.Errorf("create api key %s: %w", k.Name, err))
	}
	stored, _ := res.(*llmgwv1.ApiKey)
	a.log.Info("api key created", "key", k.Name, "models", k.Models, "tenant", k.Tenant, "revision", rev)
	if !wasRequired {
		a.log.Warn("api keys are required by every router from now on", "key", k.Name, "revision", rev)
	}
	return &llmgwv1.CreateApiKeyResponse{Key: withoutSecret(stored), Revision: rev, TurnedKeysRequiredOn: !wasRequired}, nil
}

// SetApiKeysRequired turns the routers' key requirement on or off (design
// §11): off, requests without a key are served again, the keys are kept,
// and the next key created turns it back on.
func (a *Service) SetApiKeysRequired(ctx context.Context, req *llmgwv1.SetApiKeysRequiredRequest) (*llmgwv1.SetApiKeysRequiredResponse, error) { //nolint:staticcheck // ST1003: the generated AdminServiceServer method
	res, rev, err := a.propose.Propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_SET_API_KEYS_REQUIRED,
		&llmgwv1.SetApiKeysRequiredCommand{Required: req.GetRequired()})
	if err != nil {
		return nil, service.ToStatus(fmt.Errorf("set api keys required: %w", err))
	}
	was, _ := res.(bool)
	a.log.Warn("api keys required set by an admin", "required", req.GetRequired(), "was", was, "revision", rev)
	return &llmgwv1.SetApiKeysRequiredResponse{Revision: rev, Was: was}, nil
}

// ListApiKeys lists every key by name, never its hash.
func (a *Service) ListApiKeys(_ context.Context, req *llmgwv1.ListRequest) (*llmgwv1.ListApiKeysResponse, error) { //nolint:staticcheck // ST1003: the generated AdminServiceServer method
	st, err := a.read(req)
	if err != nil {
		return nil, err
	}
	out := &llmgwv1.ListApiKeysResponse{Revision: st.Revision, Keys: make([]*llmgwv1.ApiKey, 0, len(st.ApiKeys)),
		KeysRequired: st.GetConfig().GetApiKeysRequired()}
	for _, k := range st.ApiKeys {
		out.Keys = append(out.Keys, withoutSecret(k))
	}
	return out, nil
}

// RevokeApiKey deletes a key (NOT_FOUND for an unknown name); routers
// refuse its secret as soon as the change reaches them.
func (a *Service) RevokeApiKey(ctx context.Context, req *llmgwv1.RevokeApiKeyRequest) (*llmgwv1.RevokeApiKeyResponse, error) { //nolint:staticcheck // ST1003: the generated AdminServiceServer method
	if req.GetName() == "" {
		return nil, service.ToStatus(errValidation("name", "required"))
	}
	_, rev, err := a.propose.Propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_DELETE_API_KEY, &llmgwv1.DeleteApiKeyCommand{Name: req.Name})
	if err != nil {
		return nil, existsStatus(fmt.Errorf("revoke api key %s: %w", req.Name, err))
	}
	a.log.Info("api key revoked", "key", req.Name, "revision", rev)
	return &llmgwv1.RevokeApiKeyResponse{Revision: rev}, nil
}

// existsStatus is service.ToStatus plus ALREADY_EXISTS for a name in use,
// which only the creates of keys and tenants return.
func existsStatus(err error) error {
	if errors.Is(err, fsm.ErrExists) {
		return status.Error(codes.AlreadyExists, err.Error())
	}
	return service.ToStatus(err)
}

// withoutSecret is a copy of k without its hash, for answers to people.
func withoutSecret(k *llmgwv1.ApiKey) *llmgwv1.ApiKey {
	if k == nil {
		return nil
	}
	c := proto.Clone(k).(*llmgwv1.ApiKey)
	c.SecretSha256 = nil
	return c
}
