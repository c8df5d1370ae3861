//go:build !llmgw_upgrade_old

package controlplane

import (
	"context"
	"crypto/sha256"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestAPIKeysAdmin: AdminService's API-key verbs on one server. Create is
// gated (refused naming the server while it runs an older release); a
// name in use is ALREADY_EXISTS, a malformed hash INVALID_ARGUMENT; the
// listing has names, models and creation times but never a hash; a revoke
// of an unknown name is NOT_FOUND.
func TestAPIKeysAdmin(t *testing.T) {
	h := sha256.Sum256([]byte("sk-test"))
	h2 := sha256.Sum256([]byte("sk-other"))
	t.Run("gated", func(t *testing.T) {
		cfg := testConfig(t, t.TempDir(), freeAddr(t))
		cfg.Version = "v0.1.0"
		r := start(t, cfg)
		defer r.stop(t)
		_, err := llmgwv1.NewAdminServiceClient(r.conn).CreateApiKey(context.Background(), &llmgwv1.CreateApiKeyRequest{Name: "a", SecretSha256: h[:]})
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "c1 (v0.1.0)") {
			t.Fatalf("CreateApiKey on v0.1.0: %v, want FAILED_PRECONDITION naming c1 (v0.1.0)", err)
		}
	})

	cfg := testConfig(t, t.TempDir(), freeAddr(t))
	cfg.Version = fsm.APIKeysVersion
	r := start(t, cfg)
	defer r.stop(t)
	ctx := context.Background()
	admin := llmgwv1.NewAdminServiceClient(r.conn)
	created, err := admin.CreateApiKey(ctx, &llmgwv1.CreateApiKeyRequest{Name: "team-a", SecretSha256: h[:], Models: []string{"demo"}})
	if err != nil {
		t.Fatal(err)
	}
	if k := created.Key; k.Name != "team-a" || k.SecretSha256 != nil || k.CreatedUnix == 0 || k.Revision != created.Revision {
		t.Fatalf("created key = %v at %d", k, created.Revision)
	}
	if _, err := admin.CreateApiKey(ctx, &llmgwv1.CreateApiKeyRequest{Name: "team-b", SecretSha256: h2[:]}); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		req  *llmgwv1.CreateApiKeyRequest
		code codes.Code
	}{
		{"name in use", &llmgwv1.CreateApiKeyRequest{Name: "team-a", SecretSha256: h2[:]}, codes.AlreadyExists},
		{"short hash", &llmgwv1.CreateApiKeyRequest{Name: "c", SecretSha256: h[:8]}, codes.InvalidArgument},
		{"bad name", &llmgwv1.CreateApiKeyRequest{Name: "Team C", SecretSha256: h2[:]}, codes.InvalidArgument},
	} {
		if _, err := admin.CreateApiKey(ctx, tt.req); status.Code(err) != tt.code {
			t.Errorf("%s: %v, want %s", tt.name, err, tt.code)
		}
	}
	list, err := admin.ListApiKeys(ctx, &llmgwv1.ListRequest{Consistent: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Keys) != 2 || list.Keys[0].Name != "team-a" || list.Keys[1].Name != "team-b" || strings.Join(list.Keys[0].Models, ",") != "demo" {
		t.Fatalf("listing = %v", list.Keys)
	}
	for _, k := range list.Keys {
		if k.SecretSha256 != nil {
			t.Fatalf("listing carries the hash of %s", k.Name)
		}
	}
	if _, err := admin.RevokeApiKey(ctx, &llmgwv1.RevokeApiKeyRequest{Name: "nope"}); status.Code(err) != codes.NotFound {
		t.Fatalf("revoke unknown: %v, want NOT_FOUND", err)
	}
	if _, err := admin.RevokeApiKey(ctx, &llmgwv1.RevokeApiKeyRequest{Name: "team-a"}); err != nil {
		t.Fatal(err)
	}
	if list, _ = admin.ListApiKeys(ctx, &llmgwv1.ListRequest{}); len(list.GetKeys()) != 1 || list.Keys[0].Name != "team-b" {
		t.Fatalf("listing after revoke = %v", list.GetKeys())
	}
}
