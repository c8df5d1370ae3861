package auth

import (
	"crypto/sha256"
	"net/http"
	"testing"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func key(name, secret string, models ...string) *llmgwv1.ApiKey {
	h := sha256.Sum256([]byte(secret))
	return &llmgwv1.ApiKey{Name: name, SecretSha256: h[:], Models: models}
}

func set(keys ...*llmgwv1.ApiKey) *Set {
	s := (*Set)(nil).Clone()
	for _, k := range keys {
		s.Put(k)
	}
	return s
}

func hdr(auth string) http.Header {
	h := http.Header{}
	if auth != "" {
		h.Set("Authorization", auth)
	}
	return h
}

// xKey is a header presenting secret as Anthropic's SDKs do, with auth
// (when set) as its Authorization.
func xKey(secret, auth string) http.Header {
	h := hdr(auth)
	h.Set("x-api-key", secret)
	h.Set("anthropic-version", "2023-06-01")
	return h
}

// TestCheck: the check is off while there are no keys (unless required),
// and then every request is anonymous; once on, a request needs a known
// key as a Bearer credential or as x-api-key (the Bearer one wins), and a
// revoked key is unknown.
func TestCheck(t *testing.T) {
	keys := set(key("team-a", "sk-a"), key("team-b", "sk-b", "demo"))
	revoked := keys.Clone()
	revoked.Delete("team-a")
	tests := []struct {
		name    string
		keys    *Set
		require bool
		auth    string
		xkey    string // x-api-key
		want    string // key name; "" anonymous
		status  int    // 0: allowed
	}{
		{name: "no keys: anonymous", keys: nil},
		{name: "no keys: a key is ignored", keys: set(), auth: "Bearer whatever"},
		{name: "no keys but required", keys: nil, require: true, status: 401},
		{name: "required: unknown key", keys: nil, require: true, auth: "Bearer sk-a", status: 401},
		{name: "no key", keys: keys, require: true, status: 401},
		{name: "bad key", keys: keys, require: true, auth: "Bearer sk-nope", status: 401},
		{name: "good key", keys: keys, require: true, auth: "Bearer sk-a", want: "team-a"},
		{name: "scheme is case-insensitive", keys: keys, require: true, auth: "bearer  sk-b ", want: "team-b"},
		{name: "basic is not bearer", keys: keys, require: true, auth: "Basic c2stYQ==", status: 401},
		{name: "bearer without token", keys: keys, require: true, auth: "Bearer ", status: 401},
		{name: "the secret's hash is not the secret", keys: keys, require: true, auth: "Bearer " + string(key("x", "sk-a").SecretSha256), status: 401},
		{name: "revoked", keys: revoked, require: true, auth: "Bearer sk-a", status: 401},
		{name: "revoked leaves the others", keys: revoked, require: true, auth: "Bearer sk-b", want: "team-b"},
		// Keys exist but the cluster's requirement was turned off (llmgwctl
		// apikey require off, issue 28): anonymous requests pass, a key
		// presented is still checked.
		{name: "not required: no key", keys: keys},
		{name: "not required: basic is no key", keys: keys, auth: "Basic c2stYQ=="},
		{name: "not required: good key", keys: keys, auth: "Bearer sk-b", want: "team-b"},
		{name: "not required: bad key", keys: keys, auth: "Bearer sk-nope", status: 401},
		{name: "not required: bearer without token", keys: keys, auth: "Bearer "},
		// Anthropic's x-api-key, as its SDKs and Claude Code send it.
		{name: "x-api-key", keys: keys, require: true, xkey: "sk-b", want: "team-b"},
		{name: "x-api-key, spaces", keys: keys, require: true, xkey: " sk-b ", want: "team-b"},
		{name: "bad x-api-key", keys: keys, require: true, xkey: "sk-nope", status: 401},
		{name: "not required: bad x-api-key", keys: keys, xkey: "sk-nope", status: 401},
		{name: "no keys: x-api-key is ignored", keys: set(), xkey: "whatever"},
		{name: "bearer wins over x-api-key", keys: keys, require: true, auth: "Bearer sk-a", xkey: "sk-b", want: "team-a"},
		{name: "a bad bearer is not saved by x-api-key", keys: keys, require: true, auth: "Bearer sk-nope", xkey: "sk-b", status: 401},
		{name: "basic falls to x-api-key", keys: keys, require: true, auth: "Basic c2stYQ==", xkey: "sk-b", want: "team-b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := hdr(tt.auth)
			if tt.xkey != "" {
				h = xKey(tt.xkey, tt.auth)
			}
			k, err := Check(tt.keys, tt.require, h)
			if tt.status != 0 {
				if err == nil || err.Status != tt.status || err.Code != "invalid_api_key" || err.Type != "invalid_request_error" {
					t.Fatalf("Check = %v, %v; want %d invalid_api_key", k, err, tt.status)
				}
				return
			}
			if err != nil || k.GetName() != tt.want {
				t.Fatalf("Check = %v, %v; want key %q", k, err, tt.want)
			}
		})
	}
}

// TestAllows: no models means every model; a listed model brings its
// adapters; a listed adapter only itself.
func TestAllows(t *testing.T) {
	tests := []struct {
		name        string
		key         *llmgwv1.ApiKey
		model, base string
		want        bool
	}{
		{"anonymous", nil, "demo", "", true},
		{"every model", key("a", "s"), "demo", "", true},
		{"listed", key("a", "s", "demo"), "demo", "", true},
		{"not listed", key("a", "s", "demo"), "chat", "", false},
		{"adapter of a listed model", key("a", "s", "demo"), "demo-sql", "demo", true},
		{"listed adapter", key("a", "s", "demo-sql"), "demo-sql", "demo", true},
		{"base of a listed adapter", key("a", "s", "demo-sql"), "demo", "", false},
		{"another adapter of the base", key("a", "s", "demo-sql"), "demo-chat", "demo", false},
		{"unknown name", key("a", "s", "demo"), "nope", "", false},
	}
	for _, tt := range tests {
		if got := Allows(tt.key, tt.model, tt.base); got != tt.want {
			t.Errorf("%s: Allows(%v, %q, %q) = %v, want %v", tt.name, tt.key.GetModels(), tt.model, tt.base, got, tt.want)
		}
	}
}

// TestSet: a put replaces a key of the same name (its old secret stops
// working), a clone is independent, a malformed hash matches nothing.
func TestSet(t *testing.T) {
	s := set(key("a", "one"))
	c := s.Clone()
	c.Put(key("a", "two"))
	c.Put(&llmgwv1.ApiKey{Name: "bad", SecretSha256: []byte("short")})
	if _, ok := c.Lookup("one"); ok {
		t.Error("the replaced secret still works")
	}
	if k, ok := c.Lookup("two"); !ok || k.Name != "a" {
		t.Error("the new secret does not work")
	}
	if _, ok := s.Lookup("one"); !ok {
		t.Error("changing a clone changed the original")
	}
	if c.Len() != 1 || len(c.Keys()) != 1 {
		t.Errorf("a key with a malformed hash was kept: %v", c.Keys())
	}
	var none *Set
	if _, ok := none.Lookup("one"); ok || none.Len() != 0 || none.Keys() != nil {
		t.Error("a nil set is not empty")
	}
	c.Delete("a")
	c.Delete("a")
	if _, ok := c.Lookup("two"); ok || c.Len() != 0 {
		t.Error("a deleted key still works")
	}
}
