package api

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/router/auth"
	"github.com/llmgw/llmgw/router/breaker"
	"github.com/llmgw/llmgw/router/endpoint"
	"github.com/llmgw/llmgw/router/scheduler"
)

// BenchmarkHandlerAPIKey is one chat request through the whole router
// handler (parse, key check, pick, proxy to an httptest engine over
// loopback, copy the answer back), with the key check off and on
// (docs/benchmarks.md, "Security"). The difference between the two is
// what API keys add to a request the router serves; the engine's answer
// is immediate, so the router's own cost is all there is to see.
func BenchmarkHandlerAPIKey(b *testing.B) {
	const secret = "sk-llmgw-0123456789abcdefghijklmnopqrstuvwxyzABCDEFG"
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13}}`)
	}))
	defer eng.Close()
	tb := &table{models: map[string][]*endpoint.Endpoint{"demo": {ep("demo-0", strings.TrimPrefix(eng.URL, "http://"))}}}
	keys := (*auth.Set)(nil).Clone()
	keys.Put(apiKey("bench", secret))
	body := `{"model":"demo","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say ok."}],"max_tokens":1}`

	for _, tt := range []struct {
		name string
		keys *auth.Set
		auth string
	}{
		{"keys=off", nil, ""},
		{"keys=on", keys, "Bearer " + secret},
	} {
		b.Run(tt.name, func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.Keys = func() *auth.Set { return tt.keys }
			br, err := breaker.NewSet(breaker.DefaultConfig(), func(k scheduler.Key) string { return k.ID }, nil)
			if err != nil {
				b.Fatal(err)
			}
			reg := prometheus.NewRegistry()
			h := New(cfg, tb, inOrder{}, br, slog.New(slog.DiscardHandler), reg, reg)
			defer h.Close()
			serve := func() *httptest.ResponseRecorder {
				req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				if tt.auth != "" {
					req.Header.Set("Authorization", tt.auth)
				}
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				return w
			}
			// Once outside the loop: a benchmark of 401s would measure nothing.
			if w := serve(); w.Code != http.StatusOK {
				b.Fatalf("status %d: %s", w.Code, w.Body)
			}
			b.ReportAllocs()
			for b.Loop() {
				serve()
			}
		})
	}
}
