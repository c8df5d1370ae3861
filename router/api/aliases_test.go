package api

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/director"
	"github.com/llmgw/llmgw/router/endpoint"
)

// modelRecorder is an engine that answers with code and body and keeps the
// `model` of each request it got.
type modelRecorder struct {
	mu     sync.Mutex
	models []string
}

func (rc *modelRecorder) engine(t *testing.T, code int, body string) string {
	return engine(t, func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Model string }
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &req)
		rc.mu.Lock()
		rc.models = append(rc.models, req.Model)
		rc.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		io.WriteString(w, body)
	})
}

func (rc *modelRecorder) got() []string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]string(nil), rc.models...)
}

// TestAliasFallbackThroughTheRouter (design §7.9): a request naming an
// alias reaches its target under the target's name; the target's
// context-length refusal never reaches the client, the fallback's answer
// does, counted by target; an alias with nothing left to fall back on
// passes the engine's refusal on as it came; /v1/models lists aliases as
// models of llmgw, and /v1/models/{alias} is its card.
func TestAliasFallbackThroughTheRouter(t *testing.T) {
	var short, long, busy modelRecorder
	ctxErr := `{"object":"error","message":"This model's maximum context length is 2048 tokens. However, your request has 3000 input tokens. Please reduce the length of the input messages.","type":"BadRequestError","param":null,"code":400}`
	mk := func(id, model, addr string) *endpoint.Endpoint {
		return &endpoint.Endpoint{ReplicaID: id, UID: 1, Model: model, Address: addr}
	}
	tb := &table{
		models: map[string][]*endpoint.Endpoint{
			"short": {mk("short-0", "short", short.engine(t, http.StatusBadRequest, ctxErr))},
			"long":  {mk("long-0", "long", long.engine(t, http.StatusOK, `{"model":"long","choices":[]}`))},
			"busy":  {mk("busy-0", "busy", busy.engine(t, http.StatusTooManyRequests, `{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}`))},
		},
		list:   []*llmgwv1.Model{{Name: "busy", CreatedUnix: 3}, {Name: "long", CreatedUnix: 2}, {Name: "short", CreatedUnix: 1}},
		maxLen: map[string]int{"short": 2048, "long": 32768},
	}
	aliases := map[string]*llmgwv1.Alias{
		"chat": {Name: "chat", Targets: []*llmgwv1.AliasTarget{{Target: "short", Weight: 9}, {Target: "long", Weight: 0}}, Fallbacks: []string{"long"}},
		"only": {Name: "only", Targets: []*llmgwv1.AliasTarget{{Target: "busy", Weight: 1}}},
	}
	cfg := DefaultConfig()
	cfg.Aliases = func() map[string]*llmgwv1.Alias { return aliases }
	reg := prometheus.NewRegistry()
	h := newHandler(t, cfg, tb, inOrder{}, breakers(t), slog.New(slog.DiscardHandler), reg,
		director.WithAliases(cfg.Aliases, nil))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	resp := post(t, srv.URL+"/v1/chat/completions", `{"model":"chat","messages":[{"role":"user","content":"a long prompt"}]}`, nil)
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(b) != `{"model":"long","choices":[]}` || resp.Header.Get("X-Llmgw-Replica") != "long-0" {
		t.Fatalf("chat: %d %s (replica %s), want long's answer", resp.StatusCode, b, resp.Header.Get("X-Llmgw-Replica"))
	}
	if s, l := short.got(), long.got(); len(s) != 1 || s[0] != "short" || len(l) != 1 || l[0] != "long" {
		t.Fatalf("engines got models %v and %v, want each its own name once", s, l)
	}
	for _, m := range []struct {
		name   string
		labels testkit.Labels
	}{
		{"llmgw_router_alias_requests_total", testkit.Labels{"alias": "chat", "target": "short"}},
		{"llmgw_router_alias_fallbacks_total", testkit.Labels{"alias": "chat", "target": "short", "reason": "context_length"}},
		{"llmgw_router_alias_served_total", testkit.Labels{"alias": "chat", "target": "long", "code": "200"}},
		{"llmgw_router_requests_total", testkit.Labels{"model": "long", "code": "200", "key": ""}},
	} {
		if n := testkit.Metric(t, reg, m.name, m.labels); n != 1 {
			t.Errorf("%s%v = %v, want 1", m.name, m.labels, n)
		}
	}

	// Nothing to fall back on: the engine's own answer, as it came.
	resp = post(t, srv.URL+"/v1/chat/completions", `{"model":"only","messages":[]}`, nil)
	b, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusTooManyRequests || string(b) != `{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}` {
		t.Fatalf("only: %d %s, want busy's 429 as sent", resp.StatusCode, b)
	}

	get := func(path string) (int, []byte) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	code, b := get("/v1/models")
	var list struct {
		Data []modelEntry `json:"data"`
	}
	if code != http.StatusOK || json.Unmarshal(b, &list) != nil || len(list.Data) != 5 {
		t.Fatalf("/v1/models: %d %s", code, b)
	}
	chat, only := list.Data[3], list.Data[4]
	if chat.ID != "chat" || chat.OwnedBy != "llmgw" || chat.Root != "short" || chat.Created != 1 || chat.Parent != nil ||
		chat.MaxModelLen == nil || *chat.MaxModelLen != 2048 {
		t.Fatalf("chat's card %+v: want root short (the heaviest target), its created, max_model_len the least (2048)", chat)
	}
	if only.ID != "only" || only.Root != "busy" || only.MaxModelLen != nil {
		t.Fatalf("only's card %+v: want root busy and max_model_len null (busy's unknown)", only)
	}
	if code, b := get("/v1/models/chat"); code != http.StatusOK || !json.Valid(b) {
		t.Fatalf("/v1/models/chat: %d %s", code, b)
	}
}
