//go:build !llmgw_upgrade_old

package fsm

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func keyHash(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

func putKey(t testing.TB, name, secret string, models ...string) []byte {
	return mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_PUT_API_KEY, &llmgwv1.PutApiKeyCommand{Key: &llmgwv1.ApiKey{
		Name: name, SecretSha256: keyHash(secret), Models: models, CreatedUnix: 1700000000}})
}

func deleteKey(t testing.TB, name string) []byte {
	return mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_DELETE_API_KEY, &llmgwv1.DeleteApiKeyCommand{Name: name})
}

// TestAPIKeyCommands: a key is created with its hash and models and the
// revision that made it; a name in use, a secret another key has, a
// malformed one and a revoke of an unknown name are refused and change
// nothing; a revoke removes the key.
func TestAPIKeyCommands(t *testing.T) {
	raw := func(k *llmgwv1.ApiKey) func(testing.TB) []byte {
		return func(t testing.TB) []byte {
			return mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_PUT_API_KEY, &llmgwv1.PutApiKeyCommand{Key: k})
		}
	}
	tests := []struct {
		name    string
		cmds    []func(testing.TB) []byte // applied at 100, 101, ...
		want    []string                  // key names after, sorted
		wantErr error                     // of the last command
		invalid string                    // field of the last command's validation error
	}{
		{name: "create", cmds: []func(testing.TB) []byte{func(t testing.TB) []byte { return putKey(t, "team-a", "s1", "demo", "chat") }},
			want: []string{"team-a"}},
		{name: "create two", cmds: []func(testing.TB) []byte{
			func(t testing.TB) []byte { return putKey(t, "b", "s1") },
			func(t testing.TB) []byte { return putKey(t, "a", "s2") }},
			want: []string{"a", "b"}},
		{name: "revoke", cmds: []func(testing.TB) []byte{
			func(t testing.TB) []byte { return putKey(t, "a", "s1") },
			func(t testing.TB) []byte { return putKey(t, "b", "s2") },
			func(t testing.TB) []byte { return deleteKey(t, "a") }},
			want: []string{"b"}},
		{name: "revoke then create again", cmds: []func(testing.TB) []byte{
			func(t testing.TB) []byte { return putKey(t, "a", "s1") },
			func(t testing.TB) []byte { return deleteKey(t, "a") },
			func(t testing.TB) []byte { return putKey(t, "a", "s1") }},
			want: []string{"a"}},
		{name: "name in use", cmds: []func(testing.TB) []byte{
			func(t testing.TB) []byte { return putKey(t, "a", "s1") },
			func(t testing.TB) []byte { return putKey(t, "a", "s2", "demo") }},
			want: []string{"a"}, wantErr: ErrExists},
		{name: "same secret as another key", cmds: []func(testing.TB) []byte{
			func(t testing.TB) []byte { return putKey(t, "a", "s1") },
			func(t testing.TB) []byte { return putKey(t, "b", "s1") }},
			want: []string{"a"}, wantErr: ErrConflict},
		{name: "revoke unknown", cmds: []func(testing.TB) []byte{func(t testing.TB) []byte { return deleteKey(t, "nope") }},
			wantErr: ErrNotFound},
		{name: "no key", cmds: []func(testing.TB) []byte{raw(nil)}, invalid: "key"},
		{name: "no name", cmds: []func(testing.TB) []byte{raw(&llmgwv1.ApiKey{SecretSha256: keyHash("x")})}, invalid: "name"},
		{name: "bad name", cmds: []func(testing.TB) []byte{raw(&llmgwv1.ApiKey{Name: "Team A", SecretSha256: keyHash("x")})}, invalid: "name"},
		{name: "no hash", cmds: []func(testing.TB) []byte{raw(&llmgwv1.ApiKey{Name: "a"})}, invalid: "secret_sha256"},
		{name: "short hash", cmds: []func(testing.TB) []byte{raw(&llmgwv1.ApiKey{Name: "a", SecretSha256: []byte("short")})}, invalid: "secret_sha256"},
		{name: "bad model name", cmds: []func(testing.TB) []byte{raw(&llmgwv1.ApiKey{Name: "a", SecretSha256: keyHash("x"), Models: []string{"demo", "Not/A/Name"}})}, invalid: "models[1]"},
		{name: "model twice", cmds: []func(testing.TB) []byte{raw(&llmgwv1.ApiKey{Name: "a", SecretSha256: keyHash("x"), Models: []string{"demo", "demo"}})}, invalid: "models[1]"},
		{name: "too many models", cmds: []func(testing.TB) []byte{raw(&llmgwv1.ApiKey{Name: "a", SecretSha256: keyHash("x"), Models: make([]string, MaxAPIKeyModels+1)})}, invalid: "models"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := New(Config{})
			applyAll(t, f, history(t)[:1])
			var err error
			var res any
			var before []byte
			for i, c := range tt.cmds {
				before, _ = f.Snapshot()
				if res, err = f.Apply(uint64(100+i), c(t)); err != nil && i < len(tt.cmds)-1 {
					t.Fatalf("command %d: %v", i, err)
				}
			}
			var names []string
			for _, k := range f.APIKeys() {
				names = append(names, k.Name)
			}
			if !slices.Equal(names, tt.want) {
				t.Errorf("keys = %v, want %v", names, tt.want)
			}
			if tt.wantErr != nil || tt.invalid != "" {
				var ve *ValidationError
				switch {
				case tt.wantErr != nil && !errors.Is(err, tt.wantErr):
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				case tt.invalid != "" && (!errors.As(err, &ve) || ve.Field != tt.invalid):
					t.Fatalf("err = %v, want a validation error on %s", err, tt.invalid)
				}
				after := f.State()
				after.Revision = 100 + uint64(len(tt.cmds)) - 2
				if len(tt.cmds) == 1 {
					after.Revision = 2
				}
				if a, _ := (proto.MarshalOptions{Deterministic: true}).Marshal(after); !bytes.Equal(a, before) {
					t.Fatal("a refused command changed the state")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			last := uint64(100 + len(tt.cmds) - 1)
			if k, ok := res.(*llmgwv1.ApiKey); ok {
				if k.Revision != last {
					t.Errorf("created key revision %d, want %d", k.Revision, last)
				}
				if stored, _ := f.APIKey(k.Name); !proto.Equal(stored, k) {
					t.Errorf("result %v, stored %v", k, stored)
				}
			}
		})
	}
}

