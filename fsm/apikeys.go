package fsm

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Router API keys (design §11). The cluster holds each key's name, the
// SHA-256 of its secret, the models it may use and when it was made; the
// secret itself exists only where llmgwctl printed it. Every router learns
// the keys from the watch stream and checks requests against the hashes.
// Both commands are gated (gate_new.go): a server that predates them would
// stop at the first one.
//
// Decisions where the design is silent:
//   - A key's models may name models (or adapters) not applied yet, or
//     since deleted: keys are provisioned independently of models, and a
//     model re-applied under its name is usable again by the same keys.
//     Names are checked for shape only.
//   - Two keys may not share a secret hash: a router could not tell which
//     of them a request presented.
//   - Keys are never changed in place: revoke and create again.

// ErrExists refuses a create of an object whose name is taken
// (ALREADY_EXISTS).
var ErrExists = errors.New("already exists")

// MaxAPIKeyModels bounds a key's model list, so a Raft entry and every
// router's copy stay small.
const MaxAPIKeyModels = 256

// ValidateAPIKey checks a key's shape as a create gives it: a name like a
// model's, a 32-byte SHA-256, and model names of the model-name shape, each
// once. llmgwctl, the AdminService and Apply run it alike.
func ValidateAPIKey(k *llmgwv1.ApiKey) error {
	if k == nil {
		return invalid("key", "required")
	}
	if err := checkName("name", k.GetName()); err != nil {
		return err
	}
	if n := len(k.GetSecretSha256()); n != sha256.Size {
		return invalid("secret_sha256", "must be the %d-byte SHA-256 of the secret, got %d bytes", sha256.Size, n)
	}
	if k.GetTenant() != "" {
		if err := checkName("tenant", k.GetTenant()); err != nil {
			return err
		}
	}
	return checkModelList("models", k.GetModels())
}

// putAPIKey creates a key. A name in use is refused (ErrExists): a key is
// never replaced in place, so a typo cannot silently change what an
// existing secret may do.
func (a *applier) putAPIKey(p *llmgwv1.PutApiKeyCommand) (any, error) {
	if err := ValidateAPIKey(p.GetKey()); err != nil {
		return nil, err
	}
	k := proto.Clone(p.Key).(*llmgwv1.ApiKey)
	if err := a.checkKeyTenant(k.Tenant); err != nil {
		return nil, err
	}
	if _, ok := a.f.apiKeys[k.Name]; ok {
		return nil, fmt.Errorf("api key %q: %w", k.Name, ErrExists)
	}
	for _, o := range sortedValues(a.f.apiKeys, func(o *llmgwv1.ApiKey) string { return o.Name }) {
		if bytes.Equal(o.SecretSha256, k.SecretSha256) {
			return nil, fmt.Errorf("api key %q: key %q has the same secret: %w", k.Name, o.Name, ErrConflict)
		}
	}
	k.Revision = a.index
	a.f.apiKeys[k.Name] = k
	a.put(k)
	if !a.f.config.GetApiKeysRequired() {
		c := &llmgwv1.ClusterConfig{}
		if a.f.config != nil {
			c = proto.Clone(a.f.config).(*llmgwv1.ClusterConfig)
		}
		c.ApiKeysRequired, c.Revision = true, a.index
		a.f.config = c
		a.put(c)
	}
	return proto.Clone(k), nil
}

// deleteAPIKey revokes a key: routers refuse its secret once the change
// reaches them.
func (a *applier) deleteAPIKey(p *llmgwv1.DeleteApiKeyCommand) (any, error) {
	if _, ok := a.f.apiKeys[p.GetName()]; !ok {
		return nil, fmt.Errorf("api key %q: %w", p.GetName(), ErrNotFound)
	}
	delete(a.f.apiKeys, p.Name)
	a.del(&llmgwv1.ApiKey{Name: p.Name})
	return nil, nil
}

// setAPIKeysRequired sets the routers' key requirement and returns what it
// was. Only this command clears it (a config write keeps it on, and the
// first key sets it): turning the door's lock off is an admin's explicit
// act, never a side effect of revoking the last key (design §11).
func (a *applier) setAPIKeysRequired(p *llmgwv1.SetApiKeysRequiredCommand) (any, error) {
	was := a.f.config.GetApiKeysRequired()
	if was == p.GetRequired() {
		return was, nil
	}
	c := &llmgwv1.ClusterConfig{}
	if a.f.config != nil {
		c = proto.Clone(a.f.config).(*llmgwv1.ClusterConfig)
	}
	c.ApiKeysRequired, c.Revision = p.GetRequired(), a.index
	a.f.config = c
	a.put(c)
	return was, nil
}

// APIKeys returns copies of every router API key, sorted by name, hashes
// included: the watch stream carries them to routers. A listing for people
// strips the hashes (the AdminService does).
func (f *FSM) APIKeys() []*llmgwv1.ApiKey {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return cloneSorted(f.apiKeys, func(k *llmgwv1.ApiKey) string { return k.Name })
}

// APIKey returns a copy of the named key.
func (f *FSM) APIKey(name string) (*llmgwv1.ApiKey, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	k, ok := f.apiKeys[name]
	if !ok {
		return nil, false
	}
	return proto.Clone(k).(*llmgwv1.ApiKey), true
}
