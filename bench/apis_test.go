package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestAgentSessionGrowsWithTheRealAnswers(t *testing.T) {
	w := mustWorkload(t, WorkloadConfig{Name: AgentSession, Model: "m", Seed: 3})
	if w.Live() != 8 {
		t.Fatalf("Live = %d, want the default 8 sessions", w.Live())
	}
	ids := map[string]bool{}
	for n := range 3 {
		reqs := drain(w, n)
		if len(reqs) != 30 {
			t.Fatalf("session %d: %d turns, want 30", n, len(reqs))
		}
		id := reqs[0].SessionID
		if id == "" || ids[id] {
			t.Fatalf("session %d: id %q empty or shared with another session", n, id)
		}
		ids[id] = true
		for i, r := range reqs {
			if r.SessionID != id {
				t.Fatalf("session %d turn %d: id %q, want %q throughout", n, i, r.SessionID, id)
			}
			if len(r.Messages) != 2+2*i {
				t.Fatalf("session %d turn %d: %d messages, want %d", n, i, len(r.Messages), 2+2*i)
			}
			if m := r.Messages[0]; m.Role != "system" || len(strings.Fields(m.Content)) != 1000 {
				t.Fatalf("turn %d: first message %s of %d words, want the 1000-word system prompt", i, m.Role, len(strings.Fields(m.Content)))
			}
			last := r.Messages[len(r.Messages)-1]
			wantPrefix := "Task: "
			if i > 0 {
				wantPrefix = fmt.Sprintf("Tool output (step %d):\n", i)
				// The whole previous request is resent, then the answer it got.
				prev := reqs[i-1].Messages
				if !reflect.DeepEqual(r.Messages[:len(prev)], prev) {
					t.Fatalf("turn %d does not resend turn %d's prompt", i, i-1)
				}
				if a := r.Messages[len(prev)]; a.Role != "assistant" || a.Content != "answer "+strings.Repeat("x", i-1) {
					t.Fatalf("turn %d: %+v after the history, want turn %d's answer", i, a, i-1)
				}
			}
			if last.Role != "user" || !strings.HasPrefix(last.Content, wantPrefix) || len(strings.Fields(last.Content)) < 60 {
				t.Fatalf("turn %d: last message %s %.40q, want a user turn starting %q with 60 words", i, last.Role, last.Content, wantPrefix)
			}
		}
	}
	// Every session shares the system prompt, the prefix an agent fleet shares.
	if a, b := drain(w, 0)[0].Messages[0], drain(w, 1)[0].Messages[0]; a != b {
		t.Fatal("two sessions have different system prompts")
	}
}

