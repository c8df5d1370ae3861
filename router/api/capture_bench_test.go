package api

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/router/breaker"
	"github.com/llmgw/llmgw/router/capture"
	"github.com/llmgw/llmgw/router/endpoint"
	"github.com/llmgw/llmgw/router/scheduler"
)

// BenchmarkHandlerCapture is a chat completion through the whole handler
// with the traffic capture off and on (router/capture, design §10.1),
// side by side in one run: what recording a request costs the request
// path — building its record and handing it to the writer's queue; the
// writer's salting and writing run on its own goroutine, and are in the
// CPU the benchmark's process uses, not in the request's time. The prompt
// is 2 KB of text (32 chunks for tier 1's hashes).
func BenchmarkHandlerCapture(b *testing.B) {
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],`+
			`"usage":{"prompt_tokens":512,"completion_tokens":1,"total_tokens":513,"prompt_tokens_details":{"cached_tokens":256}}}`)
	}))
	defer eng.Close()
	tb := &table{models: map[string][]*endpoint.Endpoint{"demo": {ep("demo-0", strings.TrimPrefix(eng.URL, "http://"))}}}
	body := `{"model":"demo","max_tokens":1,"messages":[{"role":"user","content":"` + strings.Repeat("the router forwards each request. ", 62) + `"}]}`
	for _, on := range []bool{false, true} {
		name := "off"
		if on {
			name = "on"
		}
		b.Run(name, func(b *testing.B) {
			cfg := DefaultConfig()
			if on {
				w, err := capture.New(capture.Config{Path: filepath.Join(b.TempDir(), "cap.jsonl")}, slog.New(slog.DiscardHandler), capture.Metrics{}, nil)
				if err != nil {
					b.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- w.Run(ctx) }()
				defer func() {
					cancel()
					if err := <-done; err != nil {
						b.Error(err)
					}
				}()
				cfg.Capture = w
			}
			br, err := breaker.NewSet(breaker.DefaultConfig(), func(k scheduler.Key) string { return k.ID }, nil)
			if err != nil {
				b.Fatal(err)
			}
			h := newHandler(b, cfg, tb, inOrder{}, br, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
			s := httptest.NewServer(h)
			defer s.Close()
			client := s.Client()
			do := func() int {
				resp, err := client.Post(s.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				defer resp.Body.Close()
				_, _ = io.Copy(io.Discard, resp.Body)
				return resp.StatusCode
			}
			if code := do(); code != http.StatusOK {
				b.Fatalf("status %d", code)
			}
			b.ReportAllocs()
			for b.Loop() {
				do()
			}
		})
	}
}
