package api

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/auth"
	"github.com/llmgw/llmgw/router/director"
	"github.com/llmgw/llmgw/router/endpoint"
	"github.com/llmgw/llmgw/router/flow"
	"github.com/llmgw/llmgw/router/openai"
	"github.com/llmgw/llmgw/router/proxy"
	"github.com/llmgw/llmgw/router/quota"
	"github.com/llmgw/llmgw/router/scheduler"
)

// The usage every answer of fakeVLLM reports, in each API's terms: a
// prompt of 12 tokens, 8 of them from the prefix cache, and 5 generated.
const (
	usedInput  = 12
	usedCached = 8
	usedOutput = 5
)

// Each API's answer as vLLM writes it (vllm/entrypoints/openai/...,
// vllm/entrypoints/anthropic/serving.py), streamed and not.
var (
	chatAnswer = `{"id":"chatcmpl-1","object":"chat.completion","model":"demo","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":12,"total_tokens":17,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":8}}}`
	responsesAnswer = `{"id":"resp_1","created_at":1,"incomplete_details":null,"instructions":null,"metadata":null,"model":"demo","object":"response",` +
		`"output":[{"id":"msg_1","content":[{"annotations":[],"text":"hello","type":"output_text","logprobs":null}],"role":"assistant","status":"completed","type":"message"}],` +
		`"parallel_tool_calls":true,"temperature":1.0,"tool_choice":"auto","tools":[],"top_p":1.0,"background":false,"max_output_tokens":100,"max_tool_calls":null,` +
		`"previous_response_id":null,"prompt":null,"reasoning":null,"service_tier":"auto","status":"completed","text":null,"top_logprobs":null,"truncation":"disabled",` +
		`"usage":{"input_tokens":12,"input_tokens_details":{"cached_tokens":8,"input_tokens_per_turn":[],"cached_tokens_per_turn":[]},"output_tokens":5,` +
		`"output_tokens_details":{"reasoning_tokens":0,"tool_output_tokens":0,"output_tokens_per_turn":[],"tool_output_tokens_per_turn":[]},"total_tokens":17},` +
		`"user":null,"input_messages":null,"output_messages":null}`
	messagesAnswer = `{"id":"chatcmpl-1","type":"message","role":"assistant","content":[{"type":"text","text":"hello"}],"model":"demo","stop_reason":"end_turn",` +
		`"usage":{"input_tokens":4,"output_tokens":5,"cache_read_input_tokens":8,"cache_creation_input_tokens":0}}`
	countTokensAnswer = `{"input_tokens":12,"context_management":{"original_input_tokens":12}}`
)

// streamEvents are each API's stream, event by event.
func streamEvents(api openai.API, withUsage bool) []string {
	switch api {
	case openai.Responses:
		sse := func(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }
		return []string{
			sse("response.created", `{"response":{"id":"resp_1","status":"in_progress","usage":null},"sequence_number":0,"type":"response.created"}`),
			sse("response.output_text.delta", `{"content_index":0,"delta":"hel","item_id":"msg_1","output_index":0,"sequence_number":1,"type":"response.output_text.delta"}`),
			sse("response.output_text.delta", `{"content_index":0,"delta":"lo","item_id":"msg_1","output_index":0,"sequence_number":2,"type":"response.output_text.delta"}`),
			sse("response.completed", `{"response":`+responsesAnswer+`,"sequence_number":3,"type":"response.completed"}`),
		}
	case openai.Messages:
		sse := func(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }
		return []string{
			sse("message_start", `{"type":"message_start","message":{"id":"chatcmpl-1","type":"message","role":"assistant","content":[],"model":"demo","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":0}}}`),
			sse("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`),
			sse("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hel"}}`),
			sse("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"lo"}}`),
			sse("content_block_stop", `{"type":"content_block_stop","index":0}`),
			sse("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":4,"output_tokens":5,"cache_read_input_tokens":8,"cache_creation_input_tokens":0}}`),
			sse("message_stop", `{"type":"message_stop"}`),
		}
	}
	evs := []string{
		"data: " + `{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}` + "\n\n",
		"data: " + `{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hel"}}]}` + "\n\n",
		"data: " + `{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}` + "\n\n",
	}
	if withUsage {
		evs = append(evs, "data: "+`{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":12,"total_tokens":17,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":8}}}`+"\n\n")
	}
	return append(evs, "data: [DONE]\n\n")
}

