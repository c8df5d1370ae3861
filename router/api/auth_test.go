package api

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/auth"
	"github.com/llmgw/llmgw/router/endpoint"
)

func apiKey(name, secret string, models ...string) *llmgwv1.ApiKey {
	h := sha256.Sum256([]byte(secret))
	return &llmgwv1.ApiKey{Name: name, SecretSha256: h[:], Models: models}
}

// keySource is the watch client's current key set, swapped by the test.
type keySource struct {
	cur      atomic.Pointer[auth.Set]
	required atomic.Bool
}

// set swaps the keys in; a key makes the cluster require keys, as the
// first key ever created does (fsm).
func (k *keySource) set(keys ...*llmgwv1.ApiKey) {
	s := (*auth.Set)(nil).Clone()
	for _, key := range keys {
		s.Put(key)
	}
	k.cur.Store(s)
	if len(keys) > 0 {
		k.required.Store(true)
	}
}

// authRouter serves tb with keys from src; the engine behind demo records
// the headers it got.
func authRouter(t *testing.T, src *keySource, require bool) (*httptest.Server, *prometheus.Registry, *headerLog) {
	t.Helper()
	seen := &headerLog{}
	eng := engine(t, func(w http.ResponseWriter, r *http.Request) {
		seen.add(r.Header.Clone())
		io.WriteString(w, `{}`)
	})
	tb := &table{
		models: map[string][]*endpoint.Endpoint{
			"demo": {ep("demo-0", eng)},
			"chat": {{ReplicaID: "chat-0", UID: 1, Model: "chat", Address: eng}},
		},
		adapters: map[string]endpoint.AdapterRef{"demo-sql": {Model: "demo"}, "demo-law": {Model: "demo", Index: 1}},
		list:     []*llmgwv1.Model{{Name: "chat"}, {Name: "demo", Adapters: []*llmgwv1.Adapter{{Name: "demo-sql"}, {Name: "demo-law"}}}},
	}
	tb.hold("demo-0", "demo-sql")
	tb.hold("demo-0", "demo-law")
	cfg := DefaultConfig()
	cfg.Keys = func() *auth.Set { return src.cur.Load() }
	cfg.RequireKey = require
	cfg.KeysRequired = src.required.Load
	reg := prometheus.NewRegistry()
	h := newHandler(t, cfg, tb, inOrder{}, breakers(t), slog.New(slog.DiscardHandler), reg)
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s, reg, seen
}

type headerLog struct {
	mu   sync.Mutex
	list []http.Header
}

func (l *headerLog) add(h http.Header) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.list = append(l.list, h)
}

func (l *headerLog) all() []http.Header {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]http.Header(nil), l.list...)
}

