package api

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/internal/testkit"
	"github.com/llmgw/llmgw/router/auth"
	"github.com/llmgw/llmgw/router/endpoint"
)

// slowUpload opens a request for key that sends its headers and half its
// body, and holds the rest until the test ends: an upload in progress.
func slowUpload(t *testing.T, addr, key string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	body := `{"model":"demo","messages":[]}`
	auth := ""
	if key != "" {
		auth = "Authorization: Bearer " + key + "\r\n"
	}
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		auth, len(body), body[:len(body)/2])
}

// TestCallerInflight: a caller — an API key, or a client address while keys
// are not required — holds at most MaxKeyInflight requests, its uploads in
// progress included; past them it gets 429 with Retry-After and OpenAI's
// rate-limit body naming the bound, counted by key, while other callers are
// served. A place is given back when its request ends.
func TestCallerInflight(t *testing.T) {
	const limit = 3
	eng := engine(t, func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, `{}`) })
	tb := &table{models: map[string][]*endpoint.Endpoint{"demo": {ep("demo-0", eng)}}}
	src := &keySource{}
	src.set(apiKey("greedy", "sk-greedy"), apiKey("other", "sk-other"))
	chatAs := func(t *testing.T, url, key string) *http.Response {
		t.Helper()
		hdr := map[string]string{}
		if key != "" {
			hdr["Authorization"] = "Bearer " + key
		}
		return post(t, url+"/v1/chat/completions", `{"model":"demo","messages":[]}`, hdr)
	}
	// full serves the handler (with keys, or without) and fills key's
	// places with uploads in progress: its next request is refused, with a
	// message naming who.
	full := func(t *testing.T, withKeys bool, key, who string) (*httptest.Server, *prometheus.Registry) {
		t.Helper()
		cfg := DefaultConfig()
		cfg.MaxKeyInflight = limit
		if withKeys {
			cfg.Keys = func() *auth.Set { return src.cur.Load() }
		}
		reg := prometheus.NewRegistry()
		h := newHandler(t, cfg, tb, inOrder{}, breakers(t), slog.New(slog.DiscardHandler), reg)
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		for range limit {
			slowUpload(t, strings.TrimPrefix(srv.URL, "http://"), key)
		}
		// The uploads first: a request sent while one of them is not yet
		// counted would take its place, and that upload would be the one
		// refused.
		testkit.Wait(t, fmt.Sprintf("%s's %d uploads holding its places", who, limit), func() bool {
			h.callers.mu.Lock()
			defer h.callers.mu.Unlock()
			for c, n := range h.callers.held {
				if c.describe() == who && n == limit {
					return true
				}
			}
			return false
		})
		testkit.Wait(t, who+"'s next request to be refused once its uploads hold its places", func() bool {
			resp := chatAs(t, srv.URL, key)
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode == http.StatusTooManyRequests && strings.Contains(string(b), who)
		})
		return srv, reg
	}

	t.Run("keys", func(t *testing.T) {
		srv, reg := full(t, true, "sk-greedy", "the API key greedy")
		var body struct {
			Error struct{ Message, Type, Code string } `json:"error"`
		}
		resp := chatAs(t, srv.URL, "sk-greedy")
		err := json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 429 || body.Error.Code != "rate_limit_exceeded" || body.Error.Type != "requests" ||
			!strings.Contains(body.Error.Message, "the API key greedy already has 3 requests in flight") || !strings.Contains(body.Error.Message, "max_key_inflight") {
			t.Fatalf("%d %+v (%v), want 429 rate_limit_exceeded naming the key and the bound", resp.StatusCode, body, err)
		}
		if resp.Header.Get("Retry-After") != "1" || !resp.Close {
			t.Errorf("429 headers %v (close %v), want Retry-After 1 and Connection: close (the body is not read)", resp.Header, resp.Close)
		}
		if got := chatAs(t, srv.URL, "sk-other"); got.StatusCode != 200 {
			t.Fatalf("another key: %d, want 200 beside the greedy key's uploads", got.StatusCode)
		} else {
			got.Body.Close()
		}
		if n := testkit.Metric(t, reg, "llmgw_router_caller_limited_total", testkit.Labels{"key": "greedy"}); n < 2 {
			t.Errorf("llmgw_router_caller_limited_total{key=greedy} = %v, want at least 2", n)
		}
		if n := testkit.Metric(t, reg, "llmgw_router_requests_total", testkit.Labels{"key": "greedy", "code": "429", "model": "_unknown"}); n < 2 {
			t.Errorf("llmgw_router_requests_total{key=greedy,code=429} = %v, want at least 2", n)
		}
	})

	t.Run("addresses without keys", func(t *testing.T) {
		full(t, false, "", "the client address 127.0.0.1")
	})

	t.Run("places are given back", func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.MaxKeyInflight = limit
		cfg.Keys = func() *auth.Set { return src.cur.Load() }
		srv := httptest.NewServer(newHandler(t, cfg, tb, inOrder{}, breakers(t), slog.New(slog.DiscardHandler), prometheus.NewRegistry()))
		t.Cleanup(srv.Close)
		client := &http.Client{Timeout: 10 * time.Second}
		for i := range 3 * limit {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"demo","messages":[]}`))
			req.Header.Set("Authorization", "Bearer sk-greedy")
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("request %d one after another: %d, want 200", i, resp.StatusCode)
			}
		}
	})
}

// TestCallersUnbounded: MaxKeyInflight 0 takes no place at all.
func TestCallersUnbounded(t *testing.T) {
	c := newCallers(0, nil)
	for range 10 {
		if err := c.acquire(caller{key: "k"}); err != nil {
			t.Fatal(err)
		}
	}
	if len(c.held) != 0 {
		t.Fatalf("held %v with no bound", c.held)
	}
}