func TestEncodeBodyPerAPI(t *testing.T) {
	req := Request{Model: "m", MaxTokens: 7, SessionID: "s", Messages: []Message{
		{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"},
		{Role: "assistant", Content: "hello"}, {Role: "user", Content: "again"},
	}}
	tests := []struct {
		api, path, want string
	}{
		{APIChat, "/v1/chat/completions", `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":"again"}],"max_tokens":7,"stream":true,"stream_options":{"include_usage":true}}`},
		{"", "/v1/chat/completions", `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":"again"}],"max_tokens":7,"stream":true,"stream_options":{"include_usage":true}}`},
		{APIMessages, "/v1/messages", `{"model":"m","system":"be brief","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]},{"role":"assistant","content":[{"type":"text","text":"hello"}]},{"role":"user","content":[{"type":"text","text":"again"}]}],"max_tokens":7,"stream":true}`},
		{APIResponses, "/v1/responses", `{"model":"m","input":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":"again"}],"max_output_tokens":7,"stream":true,"store":false}`},
	}
	for _, tt := range tests {
		t.Run(tt.api, func(t *testing.T) {
			raw, err := encodeBody(tt.api, req)
			if err != nil {
				t.Fatal(err)
			}
			if string(raw) != tt.want {
				t.Fatalf("body\n%s\nwant\n%s", raw, tt.want)
			}
			if p := apiPath(tt.api); p != tt.path {
				t.Fatalf("path %s, want %s", p, tt.path)
			}
		})
	}
	// Messages requires max_tokens: a request without one gets the default.
	raw, _ := encodeBody(APIMessages, Request{Model: "m", Messages: []Message{{Role: "user", Content: "x"}}})
	if !strings.Contains(string(raw), `"max_tokens":128`) || strings.Contains(string(raw), `"system"`) {
		t.Fatalf("Messages body without max_tokens or system: %s", raw)
	}
}

// Streams as vLLM sends them, for each API.
const (
	messagesStream = `event: message_start
data: {"type":"message_start","message":{"id":"m1","content":[],"model":"m","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":50,"output_tokens":0}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"b"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"input_tokens":18,"output_tokens":2,"cache_read_input_tokens":32,"cache_creation_input_tokens":0}}

event: message_stop
data: {"type":"message_stop"}

`
	responsesStream = `event: response.created
data: {"type":"response.created","sequence_number":0,"response":{"id":"r1","status":"in_progress"}}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":4,"delta":"a"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":5,"delta":"b"}

event: response.completed
data: {"type":"response.completed","sequence_number":9,"response":{"id":"r1","status":"incomplete","usage":{"input_tokens":50,"input_tokens_details":{"cached_tokens":32},"output_tokens":2,"total_tokens":52}}}

`
)

func TestReadStreamPerAPI(t *testing.T) {
	tests := []struct {
		name, api, body string
		wantErr         error
		answer          string
		prompt, cached  int
		usage           bool
	}{
		{"messages", APIMessages, messagesStream, nil, "ab", 50, 32, true},
		{"messages without cache details", APIMessages, strings.Replace(messagesStream,
			`"input_tokens":18,"output_tokens":2,"cache_read_input_tokens":32,"cache_creation_input_tokens":0`,
			`"input_tokens":50,"output_tokens":2`, 1), nil, "ab", 50, 0, true},
		{"messages truncated", APIMessages, messagesStream[:strings.Index(messagesStream, "event: message_stop")], errTruncated, "ab", 50, 32, true},
		{"messages error event", APIMessages, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"busy\"}}\n\n",
			errStreamError, "", 0, 0, false},
		{"responses", APIResponses, responsesStream, nil, "ab", 50, 32, true},
		{"responses incomplete", APIResponses, strings.Replace(responsesStream, "response.completed", "response.incomplete", 2), nil, "ab", 50, 32, true},
		{"responses failed", APIResponses, "data: {\"type\":\"response.failed\",\"response\":{\"error\":{\"message\":\"boom\"}}}\n\n",
			errStreamError, "", 0, 0, false},
		{"responses truncated", APIResponses, responsesStream[:strings.Index(responsesStream, "event: response.completed")], errTruncated, "ab", 0, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := &tickClock{t: time.Unix(0, 0), step: time.Millisecond}
			res, err := readStreamWith(strings.NewReader(tt.body), parserFor(tt.api), clock.t, clock.now)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if res.answer != tt.answer || res.tokens != len(tt.answer) {
				t.Fatalf("answer %q in %d tokens, want %q", res.answer, res.tokens, tt.answer)
			}
			if (res.usage != nil) != tt.usage {
				t.Fatalf("usage %+v, want present=%v", res.usage, tt.usage)
			}
			if res.usage != nil && (res.usage.PromptTokens != tt.prompt || res.usage.CachedTokens() != tt.cached) {
				t.Fatalf("usage %d/%d, want %d/%d", res.usage.PromptTokens, res.usage.CachedTokens(), tt.prompt, tt.cached)
			}
		})
	}
}

// apiServer answers each API with its canned stream and records what it got.
type apiServer struct {
	mu      sync.Mutex
	paths   map[string]int
	keys    map[string]bool // X-Api-Key values
	session map[string]bool
}

