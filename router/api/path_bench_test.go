package api

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/router/breaker"
	"github.com/llmgw/llmgw/router/endpoint"
	"github.com/llmgw/llmgw/router/scheduler"
)

// BenchmarkRequestPath is the router's data path as scripts/bench-proxy.sh
// loads it, in-process: a keep-alive client, the whole handler (request
// id, key check, decode and sniff, resolve, prepare, schedule, proxy,
// metrics) with an info-level JSON logger as `llmgw router` runs, an
// engine over loopback answering at once with a canned ~1 KB chat
// completion or an 8-chunk stream, and the answer copied back. The
// engine and client are the same in every run, so differences between
// builds are the router's (docs/benchmarks.md, issue 15).
func BenchmarkRequestPath(b *testing.B) {
	content := strings.Repeat("The llmgw router forwards each request to the replica its scheduling profile chooses. ", 9)[:760]
	whole := `{"id":"chatcmpl-bench","object":"chat.completion","created":1764547200,"model":"demo","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		content + `"},"finish_reason":"stop","logprobs":null}],"usage":{"prompt_tokens":12,"completion_tokens":160,"total_tokens":172}}`
	var sse strings.Builder
	for i := range 8 {
		sse.WriteString(`data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1764547200,"model":"demo","choices":[{"index":0,"delta":{"content":"` +
			content[i*95:(i+1)*95] + `"},"finish_reason":null}]}` + "\n\n")
	}
	sse.WriteString(`data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1764547200,"model":"demo","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":160,"total_tokens":172}}` + "\n\ndata: [DONE]\n\n")
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Header.Get("X-Bench-Stream") == "1" {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, sse.String())
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, whole)
	}))
	defer eng.Close()
	tb := &table{models: map[string][]*endpoint.Endpoint{"demo": {ep("demo-0", strings.TrimPrefix(eng.URL, "http://"))}}}
	for _, c := range []struct{ stream, baseline bool }{{false, false}, {false, true}, {true, false}, {true, true}} {
		stream, baseline := c.stream, c.baseline
		name, body := "chat", `{"model":"demo","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello"}],"max_tokens":160}`
		if stream {
			name, body = "chat-stream", `{"model":"demo","stream":true,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello"}],"max_tokens":160}`
		}
		if baseline {
			name += "/httputil"
		} else {
			name += "/router"
		}
		b.Run(name, func(b *testing.B) {
			reg := prometheus.NewRegistry()
			br, err := breaker.NewSet(breaker.DefaultConfig(), func(k scheduler.Key) string { return k.ID }, nil)
			if err != nil {
				b.Fatal(err)
			}
			h := newHandler(b, DefaultConfig(), tb, inOrder{}, br, slog.New(slog.NewJSONHandler(io.Discard, nil)), reg) //nolint:sloglint // the JSON handler, as llmgw router runs, is part of what is measured
			var srv http.Handler = h
			if baseline {
				// The plainest Go reverse proxy, over the same engine
				// (scripts/bench-proxy's): the floor for the router.
				u, _ := url.Parse(eng.URL)
				rp := httputil.NewSingleHostReverseProxy(u)
				rp.Transport = &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}
				srv = rp
			}
			s := httptest.NewServer(srv)
			defer s.Close()
			client := s.Client()
			do := func() (int, int64) {
				req, err := http.NewRequest(http.MethodPost, s.URL+"/v1/chat/completions", strings.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				req.Header.Set("Content-Type", "application/json")
				if stream {
					req.Header.Set("X-Bench-Stream", "1")
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
			if code, n := do(); code != http.StatusOK || n < 1000 {
				b.Fatalf("status %d, %d bytes", code, n)
			}
			b.ReportAllocs()
			for b.Loop() {
				do()
			}
		})
	}
}
