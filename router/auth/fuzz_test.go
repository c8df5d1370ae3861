package auth

import (
	"crypto/sha256"
	"net/http"
	"strings"
	"testing"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// FuzzCheck feeds Check any Authorization header, the one input of a
// router that an anonymous client controls before anything else runs: it
// never panics, accepts exactly the one valid secret, and its error never
// repeats what was presented (a 401 must not echo a leaked or mistyped
// key into logs or a proxy's error page).
func FuzzCheck(f *testing.F) {
	const secret = "sk-llmgw-valid-secret-0123456789"
	h := sha256.Sum256([]byte(secret))
	keys := (*Set)(nil).Clone()
	keys.Put(&llmgwv1.ApiKey{Name: "k", SecretSha256: h[:]})
	for _, s := range []string{"", "Bearer " + secret, "bearer  " + secret + " ", "Basic abc", "Bearer", "Bearer sk-llmgw-other-guess-01234567", "\x00\xff Bearer x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		hdr := http.Header{}
		hdr.Set("Authorization", v)
		k, aerr := Check(keys, true, hdr)
		scheme, token, _ := strings.Cut(strings.TrimSpace(hdr.Get("Authorization")), " ")
		valid := strings.EqualFold(scheme, "Bearer") && strings.TrimSpace(token) == secret
		// The same value as Anthropic's x-api-key: valid when it is the
		// secret, spaces aside.
		xh := http.Header{}
		xh.Set("X-Api-Key", v)
		if xk, xerr := Check(keys, true, xh); (xk != nil) != (strings.TrimSpace(xh.Get("X-Api-Key")) == secret) ||
			(xerr != nil && xerr.Message != noKey && xerr.Message != badKey) {
			t.Fatalf("Check(x-api-key %q) = %v, %v", v, xk, xerr)
		}
		if valid != (k != nil) || (aerr == nil) != (k != nil) {
			t.Fatalf("Check(%q) = %v, %v; valid %v", v, k, aerr, valid)
		}
		// The message is one of two fixed texts, so it cannot carry
		// anything presented.
		if aerr != nil && aerr.Message != noKey && aerr.Message != badKey {
			t.Fatalf("Check(%q): unexpected message %q", v, aerr.Message)
		}
	})
}