// TestAPIKeyStoredAsGiven: the key keeps its hash, models and creation
// time; the revision is the entry's index.
func TestAPIKeyStoredAsGiven(t *testing.T) {
	f := New(Config{})
	if _, err := f.Apply(7, putKey(t, "a", "secret", "demo", "demo-sql")); err != nil {
		t.Fatal(err)
	}
	k, ok := f.APIKey("a")
	want := &llmgwv1.ApiKey{Name: "a", SecretSha256: keyHash("secret"), Models: []string{"demo", "demo-sql"}, CreatedUnix: 1700000000, Revision: 7}
	if !ok || !proto.Equal(k, want) {
		t.Fatalf("APIKey(a) = %v, %v; want %v", k, ok, want)
	}
}

// TestAPIKeyChanges: a create is a PUT carrying the hash (routers check
// it), a revoke a DELETE keyed by name, each at its revision, so watchers
// learn both.
func TestAPIKeyChanges(t *testing.T) {
	f := New(Config{})
	applyAll(t, f, history(t)[:1])
	if _, err := f.Apply(10, putKey(t, "a", "s1", "demo")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Apply(11, deleteKey(t, "a")); err != nil {
		t.Fatal(err)
	}
	got, ok := f.ChangesSince(2)
	if !ok || len(got) != 3 {
		t.Fatalf("ChangesSince(2) = %v, %v; want a put, the config requiring keys, and a delete", got, ok)
	}
	put, cfg, del := got[0], got[1], got[2]
	if cfg.Revision != 10 || !cfg.GetConfig().GetApiKeysRequired() {
		t.Errorf("config change = %v, want api_keys_required at revision 10", cfg)
	}
	if put.Revision != 10 || put.Op != llmgwv1.ChangeOp_CHANGE_OP_PUT || !bytes.Equal(put.GetApiKey().GetSecretSha256(), keyHash("s1")) || put.GetApiKey().GetRevision() != 10 {
		t.Errorf("put change = %v", put)
	}
	if del.Revision != 11 || del.Op != llmgwv1.ChangeOp_CHANGE_OP_DELETE || del.GetApiKey().GetName() != "a" || del.GetApiKey().GetSecretSha256() != nil {
		t.Errorf("delete change = %v", del)
	}
}

// TestAPIKeysRequiredStaysSet: the first key sets api_keys_required;
// revoking every key and rewriting the cluster config leave it set, so
// routers fail closed.
func TestAPIKeysRequiredStaysSet(t *testing.T) {
	f := New(Config{})
	applyAll(t, f, history(t)[:1])
	if f.Config().GetApiKeysRequired() {
		t.Fatal("required before any key")
	}
	if _, err := f.Apply(10, putKey(t, "a", "s1")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Apply(11, deleteKey(t, "a")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Apply(12, mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_SET_CLUSTER_CONFIG, &llmgwv1.SetClusterConfigCommand{Config: &llmgwv1.ClusterConfig{DefaultBlockSize: 16}})); err != nil {
		t.Fatal(err)
	}
	if c := f.Config(); !c.GetApiKeysRequired() || c.GetDefaultBlockSize() != 16 {
		t.Fatalf("config after revoke and rewrite = %v, want keys still required", c)
	}
}

// TestAPIKeysRequiredOff (issue 28): an admin's SET_API_KEYS_REQUIRED
// turns the requirement off with the keys kept, a config write does not
// turn it back on, and the next key created does.
func TestAPIKeysRequiredOff(t *testing.T) {
	f := New(Config{})
	applyAll(t, f, history(t)[:1])
	set := func(index uint64, required bool) bool {
		t.Helper()
		res, err := f.Apply(index, mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_SET_API_KEYS_REQUIRED, &llmgwv1.SetApiKeysRequiredCommand{Required: required}))
		if err != nil {
			t.Fatal(err)
		}
		return res.(bool)
	}
	if _, err := f.Apply(10, putKey(t, "a", "s1")); err != nil {
		t.Fatal(err)
	}
	if was := set(11, false); !was {
		t.Fatal("the requirement was off after a key was created")
	}
	if c := f.Config(); c.GetApiKeysRequired() || c.GetRevision() != 11 || len(f.APIKeys()) != 1 {
		t.Fatalf("after off: config %v, %d keys; want off at revision 11, the key kept", c, len(f.APIKeys()))
	}
	if _, err := f.Apply(12, mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_SET_CLUSTER_CONFIG, &llmgwv1.SetClusterConfigCommand{Config: &llmgwv1.ClusterConfig{DefaultBlockSize: 16}})); err != nil {
		t.Fatal(err)
	}
	if f.Config().GetApiKeysRequired() {
		t.Fatal("a config write turned the requirement back on")
	}
	if was := set(13, false); was || f.Config().GetRevision() != 12 {
		t.Fatalf("off again: was %v, revision %d; want a no-op", was, f.Config().GetRevision())
	}
	if _, err := f.Apply(14, putKey(t, "b", "s2")); err != nil {
		t.Fatal(err)
	}
	if !f.Config().GetApiKeysRequired() {
		t.Fatal("a key created did not turn the requirement on")
	}
}

