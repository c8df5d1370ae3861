package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// keyAdmin keeps API keys as the AdminService would, hashes included, and
// records what it was sent.
type keyAdmin struct {
	llmgwv1.UnimplementedAdminServiceServer
	mu      sync.Mutex
	keys    []*llmgwv1.ApiKey
	created []*llmgwv1.CreateApiKeyRequest
	// leak makes ListApiKeys send the hashes, as a broken server might.
	leak bool
	// required is the cluster's "keys required", which the first key
	// created turns on.
	required bool
}

func (f *keyAdmin) CreateApiKey(_ context.Context, r *llmgwv1.CreateApiKeyRequest) (*llmgwv1.CreateApiKeyResponse, error) { //nolint:staticcheck // ST1003: the generated AdminServiceServer method
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, k := range f.keys {
		if k.Name == r.Name {
			return nil, status.Errorf(codes.AlreadyExists, "create api key %s: api key %q: already exists", r.Name, r.Name)
		}
	}
	f.created = append(f.created, r)
	k := &llmgwv1.ApiKey{Name: r.Name, SecretSha256: r.SecretSha256, Models: r.Models, CreatedUnix: 1700000000, Revision: uint64(10 + len(f.created))}
	f.keys = append(f.keys, k)
	turned := !f.required
	f.required = true
	return &llmgwv1.CreateApiKeyResponse{Key: &llmgwv1.ApiKey{Name: k.Name, Models: k.Models, CreatedUnix: k.CreatedUnix, Revision: k.Revision},
		Revision: k.Revision, TurnedKeysRequiredOn: turned}, nil
}

func (f *keyAdmin) SetApiKeysRequired(_ context.Context, r *llmgwv1.SetApiKeysRequiredRequest) (*llmgwv1.SetApiKeysRequiredResponse, error) { //nolint:staticcheck // ST1003: the generated AdminServiceServer method
	f.mu.Lock()
	defer f.mu.Unlock()
	was := f.required
	f.required = r.Required
	return &llmgwv1.SetApiKeysRequiredResponse{Revision: 40, Was: was}, nil
}

func (f *keyAdmin) ListApiKeys(context.Context, *llmgwv1.ListRequest) (*llmgwv1.ListApiKeysResponse, error) { //nolint:staticcheck // ST1003: the generated AdminServiceServer method
	f.mu.Lock()
	defer f.mu.Unlock()
	out := &llmgwv1.ListApiKeysResponse{Revision: 20, KeysRequired: f.required}
	for _, k := range f.keys {
		c := &llmgwv1.ApiKey{Name: k.Name, Models: k.Models, CreatedUnix: k.CreatedUnix, Revision: k.Revision}
		if f.leak {
			c.SecretSha256 = k.SecretSha256
		}
		out.Keys = append(out.Keys, c)
	}
	return out, nil
}

