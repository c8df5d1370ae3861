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
	eng := okEngine()
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
			h := newHandler(b, cfg, tb, inOrder{}, br, slog.New(slog.DiscardHandler), reg)
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

// okEngine is an engine stand-in that answers every chat at once, with
// its usage: the router's own cost is all a benchmark over it sees.
func okEngine() *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13}}`)
	}))
}

// BenchmarkServeStream is one streamed chat request (32 tokens, each its
// own SSE event, flushed) from a keep-alive HTTP/1.1 client through the
// router handler to an httptest engine and back, with the API served over
// HTTP and HTTPS, keys off and on (docs/benchmarks.md, "Security"). The
// connection is made once, outside the loop: this is the per-request cost
// of TLS records on a connection already open (the handshake is
// BenchmarkConnect in internal/mtls), 34 records out for 34 events.
func BenchmarkServeStream(b *testing.B) {
	const secret = "sk-llmgw-0123456789abcdefghijklmnopqrstuvwxyzABCDEFG"
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
		f.Flush()
		for range 32 {
			_, _ = io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" token\"}}]}\n\n")
			f.Flush()
		}
		_, _ = io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":32,\"total_tokens\":44}}\n\ndata: [DONE]\n\n")
	}))
	defer eng.Close()
	tb := &table{models: map[string][]*endpoint.Endpoint{"demo": {ep("demo-0", strings.TrimPrefix(eng.URL, "http://"))}}}
	keys := (*auth.Set)(nil).Clone()
	keys.Put(apiKey("bench", secret))
	body := `{"model":"demo","stream":true,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say ok."}],"max_tokens":32}`

	for _, scheme := range []string{"http", "https"} {
		for _, on := range []bool{false, true} {
			name := scheme + "/keys=off"
			if on {
				name = scheme + "/keys=on"
			}
			b.Run(name, func(b *testing.B) {
				cfg := DefaultConfig()
				cfg.Keys = func() *auth.Set {
					if on {
						return keys
					}
					return nil
				}
				br, err := breaker.NewSet(breaker.DefaultConfig(), func(k scheduler.Key) string { return k.ID }, nil)
				if err != nil {
					b.Fatal(err)
				}
				reg := prometheus.NewRegistry()
				h := newHandler(b, cfg, tb, inOrder{}, br, slog.New(slog.DiscardHandler), reg)
				s := httptest.NewUnstartedServer(h)
				if scheme == "https" {
					s.StartTLS() // HTTP/1.1 only: EnableHTTP2 is false
				} else {
					s.Start()
				}
				defer s.Close()
				client := s.Client()
				do := func() (int, int64) {
					req, err := http.NewRequest(http.MethodPost, s.URL+"/v1/chat/completions", strings.NewReader(body))
					if err != nil {
						b.Fatal(err)
					}
					req.Header.Set("Content-Type", "application/json")
					if on {
						req.Header.Set("Authorization", "Bearer "+secret)
					}
					resp, err := client.Do(req)
					if err != nil {
						b.Fatal(err)
					}
					defer resp.Body.Close()
					n, err := io.Copy(io.Discard, resp.Body)
					if err != nil {
						b.Fatal(err)
					}
					return resp.StatusCode, n
				}
				if code, n := do(); code != http.StatusOK || n == 0 {
					b.Fatalf("status %d, %d bytes", code, n)
				}
				b.ReportAllocs()
				for b.Loop() {
					do()
				}
			})
		}
	}
}
