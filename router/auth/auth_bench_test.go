package auth

import (
	"fmt"
	"net/http"
	"testing"
)

// BenchmarkCheck is the per-request cost of the API key check
// (docs/benchmarks.md, "Security"): off (no keys, not required), a valid
// key among 1 and among 1000 (a map lookup by hash, so the count should not
// matter), an unknown key and no key at all (both refused). A valid check
// is one SHA-256 of a ~52-byte secret, a map lookup and a constant-time
// compare.
func BenchmarkCheck(b *testing.B) {
	const secret = "sk-llmgw-0123456789abcdefghijklmnopqrstuvwxyzABCDEFG"
	many := set(key("bench", secret))
	for i := range 999 {
		many.Put(key(fmt.Sprintf("k%d", i), fmt.Sprintf("sk-llmgw-%043d", i)))
	}
	bearer := func(s string) http.Header { return http.Header{"Authorization": {"Bearer " + s}} }
	tests := []struct {
		name    string
		keys    *Set
		require bool
		h       http.Header
		wantKey bool
	}{
		{"off", nil, false, bearer(secret), false},
		{"valid/1key", set(key("bench", secret)), true, bearer(secret), true},
		{"valid/1000keys", many, true, bearer(secret), true},
		{"unknown/1000keys", many, true, bearer("sk-llmgw-not-a-key-of-this-cluster-at-all-000000000"), false},
		{"missing/1000keys", many, true, http.Header{}, false},
	}
	for _, tt := range tests {
		b.Run(tt.name, func(b *testing.B) {
			// Once outside the loop, so the benchmark measures what it says.
			refused := !tt.wantKey && tt.name != "off"
			if k, err := Check(tt.keys, tt.require, tt.h); (k != nil) != tt.wantKey || (err != nil) != refused {
				b.Fatalf("key %v, error %v; want a key %v, refused %v", k, err, tt.wantKey, refused)
			}
			b.ReportAllocs()
			for b.Loop() {
				Check(tt.keys, tt.require, tt.h)
			}
		})
	}
}