func (f *keyAdmin) RevokeApiKey(_ context.Context, r *llmgwv1.RevokeApiKeyRequest) (*llmgwv1.RevokeApiKeyResponse, error) { //nolint:staticcheck // ST1003: the generated AdminServiceServer method
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, k := range f.keys {
		if k.Name == r.Name {
			f.keys = append(f.keys[:i], f.keys[i+1:]...)
			return &llmgwv1.RevokeApiKeyResponse{Revision: 30}, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "revoke api key %s: api key %q: not found", r.Name, r.Name)
}

// TestAPIKeyCreate: the secret is printed once, in the sk-llmgw- form with
// 256 random bits; what the server gets is its SHA-256, never the secret;
// two creates make two secrets.
func TestAPIKeyCreate(t *testing.T) {
	f := &keyAdmin{}
	addr := serveAdmin(t, f)
	out, err := run(addr, "apikey", "create", "team-a", "--models", "demo,chat")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	secret := lines[len(lines)-1]
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(secret, SecretPrefix))
	if !strings.HasPrefix(secret, SecretPrefix) || err != nil || len(raw) != 32 {
		t.Fatalf("secret %q is not sk-llmgw- and 32 bytes of base64url (%v); output:\n%s", secret, err, out)
	}
	if !strings.Contains(out, "api key team-a created at revision 11 for demo,chat") {
		t.Errorf("output:\n%s", out)
	}
	// The first key says what it turned on and how to undo it (issue 28).
	if !strings.Contains(out, "keys are now required") || !strings.Contains(out, "llmgwctl apikey require off") {
		t.Errorf("the first key does not say it turned keys required on:\n%s", out)
	}
	req := f.created[0]
	h := sha256.Sum256([]byte(secret))
	if !bytes.Equal(req.SecretSha256, h[:]) || strings.Join(req.Models, ",") != "demo,chat" || req.Name != "team-a" {
		t.Fatalf("server got %v; want the secret's SHA-256", req)
	}
	if strings.Contains(string(req.SecretSha256), secret) {
		t.Fatal("the secret was sent")
	}

	out2, err := run(addr, "apikey", "create", "team-b", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var j struct {
		Name, Secret string
		Models       []string
		Revision     uint64
	}
	if err := json.Unmarshal([]byte(out2), &j); err != nil || j.Name != "team-b" || j.Models == nil || len(j.Models) != 0 || j.Revision != 12 {
		t.Fatalf("json %+v (%v): %s", j, err, out2)
	}
	if j.Secret == secret || !strings.HasPrefix(j.Secret, SecretPrefix) {
		t.Fatalf("second secret %q", j.Secret)
	}
	if strings.Contains(out2, `"turned_keys_required_on": true`) {
		t.Errorf("the second key says it turned keys required on:\n%s", out2)
	}
}

// TestAPIKeyRequire (issue 28): "keys required" is turned off and on by
// an admin command that says what it did; anything but on or off is
// refused before a call.
func TestAPIKeyRequire(t *testing.T) {
	f := &keyAdmin{required: true}
	addr := serveAdmin(t, f)
	for _, tt := range []struct {
		arg, want, wantErr string
		required           bool
	}{
		{"off", "keys required off at revision 40: routers serve requests without a key again", "", false},
		{"off", "keys required was off already", "", false},
		{"on", "keys required on at revision 40", "", true},
		{"maybe", "", `invalid argument "maybe"`, true},
	} {
		out, err := run(addr, "apikey", "require", tt.arg)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("require %s: err %v, want %q", tt.arg, err, tt.wantErr)
			}
		} else if err != nil || !strings.Contains(out, tt.want) {
			t.Errorf("require %s: %q, %v; want %q", tt.arg, out, err, tt.want)
		}
		if f.required != tt.required {
			t.Errorf("after require %s the cluster's requirement is %v", tt.arg, f.required)
		}
	}
}

// TestAPIKeyCommands: list shows names, models, creation and revision and
// no secret or hash (even if a server sent one); bad input is refused
// before any call; the server's refusals read plainly; revoking the last
// key says the check is off again.
func TestAPIKeyCommands(t *testing.T) {
	f := &keyAdmin{leak: true}
	addr := serveAdmin(t, f)
	var secrets []string
	for _, a := range [][]string{{"team-a"}, {"team-b", "--models", "demo"}} {
		out, err := run(addr, append([]string{"apikey", "create"}, a...)...)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		secrets = append(secrets, lines[len(lines)-1])
	}
	tests := []struct {
		name    string
		args    []string
		wantErr string
		want    []string
	}{
		{name: "list", args: []string{"apikey", "list"},
			want: []string{"NAME", "MODELS", "CREATED", "team-a", "every model", "2023-11-14T22:13:20Z", "team-b", "demo", "keys required: on"}},
		{name: "list json", args: []string{"apikey", "list", "-o", "json"}, want: []string{`"name": "team-a"`, `"secret_sha256": ""`}},
		{name: "bad name refused before the call", args: []string{"apikey", "create", "Team A"}, wantErr: "apikey create: name: must match"},
		{name: "model twice refused before the call", args: []string{"apikey", "create", "c", "--models", "demo,demo"}, wantErr: "models[1]"},
		{name: "name in use", args: []string{"apikey", "create", "team-a"}, wantErr: "apikey create team-a: create api key team-a: api key \"team-a\": already exists"},
		{name: "revoke unknown", args: []string{"apikey", "revoke", "nope"}, wantErr: "not found"},
		{name: "revoke", args: []string{"apikey", "revoke", "team-a"}, want: []string{"api key team-a revoked at revision 30"}},
		{name: "revoke the last", args: []string{"apikey", "revoke", "team-b"}, want: []string{"api key team-b revoked", "no API key is left"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := run(addr, tt.args...)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			for _, s := range secrets {
				h := sha256.Sum256([]byte(s))
				for _, leak := range []string{s, strings.TrimPrefix(s, SecretPrefix), hex.EncodeToString(h[:]), base64.StdEncoding.EncodeToString(h[:])} {
					if strings.Contains(out, leak) {
						t.Fatalf("output shows a secret or its hash %q:\n%s", leak, out)
					}
				}
			}
		})
	}
	if len(f.created) != 2 {
		t.Fatalf("%d creates reached the server, want 2 (the refused ones never call)", len(f.created))
	}
}