// fakeVLLM is an engine shaped like vLLM's answers on every API the router
// serves, which records what it was sent and counts its aborts: requests
// whose connection went away before their answer ended, as vLLM aborts a
// request whose client disconnects.
type fakeVLLM struct {
	addr string
	// mode is how it answers: "" at once; "endless" streams a delta every
	// few milliseconds (holds a non-streamed answer) until the client goes;
	// "flood" streams 64 KiB events as fast as they go; "linger" sends the
	// whole stream, then keeps the body open until the client goes.
	mode    atomic.Value
	aborts  atomic.Int32
	started chan struct{} // a request began answering

	mu      sync.Mutex
	paths   []string
	bodies  []string
	headers []http.Header
}

func newFakeVLLM(t *testing.T) *fakeVLLM {
	t.Helper()
	f := &fakeVLLM{started: make(chan struct{}, 64)}
	f.mode.Store("")
	f.addr = engine(t, f.serve)
	return f
}

func (f *fakeVLLM) last() (path, body string, h http.Header) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.paths) == 0 {
		return "", "", nil
	}
	n := len(f.paths) - 1
	return f.paths[n], f.bodies[n], f.headers[n]
}

func (f *fakeVLLM) serve(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.paths, f.bodies, f.headers = append(f.paths, r.URL.Path), append(f.bodies, string(b)), append(f.headers, r.Header.Clone())
	f.mu.Unlock()
	var req struct {
		Stream        bool `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	_ = json.Unmarshal(b, &req)
	api, _ := openai.APIOf(r.URL.Path)
	mode := f.mode.Load().(string)
	f.started <- struct{}{}
	fl := w.(http.Flusher)
	if !req.Stream || api == openai.CountTokens {
		if mode == "endless" {
			<-r.Context().Done()
			f.aborts.Add(1)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, map[openai.API]string{openai.Chat: chatAnswer, openai.Completions: chatAnswer,
			openai.Responses: responsesAnswer, openai.Messages: messagesAnswer, openai.CountTokens: countTokensAnswer}[api])
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	evs := streamEvents(api, req.StreamOptions.IncludeUsage)
	switch mode {
	case "endless", "flood":
		io.WriteString(w, evs[0])
		fl.Flush()
		delta := evs[1]
		if mode == "flood" {
			delta = strings.Replace(delta, "hel", strings.Repeat("x", 64<<10), 1)
		}
		for {
			if _, err := io.WriteString(w, delta); err != nil {
				f.aborts.Add(1)
				return
			}
			fl.Flush()
			if mode == "endless" {
				select {
				case <-r.Context().Done():
					f.aborts.Add(1)
					return
				case <-time.After(5 * time.Millisecond):
				}
			} else if r.Context().Err() != nil {
				f.aborts.Add(1)
				return
			}
		}
	}
	for _, ev := range evs {
		io.WriteString(w, ev)
		fl.Flush()
	}
	if mode == "linger" {
		<-r.Context().Done()
	}
}

// apiRouter is a router over one fakeVLLM replica of "demo" (and an
// embedding model "emb"), metering through a quota with no limits and
// reg's metrics; mutate edits its handler's config.
func apiRouter(t *testing.T, f *fakeVLLM, px proxy.Config, mutate func(*Config)) (*httptest.Server, *prometheus.Registry, *Handler) {
	t.Helper()
	tb := &table{models: map[string][]*endpoint.Endpoint{"demo": {ep("demo-0", f.addr)}, "emb": {ep("emb-0", f.addr)}},
		list: []*llmgwv1.Model{{Name: "demo"}, {Name: "emb", Task: "embed"}}}
	reg := prometheus.NewRegistry()
	cfg := DefaultConfig()
	cfg.Quota = quota.New(quota.Config{Router: "test"}, func() map[string]*llmgwv1.Tenant { return nil }, grantAll{},
		slog.New(slog.DiscardHandler), reg)
	if mutate != nil {
		mutate(&cfg)
	}
	brs := breakers(t)
	dir := director.New(tb, inOrder{}, brs, reg)
	p := proxy.New(px, brs, reg)
	t.Cleanup(func() { dir.Close(); p.Close() })
	h := New(cfg, tb, dir, p, slog.New(slog.DiscardHandler), reg)
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s, reg, h
}

// metered is what the router metered so far, by kind (input, cached,
// output), over every tenant.
func metered(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "llmgw_router_tenant_tokens_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" {
					out[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// waitFor polls cond until it holds or 10 s have passed.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// bodies of a request to each API.
var apiBodies = map[openai.API]string{
	openai.Chat:        `{"model":"demo","messages":[{"role":"user","content":"hi"}],"max_tokens":100}`,
	openai.Completions: `{"model":"demo","prompt":"hi","max_tokens":100}`,
	openai.Responses:   `{"model":"demo","instructions":"be brief","input":"hi","max_output_tokens":100}`,
	openai.Messages:    `{"model":"demo","system":"be brief","messages":[{"role":"user","content":"hi"}],"max_tokens":100}`,
}

func withStream(body string) string {
	return strings.Replace(body, `{"model":"demo",`, `{"model":"demo","stream":true,`, 1)
}

// TestAPIsServed: /v1/responses and /v1/messages, streamed or not, go
// through the pipeline as chat does: the engine gets the client's body at
// the same path, unchanged (no stream_options: neither API takes it), the
// client gets the engine's answer byte for byte, and the usage is metered
// from each API's own usage block — Anthropic's input being its uncached
// input plus what the cache read.
func TestAPIsServed(t *testing.T) {
	for _, api := range []openai.API{openai.Chat, openai.Responses, openai.Messages} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s stream=%v", api.String(), stream), func(t *testing.T) {
				f := newFakeVLLM(t)
				srv, reg, _ := apiRouter(t, f, proxy.DefaultConfig(), nil)
				body := apiBodies[api]
				want := map[openai.API]string{openai.Chat: chatAnswer, openai.Responses: responsesAnswer, openai.Messages: messagesAnswer}[api]
				if stream {
					body = withStream(body)
					want = strings.Join(streamEvents(api, false), "")
				}
				resp := post(t, srv.URL+api.Path(), body, map[string]string{"Content-Type": "application/json", "anthropic-version": "2023-06-01"})
				got, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || string(got) != want || resp.Header.Get("X-Llmgw-Replica") != "demo-0" {
					t.Fatalf("%d %q replica %q, want 200 %q", resp.StatusCode, got, resp.Header.Get("X-Llmgw-Replica"), want)
				}
				path, sent, hdr := f.last()
				if path != api.Path() || (api != openai.Chat || !stream) && sent != body || hdr.Get("Anthropic-Version") != "2023-06-01" {
					t.Fatalf("engine got %s %s (%v), want %s %s", path, sent, hdr, api.Path(), body)
				}
				if api != openai.Chat && strings.Contains(sent, "stream_options") {
					t.Fatalf("engine got stream_options: %s", sent)
				}
				waitFor(t, "the usage metered", func() bool {
					m := metered(t, reg)
					return m["input"] == usedInput && m["cached"] == usedCached && m["output"] == usedOutput
				})
				if got := testutil.ToFloat64(prometheusCounter(t, reg, "llmgw_router_requests_total", "code", "200")); got != 1 {
					t.Fatalf("requests_total{code=200} = %v, want 1", got)
				}
			})
		}
	}
}

// prometheusCounter is the value of the counter name whose label has
// value, summed.
func prometheusCounter(t *testing.T, reg *prometheus.Registry, name, label, value string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "sum"})
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					c.Add(m.GetCounter().GetValue())
				}
			}
		}
	}
	return c
}

// TestCountTokens: /v1/messages/count_tokens is answered by the engine's
// own count_tokens (vLLM renders the chat template for it), forwarded as
// sent; it is no generation, so neither metered nor held by flow control.
func TestCountTokens(t *testing.T) {
	f := newFakeVLLM(t)
	fc := &flowSpy{}
	srv, reg, _ := apiRouter(t, f, proxy.DefaultConfig(), func(c *Config) { c.Flow = fc })
	body := `{"model":"demo","system":"be brief","messages":[{"role":"user","content":"hi"}]}`
	resp := post(t, srv.URL+openai.PathCountTokens, body, map[string]string{"x-api-key": "anything", "anthropic-version": "2023-06-01"})
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(got) != countTokensAnswer {
		t.Fatalf("%d %s", resp.StatusCode, got)
	}
	if path, sent, _ := f.last(); path != openai.PathCountTokens || sent != body {
		t.Fatalf("engine got %s %s", path, sent)
	}
	if fc.admits.Load() != 0 {
		t.Fatal("flow control held a count_tokens")
	}
	// A generation after it is metered; the count_tokens added nothing.
	resp = post(t, srv.URL+openai.PathMessages, apiBodies[openai.Messages], nil)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	waitFor(t, "the message metered", func() bool { return metered(t, reg)["input"] > 0 })
	if m := metered(t, reg); m["input"] != usedInput || m["output"] != usedOutput || fc.admits.Load() != 1 {
		t.Fatalf("metered %v, %d flow admissions; want the message's alone", m, fc.admits.Load())
	}
}

// flowSpy is flow control that lets everything on and counts admissions.
type flowSpy struct{ admits atomic.Int32 }

func (f *flowSpy) Enabled() bool { return true }
func (f *flowSpy) Resolve(string, string, string) (int, *openai.Error) {
	return 0, nil
}
func (f *flowSpy) Admit(context.Context, flow.Request) (*flow.Grant, *flow.Refusal) {
	f.admits.Add(1)
	return nil, nil
}
func (f *flowSpy) Class(int) string                       { return "standard" }
func (f *flowSpy) Weighted(input, output float64) float64 { return input + output }

// anthropicError is Anthropic's error body as the tests read it.
type anthropicError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// TestAPIErrors: every refusal on /v1/messages (and under it) is in
// Anthropic's error body, which Anthropic's SDKs raise as their typed
// errors; on /v1/responses in OpenAI's.
func TestAPIErrors(t *testing.T) {
	f := newFakeVLLM(t)
	src := &keySource{}
	src.set(apiKey("team-a", "sk-a"), apiKey("team-l", "sk-l", "demo"))
	srv, _, _ := apiRouter(t, f, proxy.DefaultConfig(), func(c *Config) {
		c.Keys = src.get
		c.RequireKey = true
	})
	good := map[string]string{"x-api-key": "sk-a"}
	tests := []struct {
		name, method, path, body string
		hdr                      map[string]string
		status                   int
		anthropic                string // Anthropic's error type; "" for OpenAI's body
		code                     string // OpenAI's code
	}{
		{"no key", "POST", openai.PathMessages, apiBodies[openai.Messages], nil, 401, "authentication_error", ""},
		{"bad key", "POST", openai.PathMessages, apiBodies[openai.Messages], map[string]string{"x-api-key": "sk-b"}, 401, "authentication_error", ""},
		{"model not allowed", "POST", openai.PathMessages, `{"model":"emb","max_tokens":1,"messages":[]}`, map[string]string{"x-api-key": "sk-l"}, 403, "permission_error", ""},
		{"unknown model", "POST", openai.PathMessages, `{"model":"nope","max_tokens":1,"messages":[]}`, good, 404, "not_found_error", ""},
		{"invalid JSON", "POST", openai.PathMessages, `{"model":`, good, 400, "invalid_request_error", ""},
		{"no model", "POST", openai.PathCountTokens, `{"messages":[]}`, good, 400, "invalid_request_error", ""},
		{"GET", "GET", openai.PathMessages, "", good, 405, "invalid_request_error", ""},
		{"unknown path under messages", "POST", "/v1/messages/batches", "{}", good, 404, "not_found_error", ""},
		{"responses: no key", "POST", openai.PathResponses, apiBodies[openai.Responses], nil, 401, "", "invalid_api_key"},
		{"responses: unknown model", "POST", openai.PathResponses, `{"model":"nope","input":"x"}`, good, 404, "", "model_not_found"},
		{"responses: GET one", "GET", "/v1/responses/resp_1", "", good, 404, "", "unknown_url"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, srv.URL+tt.path, strings.NewReader(tt.body))
			for k, v := range tt.hdr {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.status || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("%d %s, want %d", resp.StatusCode, b, tt.status)
			}
			if tt.anthropic != "" {
				var e anthropicError
				if err := json.Unmarshal(b, &e); err != nil || e.Type != "error" || e.Error.Type != tt.anthropic || e.Error.Message == "" {
					t.Fatalf("%s, want Anthropic's %s", b, tt.anthropic)
				}
				return
			}
			var e apiError
			if err := json.Unmarshal(b, &e); err != nil || e.Error.Code == nil || *e.Error.Code != tt.code {
				t.Fatalf("%s, want OpenAI's %s", b, tt.code)
			}
		})
	}
	// An embedding model on a generating API is refused before the engine.
	resp := post(t, srv.URL+openai.PathMessages, `{"model":"emb","max_tokens":1,"messages":[]}`, good)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var e anthropicError
	if resp.StatusCode != 400 || json.Unmarshal(b, &e) != nil || !strings.HasPrefix(e.Error.Message, "model_not_supported: ") {
		t.Fatalf("embedding model on /v1/messages: %d %s", resp.StatusCode, b)
	}
	// Authenticated by x-api-key: the engine never sees it.
	resp = post(t, srv.URL+openai.PathMessages, apiBodies[openai.Messages], good)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if _, _, h := f.last(); resp.StatusCode != 200 || h.Get("X-Api-Key") != "" || h.Get("Authorization") != "" {
		t.Fatalf("%d; engine headers %v", resp.StatusCode, h)
	}
}

// TestMessagesRetryBeforeFirstByte: a replica failing before its first
// byte is retried on another for /v1/messages as for chat, and when every
// replica fails the 502 is Anthropic's.
func TestMessagesRetryBeforeFirstByte(t *testing.T) {
	var failed atomic.Int32
	bad := engine(t, func(w http.ResponseWriter, _ *http.Request) {
		failed.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	f := newFakeVLLM(t)
	tb := &table{models: map[string][]*endpoint.Endpoint{"demo": {ep("bad", bad), ep("good", f.addr)}, "down": {ep("bad2", deadAddr(t))}},
		list: []*llmgwv1.Model{{Name: "demo"}, {Name: "down"}}}
	reg := prometheus.NewRegistry()
	h := newHandler(t, DefaultConfig(), tb, inOrder{}, breakers(t), slog.New(slog.DiscardHandler), reg)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	resp := post(t, srv.URL+openai.PathMessages, withStream(apiBodies[openai.Messages]), nil)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(got) != strings.Join(streamEvents(openai.Messages, false), "") || failed.Load() != 1 {
		t.Fatalf("%d %s after %d failures", resp.StatusCode, got, failed.Load())
	}
	resp = post(t, srv.URL+openai.PathMessages, `{"model":"down","max_tokens":1,"messages":[]}`, nil)
	got, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	var e anthropicError
	if resp.StatusCode != 502 || json.Unmarshal(got, &e) != nil || e.Error.Type != "api_error" {
		t.Fatalf("every replica down: %d %s", resp.StatusCode, got)
	}
}

// sessionSpy is a scheduler that picks the first candidate and records
// each request's session key.
type sessionSpy struct {
	inOrder
	mu       sync.Mutex
	sessions []string
}

func (s *sessionSpy) Pick(p *scheduler.Profile, r *scheduler.Request, c []scheduler.Candidate) int {
	s.mu.Lock()
	s.sessions = append(s.sessions, r.Session)
	s.mu.Unlock()
	return s.inOrder.Pick(p, r, c)
}

func (s *sessionSpy) last() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessions[len(s.sessions)-1]
}

// TestSessionHeaders: the session key session affinity routes by comes
// from the first configured header the request carries — by default
// X-Session-ID, Claude Code's X-Claude-Code-Session-Id and the Codex CLI's
// session_id — on every API.
func TestSessionHeaders(t *testing.T) {
	f := newFakeVLLM(t)
	tests := []struct {
		name    string
		headers []string // nil: the defaults
		sent    map[string]string
		want    string
	}{
		{"none", nil, nil, ""},
		{"X-Session-ID", nil, map[string]string{"X-Session-ID": "s1"}, "s1"},
		{"Claude Code", nil, map[string]string{"X-Claude-Code-Session-Id": "4f1c"}, "4f1c"},
		{"Codex", nil, map[string]string{"session_id": "0199-abc"}, "0199-abc"},
		{"the first listed wins", nil, map[string]string{"session_id": "codex", "X-Session-ID": "ours"}, "ours"},
		{"an empty value is none", nil, map[string]string{"X-Session-ID": "", "session_id": "codex"}, "codex"},
		{"configured", []string{"x-conversation"}, map[string]string{"X-Conversation": "c9", "X-Session-ID": "s1"}, "c9"},
		{"configured off", []string{}, map[string]string{"X-Session-ID": "s1"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spy := &sessionSpy{}
			cfg := DefaultConfig()
			if tt.headers != nil {
				cfg.SessionHeaders = tt.headers
			}
			h := newHandler(t, cfg, &table{models: map[string][]*endpoint.Endpoint{"demo": {ep("demo-0", f.addr)}}}, spy,
				breakers(t), slog.New(slog.DiscardHandler), nil)
			for _, api := range []openai.API{openai.Chat, openai.Responses, openai.Messages} {
				req := httptest.NewRequest(http.MethodPost, api.Path(), strings.NewReader(apiBodies[api]))
				for k, v := range tt.sent {
					req.Header[http.CanonicalHeaderKey(k)] = []string{v}
				}
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				if w.Code != 200 || spy.last() != tt.want {
					t.Fatalf("%s: %d, session %q, want %q", api, w.Code, spy.last(), tt.want)
				}
			}
		})
	}
}

// TestStreamEndCounts: a client that closes right after a stream's last
// event (message_stop, response.completed, data: [DONE]), before the
// engine ends its body, as SDKs do, got its whole answer: counted 200,
// not 499.
func TestStreamEndCounts(t *testing.T) {
	for _, api := range []openai.API{openai.Chat, openai.Responses, openai.Messages} {
		t.Run(api.String(), func(t *testing.T) {
			f := newFakeVLLM(t)
			f.mode.Store("linger")
			srv, reg, _ := apiRouter(t, f, proxy.DefaultConfig(), nil)
			resp := post(t, srv.URL+api.Path(), withStream(apiBodies[api]), nil)
			want := streamEvents(api, false)
			last := want[len(want)-1]
			var got strings.Builder
			br := bufio.NewReader(resp.Body)
			for !strings.HasSuffix(got.String(), last) {
				line, err := br.ReadString('\n')
				got.WriteString(line)
				if err != nil {
					t.Fatalf("stream ended after %q: %v", got.String(), err)
				}
			}
			resp.Body.Close()
			waitFor(t, "the request counted", func() bool {
				return testutil.ToFloat64(prometheusCounter(t, reg, "llmgw_router_requests_total", "model", "demo")) == 1
			})
			if c := testutil.ToFloat64(prometheusCounter(t, reg, "llmgw_router_requests_total", "code", "200")); c != 1 {
				t.Fatalf("counted 200: %v, want 1", c)
			}
		})
	}
}

// TestCancellationReachesEngine: on every API, a client that goes away —
// closing its connection mid-stream, or before a non-streamed answer —
// or that stops reading a stream (its connection open, its window shut)
// cancels the engine's request: the engine's connection is closed, as
// vLLM aborts a request on.
func TestCancellationReachesEngine(t *testing.T) {
	apis := []openai.API{openai.Chat, openai.Completions, openai.Responses, openai.Messages}
	for _, api := range apis {
		for _, how := range []string{"disconnect mid-stream", "disconnect before the answer", "stop reading"} {
			t.Run(fmt.Sprintf("%s %s", api.String(), how), func(t *testing.T) {
				f := newFakeVLLM(t)
				px := proxy.DefaultConfig()
				px.ClientWriteTimeout = 200 * time.Millisecond
				srv, reg, _ := apiRouter(t, f, px, nil)
				body := withStream(apiBodies[api])
				switch how {
				case "disconnect mid-stream":
					f.mode.Store("endless")
				case "disconnect before the answer":
					f.mode.Store("endless")
					body = apiBodies[api]
				case "stop reading":
					f.mode.Store("flood")
				}
				conn := rawRequest(t, srv.Listener.Addr().String(), api.Path(), body)
				select {
				case <-f.started:
				case <-time.After(10 * time.Second):
					t.Fatal("the engine never got the request")
				}
				if how != "stop reading" {
					conn.Close()
				}
				waitFor(t, "the engine's abort", func() bool { return f.aborts.Load() == 1 })
				conn.Close()
				waitFor(t, "the request counted 499", func() bool {
					return testutil.ToFloat64(prometheusCounter(t, reg, "llmgw_router_requests_total", "code", "499")) == 1
				})
				stalls := testutil.ToFloat64(prometheusCounter(t, reg, "llmgw_router_client_stalls_total", "model", "demo"))
				if want := map[bool]float64{true: 1, false: 0}[how == "stop reading"]; stalls != want {
					t.Fatalf("client stalls %v, want %v", stalls, want)
				}
				if n := testutil.ToFloat64(prometheusCounter(t, reg, "llmgw_router_upstream_errors_total", "model", "demo")); n != 0 {
					t.Fatalf("a client gone counted as %v upstream errors", n)
				}
			})
		}
	}
}

// rawRequest sends a POST of body to path on addr over a connection with
// a small receive buffer that the test reads nothing from: a client that
// stops reading once the answer starts.
func rawRequest(t *testing.T, addr, path, body string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.(*net.TCPConn).SetReadBuffer(4 << 10)
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", path, len(body), body)
	return c
}

// keySource serves the keys of authRouter's tests to apiRouter.
func (k *keySource) get() *auth.Set { return k.cur.Load() }

// TestEnginePriorityByAPI: an engine that schedules by priority is told
// the class on the Responses API, which takes vLLM's priority field, and
// not on the Messages API, whose request has none (vLLM drops it).
func TestEnginePriorityByAPI(t *testing.T) {
	f := newFakeVLLM(t)
	h, loads := flowHandler(t, "http://"+f.addr, nil, nil, nil)
	loads.tb.list = []*llmgwv1.Model{{Name: "demo", ExtraArgs: []string{"--scheduling-policy", "priority"}}}
	for api, want := range map[openai.API]bool{openai.Responses: true, openai.Messages: false} {
		req := httptest.NewRequest(http.MethodPost, api.Path(), strings.NewReader(apiBodies[api]))
		req.Header.Set("X-Llmgw-Priority", "batch")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		_, sent, _ := f.last()
		var body map[string]any
		_ = json.Unmarshal([]byte(sent), &body)
		if p, ok := body["priority"]; w.Code != 200 || ok != want || (ok && p != 2.0) {
			t.Errorf("%s: %d, the engine got priority %v (%v), want it: %v", api, w.Code, p, ok, want)
		}
	}
}