// TestAPIKeys: the router's key check over the handler — no key, a bad
// key, a good key, a model the key may not use (and adapters), a revoked
// key; probes stay open; metrics count by key name.
func TestAPIKeys(t *testing.T) {
	src := &keySource{}
	src.set(apiKey("team-a", "sk-a"), apiKey("team-b", "sk-b", "demo"), apiKey("team-c", "sk-c", "demo-sql"))
	srv, reg, _ := authRouter(t, src, false)
	tests := []struct {
		name, auth, model string
		status            int
		code              string
	}{
		{name: "no key", model: "demo", status: 401, code: "invalid_api_key"},
		{name: "bad key", auth: "Bearer sk-nope", model: "demo", status: 401, code: "invalid_api_key"},
		{name: "not bearer", auth: "sk-a", model: "demo", status: 401, code: "invalid_api_key"},
		{name: "good key", auth: "Bearer sk-a", model: "demo", status: 200},
		{name: "good key, any model", auth: "Bearer sk-a", model: "chat", status: 200},
		{name: "listed model", auth: "Bearer sk-b", model: "demo", status: 200},
		{name: "model not allowed", auth: "Bearer sk-b", model: "chat", status: 403, code: "model_not_allowed"},
		{name: "adapter of a listed model", auth: "Bearer sk-b", model: "demo-sql", status: 200},
		{name: "listed adapter", auth: "Bearer sk-c", model: "demo-sql", status: 200},
		{name: "base of a listed adapter", auth: "Bearer sk-c", model: "demo", status: 403, code: "model_not_allowed"},
		{name: "other adapter", auth: "Bearer sk-c", model: "demo-law", status: 403, code: "model_not_allowed"},
		{name: "unknown model, limited key", auth: "Bearer sk-b", model: "nope", status: 403, code: "model_not_allowed"},
		{name: "unknown model, open key", auth: "Bearer sk-a", model: "nope", status: 404, code: "model_not_found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hdr := map[string]string{}
			if tt.auth != "" {
				hdr["Authorization"] = tt.auth
			}
			resp := post(t, srv.URL+"/v1/chat/completions", `{"model":"`+tt.model+`"}`, hdr)
			if resp.StatusCode != tt.status {
				t.Fatalf("status = %d, want %d", resp.StatusCode, tt.status)
			}
			if tt.status == 200 {
				return
			}
			var body struct {
				Error struct{ Message, Type, Code string } `json:"error"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || body.Error.Code != tt.code || body.Error.Type != "invalid_request_error" {
				t.Fatalf("body = %+v (%v), want code %s", body, err, tt.code)
			}
			if tt.status == 401 && resp.Header.Get("WWW-Authenticate") != auth.Challenge {
				t.Errorf("401 without WWW-Authenticate: %v", resp.Header)
			}
			if strings.Contains(body.Error.Message, "sk-") {
				t.Errorf("the error repeats the presented key: %s", body.Error.Message)
			}
		})
	}

	t.Run("probes need no key", func(t *testing.T) {
		for _, p := range []string{"/healthz", "/readyz"} {
			resp, err := http.Get(srv.URL + p)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Errorf("GET %s = %d", p, resp.StatusCode)
			}
		}
	})
	t.Run("other /v1 paths need a key", func(t *testing.T) {
		resp := post(t, srv.URL+"/v1/embeddings", `{}`, nil)
		if resp.StatusCode != 401 {
			t.Fatalf("POST /v1/embeddings without a key = %d, want 401", resp.StatusCode)
		}
	})

	t.Run("revoked", func(t *testing.T) {
		src.set(apiKey("team-b", "sk-b", "demo"), apiKey("team-c", "sk-c", "demo-sql"))
		defer src.set(apiKey("team-a", "sk-a"), apiKey("team-b", "sk-b", "demo"), apiKey("team-c", "sk-c", "demo-sql"))
		if resp := post(t, srv.URL+"/v1/chat/completions", `{"model":"demo"}`, map[string]string{"Authorization": "Bearer sk-a"}); resp.StatusCode != 401 {
			t.Fatalf("revoked key: %d, want 401", resp.StatusCode)
		}
		if resp := post(t, srv.URL+"/v1/chat/completions", `{"model":"demo"}`, map[string]string{"Authorization": "Bearer sk-b"}); resp.StatusCode != 200 {
			t.Fatalf("a key beside the revoked one: %d, want 200", resp.StatusCode)
		}
	})

	t.Run("metrics by key", func(t *testing.T) {
		// The handler counts a request once it has answered, so a client
		// can hold its response before the count moves: wait for it.
		want := []struct {
			model, code, key string
			n                float64
			atLeast          bool
		}{{"_unknown", "401", "", 3, true}, {"demo", "200", "team-a", 1, false}, {"chat", "403", "team-b", 1, false}}
		for _, w := range want {
			testkit.WaitErr(t, testkit.DefaultTimeout, "the request count", func() error {
				got := testkit.Metric(t, reg, "llmgw_router_requests_total", testkit.Labels{"model": w.model, "code": w.code, "key": w.key})
				if got == w.n || (w.atLeast && got > w.n) {
					return nil
				}
				return fmt.Errorf(`requests{model=%q,code=%q,key=%q} = %v, want %v (at least: %v)`, w.model, w.code, w.key, got, w.n, w.atLeast)
			})
		}
	})
}

// TestAPIKeysModelList: /v1/models lists what the key may use: every
// model for an open key, a listed model with its adapters, a listed
// adapter alone.
func TestAPIKeysModelList(t *testing.T) {
	src := &keySource{}
	src.set(apiKey("open", "sk-open"), apiKey("demo", "sk-demo", "demo"), apiKey("sql", "sk-sql", "demo-sql"))
	srv, _, _ := authRouter(t, src, false)
	for secret, want := range map[string]string{
		"sk-open": "chat demo demo-sql demo-law",
		"sk-demo": "demo demo-sql demo-law",
		"sk-sql":  "demo-sql",
	} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/models", nil)
		req.Header.Set("Authorization", "Bearer "+secret)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var list modelList
		err = json.NewDecoder(resp.Body).Decode(&list)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range list.Data {
			ids = append(ids, m.ID)
		}
		if got := strings.Join(ids, " "); got != want {
			t.Errorf("%s lists %q, want %q", secret, got, want)
		}
	}
	resp, err := http.Get(srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("GET /v1/models without a key = %d, want 401", resp.StatusCode)
	}
}

// TestRequireAPIKey: with RequireKey, no key in the cluster means every
// request is refused; without it, the check is off and the engine gets
// the request.
// TestKeysRequiredByTheCluster: once the cluster requires keys (its first
// key ever), revoking the last one refuses every request.
func TestKeysRequiredByTheCluster(t *testing.T) {
	src := &keySource{}
	src.required.Store(true)
	srv, _, _ := authRouter(t, src, false)
	if resp := post(t, srv.URL+"/v1/chat/completions", `{"model":"demo"}`, nil); resp.StatusCode != 401 {
		t.Fatalf("no keys left, cluster requires them: %d, want 401", resp.StatusCode)
	}
}

func TestRequireAPIKey(t *testing.T) {
	for _, require := range []bool{true, false} {
		srv, _, _ := authRouter(t, &keySource{}, require)
		want := 200
		if require {
			want = 401
		}
		if resp := post(t, srv.URL+"/v1/chat/completions", `{"model":"demo"}`, map[string]string{"Authorization": "Bearer anything"}); resp.StatusCode != want {
			t.Errorf("require=%v, no keys: %d, want %d", require, resp.StatusCode, want)
		}
	}
}

// TestEngineNeverSeesTheAPIKey: an authenticated request reaches the engine
// without the client's Authorization or Cookie.
func TestEngineNeverSeesTheAPIKey(t *testing.T) {
	src := &keySource{}
	src.set(apiKey("team-a", "sk-a"))
	srv, _, seen := authRouter(t, src, false)
	resp := post(t, srv.URL+"/v1/chat/completions", `{"model":"demo"}`, map[string]string{"Authorization": "Bearer sk-a", "Cookie": "session=1", "X-Custom": "kept"})
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	got := seen.all()
	if len(got) != 1 {
		t.Fatalf("engine got %d requests, want 1", len(got))
	}
	if got[0].Get("Authorization") != "" || got[0].Get("Cookie") != "" || got[0].Get("X-Custom") != "kept" {
		t.Fatalf("engine headers: %v", got[0])
	}
}