func (s *apiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&body); err != nil || body["stream"] != true {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	s.paths[r.URL.Path]++
	s.keys[r.Header.Get("X-Api-Key")] = true
	s.session[r.Header.Get("X-Session-ID")] = true
	s.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	switch r.URL.Path {
	case "/v1/messages":
		io.WriteString(w, messagesStream)
	case "/v1/responses":
		io.WriteString(w, responsesStream)
	default:
		io.WriteString(w, `data: {"choices":[{"delta":{"content":"ab"}}]}`+"\n\n"+
			`data: {"choices":[],"usage":{"prompt_tokens":50,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":32}}}`+"\n\ndata: [DONE]\n\n")
	}
}

func TestRunAgentSessionOverEachAPI(t *testing.T) {
	for _, api := range APINames() {
		t.Run(api, func(t *testing.T) {
			srv := &apiServer{paths: map[string]int{}, keys: map[string]bool{}, session: map[string]bool{}}
			hs := httptest.NewServer(srv)
			defer hs.Close()
			cfg := testConfig(hs.URL)
			cfg.Targets[0].Metrics = ""
			cfg.API, cfg.APIKey = api, "sk-test"
			cfg.Workload = WorkloadConfig{Name: AgentSession, Model: "m", Seed: 1, Sessions: 2, Turns: 3, SystemWords: 20, PromptWords: 5, MaxTokens: 2}
			cfg.Concurrency, cfg.Requests = 2, 6
			res, err := Run(context.Background(), cfg)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			r := res.Runs[0]
			if r.Errors != 0 || r.Requests != 6 {
				t.Fatalf("%d requests, %d errors %v; want 6 and none", r.Requests, r.Errors, r.ErrorsByKind)
			}
			if r.PromptTokens != 6*50 || r.CachedTokens != 6*32 {
				t.Fatalf("prompt %d cached %d, want %d %d", r.PromptTokens, r.CachedTokens, 6*50, 6*32)
			}
			if srv.paths[apiPath(api)] != 6 || len(srv.session) < 2 || srv.session[""] {
				t.Fatalf("paths %v sessions %v, want 6 on %s under session ids", srv.paths, srv.session, apiPath(api))
			}
			if wantKey := api == APIMessages; srv.keys["sk-test"] != wantKey {
				t.Fatalf("X-Api-Key seen %v, want %v", srv.keys, wantKey)
			}
			if !strings.Contains(r.Settings, "--workload agent-session") || strings.Contains(r.Settings, "--api") != (api != APIChat) {
				t.Fatalf("settings %q", r.Settings)
			}
		})
	}
}

func TestRunsOfOneSeedUseTheirOwnSessions(t *testing.T) {
	srv := &apiServer{paths: map[string]int{}, keys: map[string]bool{}, session: map[string]bool{}}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	cfg := testConfig(hs.URL)
	cfg.Targets[0].Metrics = ""
	cfg.Workload = WorkloadConfig{Name: AgentSession, Model: "m", Seed: 1, Sessions: 2, Turns: 2, SystemWords: 20, PromptWords: 5, MaxTokens: 2}
	cfg.Concurrency, cfg.Requests = 2, 4
	// A clock the clients share: each reading a millisecond on, so the two
	// runs' tags differ without a wall clock.
	var mu sync.Mutex
	clock := &tickClock{t: time.Unix(100, 0), step: time.Millisecond}
	cfg.Now = func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return clock.now()
	}
	var runs []map[string]bool
	for range 2 {
		if _, err := Run(context.Background(), cfg); err != nil {
			t.Fatalf("Run: %v", err)
		}
		srv.mu.Lock()
		runs = append(runs, srv.session)
		srv.session = map[string]bool{}
		srv.mu.Unlock()
	}
	if len(runs[0]) == 0 || len(runs[1]) == 0 {
		t.Fatalf("session ids %v: a run sent none", runs)
	}
	for id := range runs[1] {
		if runs[0][id] {
			t.Fatalf("session id %q sent by both runs: the second inherits the first's affinity", id)
		}
	}
}