// TestAPIKeysSnapshot: keys are part of the deterministic snapshot and
// survive a restore; a snapshot without keys drops them.
func TestAPIKeysSnapshot(t *testing.T) {
	cmds := append(history(t), putKey(t, "zeta", "s1"), putKey(t, "alpha", "s2", "demo"), putKey(t, "mid", "s3"), deleteKey(t, "mid"))
	a, b := New(Config{}), New(Config{})
	applyAll(t, a, cmds)
	applyAll(t, b, cmds)
	sa, err := a.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if sb, _ := b.Snapshot(); !bytes.Equal(sa, sb) {
		t.Fatal("two FSMs fed the same commands gave different snapshots")
	}
	c := New(Config{})
	if err := c.Restore(sa); err != nil {
		t.Fatal(err)
	}
	if sc, _ := c.Snapshot(); !bytes.Equal(sa, sc) {
		t.Fatal("snapshot -> restore -> snapshot differs")
	}
	got := c.APIKeys()
	if len(got) != 2 || got[0].Name != "alpha" || got[1].Name != "zeta" || !bytes.Equal(got[0].SecretSha256, keyHash("s2")) {
		t.Fatalf("after restore APIKeys = %v", got)
	}
	// A revoke after the restore works on the restored keys.
	if _, err := c.Apply(c.Revision()+1, deleteKey(t, "alpha")); err != nil {
		t.Fatal(err)
	}
	empty := New(Config{})
	applyAll(t, empty, history(t))
	se, _ := empty.Snapshot()
	if err := c.Restore(se); err != nil {
		t.Fatal(err)
	}
	if n := len(c.APIKeys()); n != 0 {
		t.Fatalf("%d keys outlived a restore of a snapshot without them", n)
	}
}

// TestAPIKeyCommandsGated: both commands are behind the gate, introduced
// with APIKeysVersion.
func TestAPIKeyCommandsGated(t *testing.T) {
	for _, typ := range []llmgwv1.CommandType{llmgwv1.CommandType_COMMAND_TYPE_PUT_API_KEY, llmgwv1.CommandType_COMMAND_TYPE_DELETE_API_KEY,
		llmgwv1.CommandType_COMMAND_TYPE_SET_API_KEYS_REQUIRED} {
		if !Known(typ) || Introduced(typ) != APIKeysVersion || APIKeysVersion == "" {
			t.Errorf("%s: known %v, introduced %q; want known, introduced %q", typ, Known(typ), Introduced(typ), APIKeysVersion)
		}
		if Admitted(typ, "v0.1.0") || !Admitted(typ, APIKeysVersion) {
			t.Errorf("%s: admitted below its release or not at it", typ)
		}
	}
}

func TestValidateAPIKeyMessages(t *testing.T) {
	err := ValidateAPIKey(&llmgwv1.ApiKey{Name: "a", SecretSha256: []byte{1, 2}})
	if err == nil || !strings.Contains(err.Error(), "secret_sha256: must be the 32-byte SHA-256") {
		t.Fatalf("err = %v", err)
	}
}
