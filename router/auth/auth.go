// Package auth checks the router's API keys (design §11): which key, if
// any, a request presents, and whether that key may use a model. The keys
// come from the replicated state through the watch stream, as SHA-256
// hashes of their secrets; the secrets themselves exist only with whoever
// llmgwctl printed them to.
//
// Rules:
//   - The check is on while the cluster requires keys (its
//     api_keys_required, which the first key ever created sets), or always
//     with --require-api-key: a request without a valid key is refused.
//     Revoking the last key then refuses every request rather than open
//     the router to everyone; only an admin's `llmgwctl apikey require
//     off` (fsm SET_API_KEYS_REQUIRED) turns it off. While it is off a
//     request without a key is anonymous and allowed, and one presenting
//     a Bearer key while keys exist is still checked: a wrong key is 401,
//     a right one carries its model limits.
//   - A request presents `Authorization: Bearer SECRET`, or `x-api-key:
//     SECRET` as Anthropic's SDKs and Claude Code send it (with
//     anthropic-version beside it, which the router passes on to the
//     engine and otherwise ignores); the Bearer credential wins when a
//     request has both. The router hashes
//     the secret, finds the key by hash and compares the two hashes with
//     subtle.ConstantTimeCompare. Finding it through a map leaks nothing
//     worth having: the caller chose what was hashed, and learning whether
//     a SHA-256 output is near a stored one is no step towards a secret of
//     256 random bits.
//   - A key with no models may use every model. A key that lists a model
//     may use it and every adapter of it; a key that lists an adapter may
//     use that adapter only (adapters share the `model` namespace, design
//     §4). The names are checked before the model is resolved, so a key
//     cannot make the control plane load an adapter it may not use, and a
//     refused name answers 403 whether it exists or not.
package auth

import (
	"cmp"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/openai"
)

// Set is the router API keys known at one revision, by name and by hash.
// A nil *Set is empty. A Set that readers may hold is never changed: the
// watch client changes a Clone and publishes that.
type Set struct {
	byName map[string]*llmgwv1.ApiKey
	byHash map[[sha256.Size]byte]*llmgwv1.ApiKey
}

// Clone returns a copy that can be changed without touching s.
func (s *Set) Clone() *Set {
	c := &Set{byName: map[string]*llmgwv1.ApiKey{}, byHash: map[[sha256.Size]byte]*llmgwv1.ApiKey{}}
	if s != nil {
		c.byName = maps.Clone(s.byName)
		c.byHash = maps.Clone(s.byHash)
	}
	return c
}

// Put adds k or replaces the key of the same name. A hash that is not 32
// bytes can match no request; such a key is dropped (the control plane
// never stores one).
func (s *Set) Put(k *llmgwv1.ApiKey) {
	s.Delete(k.GetName())
	if len(k.GetSecretSha256()) != sha256.Size {
		return
	}
	s.byName[k.GetName()] = k
	s.byHash[[sha256.Size]byte(k.GetSecretSha256())] = k
}

// Delete removes the named key, if present.
func (s *Set) Delete(name string) {
	old, ok := s.byName[name]
	if !ok {
		return
	}
	delete(s.byName, name)
	h := [sha256.Size]byte(old.GetSecretSha256())
	if s.byHash[h] == old {
		delete(s.byHash, h)
	}
}

// Len is the number of keys.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.byName)
}

// Keys returns the keys sorted by name.
func (s *Set) Keys() []*llmgwv1.ApiKey {
	if s == nil {
		return nil
	}
	out := slices.Collect(maps.Values(s.byName))
	slices.SortFunc(out, func(a, b *llmgwv1.ApiKey) int { return cmp.Compare(a.GetName(), b.GetName()) })
	return out
}

// Lookup returns the key whose secret this is.
func (s *Set) Lookup(secret string) (*llmgwv1.ApiKey, bool) {
	if s.Len() == 0 || secret == "" {
		return nil, false
	}
	h := sha256.Sum256([]byte(secret))
	k := s.byHash[h]
	if k == nil || subtle.ConstantTimeCompare(k.GetSecretSha256(), h[:]) != 1 {
		return nil, false
	}
	return k, true
}

// Check returns the key a request's headers present: nil with no error
// for an anonymous request while the check is off (require false: no
// Bearer key presented, or no key exists); an error, in OpenAI's shape,
// when the request presents no key while it is on, or an unknown one. The
// message never repeats what was presented.
func Check(keys *Set, require bool, h http.Header) (*llmgwv1.ApiKey, *openai.Error) {
	secret, ok := presented(h)
	if !require && (!ok || keys.Len() == 0) {
		return nil, nil
	}
	if !ok {
		return nil, Unauthorized(noKey)
	}
	k, ok := keys.Lookup(secret)
	if !ok {
		return nil, Unauthorized(badKey)
	}
	return k, nil
}

// APIKeyHeader is Anthropic's credential header.
const APIKeyHeader = "X-Api-Key"

// presented is the secret a request presents: its Bearer credential, else
// its x-api-key.
func presented(h http.Header) (string, bool) {
	if s, ok := bearer(h.Get("Authorization")); ok {
		return s, true
	}
	s := strings.TrimSpace(h.Get(APIKeyHeader))
	return s, s != ""
}

// The two 401 messages: fixed texts, never what was presented.
const (
	noKey  = "no API key given: send it as Authorization: Bearer KEY (or x-api-key: KEY)"
	badKey = "the API key given is not valid"
)

// bearer reads the token of an RFC 6750 Bearer credential; the scheme is
// case-insensitive.
func bearer(v string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(v), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// Allows reports whether key may use name, which resolves to base when it
// is an adapter (base is "" for a model or an unknown name). A nil key
// (the check is off) and a key with no models may use everything.
func Allows(key *llmgwv1.ApiKey, name, base string) bool {
	if key == nil || len(key.GetModels()) == 0 {
		return true
	}
	return slices.Contains(key.GetModels(), name) || (base != "" && slices.Contains(key.GetModels(), base))
}

// Unauthorized is the 401 for a missing or unknown key, as OpenAI sends
// it; the caller adds WWW-Authenticate (Challenge).
func Unauthorized(msg string) *openai.Error {
	return &openai.Error{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key", Message: msg}
}

// Forbidden is the 403 for a model the key may not use.
func Forbidden(model string) *openai.Error {
	return &openai.Error{Status: http.StatusForbidden, Type: "invalid_request_error", Code: "model_not_allowed", Param: "model",
		Message: fmt.Sprintf("this API key may not use the model %q", model)}
}

// Challenge is the WWW-Authenticate value a 401 carries (RFC 6750).
const Challenge = `Bearer realm="llmgw"`
