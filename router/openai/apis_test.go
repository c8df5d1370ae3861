package openai

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestSniffAPIs: each API's prompt is read from its own fields in chat's
// layout, so one conversation keys the prefix tree alike through every
// API; a shape the router cannot read ends the text, never the request.
func TestSniffAPIs(t *testing.T) {
	tests := []struct {
		name   string
		api    API
		body   string
		prompt string
		stream bool
	}{
		{"chat", Chat, `{"model":"m","stream":true,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`,
			"system\x00be brief\x00user\x00hi\x00", true},
		{"responses string", Responses, `{"model":"m","instructions":"be brief","input":"hi"}`, "system\x00be brief\x00user\x00hi\x00", false},
		{"responses items", Responses, `{"model":"m","stream":true,"input":[{"role":"user","content":[{"type":"input_text","text":"h"},{"type":"input_image"},{"type":"input_text","text":"i"}]},` +
			`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"yo"}]},{"type":"reasoning","summary":[]},` +
			`{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"42"}]}`,
			"user\x00hi\x00assistant\x00yo\x00assistant\x00{}\x00tool\x0042\x00", true},
		{"responses unknown item ends the text", Responses, `{"model":"m","input":[{"role":"user","content":"a"},{"type":"mystery"},{"role":"user","content":"b"}]}`,
			"user\x00a\x00", false},
		{"responses prompt ignored", Responses, `{"model":"m","prompt":"x","messages":[{"role":"user","content":"x"}]}`, "", false},
		{"messages", Messages, `{"model":"m","max_tokens":5,"system":"be brief","messages":[{"role":"user","content":"hi"}]}`,
			"system\x00be brief\x00user\x00hi\x00", false},
		{"messages blocks", Messages, `{"model":"m","stream":true,"system":[{"type":"text","text":"x-anthropic-billing-header: cc=1;"},{"type":"text","text":"be "},{"type":"text","text":"brief"}],` +
			`"messages":[{"role":"user","content":[{"type":"text","text":"h"},{"type":"image","source":{}},{"type":"text","text":"i"}]},` +
			`{"role":"assistant","content":[{"type":"thinking","thinking":"hmm"},{"type":"tool_use","id":"t","name":"f","input":{"a":1}}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"42"}]}]}]}`,
			"system\x00be brief\x00user\x00hi\x00assistant\x00{\"a\":1}\x00user\x0042\x00", true},
		{"messages without system text", Messages, `{"model":"m","system":[],"messages":[{"role":"user","content":"hi"}]}`, "user\x00hi\x00", false},
		{"messages unreadable content ends the text", Messages, `{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":7},{"role":"user","content":"b"}]}`,
			"user\x00a\x00user\x00", false},
		{"count_tokens routes by load", CountTokens, `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`, "", false},
		{"embeddings route by load", Embeddings, `{"model":"m","input":"hi"}`, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := SniffFor(tt.api, []byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if got.Model != "m" || got.Prompt != tt.prompt || got.Stream != tt.stream {
				t.Fatalf("got %+v, want prompt %q stream %v", got, tt.prompt, tt.stream)
			}
		})
	}
	long := strings.Repeat("x", MaxPromptBytes)
	for _, api := range []API{Responses, Messages} {
		body := `{"model":"m","input":"` + long + `","messages":[{"role":"user","content":"` + long + `"}]}`
		if got, _ := SniffFor(api, []byte(body)); len(got.Prompt) != MaxPromptBytes {
			t.Fatalf("%s: prompt of %d bytes, want the bound %d", api, len(got.Prompt), MaxPromptBytes)
		}
	}
}

// TestUsageFor: the usage of each API's answer, streamed or not, in
// OpenAI's terms; Anthropic's input is the uncached part plus the cache's,
// and only message_delta's usage is a stream's.
func TestUsageFor(t *testing.T) {
	respDone := `event: response.output_text.delta` + "\n" + `data: {"type":"response.output_text.delta","delta":"usage"}` + "\n\n" +
		`event: response.completed` + "\n" + `data: {"type":"response.completed","response":{"id":"resp_1","output":[],` +
		`"tools":[{"type":"function","name":"f","parameters":{"properties":{"usage":{"type":"string"}}}}],` +
		`"usage":{"input_tokens":12,"input_tokens_details":{"cached_tokens":8,"input_tokens_per_turn":[]},"output_tokens":5,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":17},` +
		`"user":null},"sequence_number":9}` + "\n\n"
	msgStream := `event: message_start` + "\n" + `data: {"type":"message_start","message":{"id":"m","usage":{"input_tokens":12,"output_tokens":0}}}` + "\n\n" +
		`event: content_block_delta` + "\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"\"usage\":{"}}` + "\n\n" +
		`event: message_delta` + "\n" + `data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":4,"output_tokens":7,"cache_read_input_tokens":8,"cache_creation_input_tokens":0}}` + "\n\n" +
		`event: message_stop` + "\n" + `data: {"type":"message_stop"}` + "\n\n"
	tests := []struct {
		name            string
		api             API
		stream          bool
		tail            string
		in, cached, out int
		ok, cachedKnown bool
	}{
		{"chat", Chat, false, `{"usage":{"prompt_tokens":12,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":8}}}`, 12, 8, 5, true, true},
		{"responses", Responses, false, `{"id":"r","usage":{"input_tokens":12,"input_tokens_details":{"cached_tokens":8},"output_tokens":5,"total_tokens":17},"user":null}`, 12, 8, 5, true, true},
		{"responses stream", Responses, true, respDone, 12, 8, 5, true, true},
		{"responses stream, its start cut off", Responses, true, respDone[len(respDone)-300:], 12, 8, 5, true, true},
		{"responses stream cut before the end", Responses, true, "event: response.created\ndata: {\"response\":{\"usage\":null}}\n\n", 0, 0, 0, false, false},
		{"messages, vLLM before #40912", Messages, false, `{"id":"m","type":"message","usage":{"input_tokens":12,"output_tokens":5}}`, 12, 0, 5, true, false},
		{"messages with the cache", Messages, false, `{"id":"m","usage":{"input_tokens":3,"output_tokens":5,"cache_read_input_tokens":8,"cache_creation_input_tokens":1}}`, 12, 8, 5, true, true},
		{"messages stream", Messages, true, msgStream, 12, 8, 7, true, true},
		{"messages stream cut before message_delta", Messages, true, msgStream[:strings.Index(msgStream, "event: message_delta")], 0, 0, 0, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, ok := UsageFor(tt.api, tt.stream, []byte(tt.tail))
			if ok != tt.ok || u.PromptTokens != tt.in || u.CompletionTokens != tt.out || (u.PromptTokensDetails != nil) != tt.cachedKnown {
				t.Fatalf("usage %+v %v, want in %d out %d (%v), cached known %v", u, ok, tt.in, tt.out, tt.ok, tt.cachedKnown)
			}
			c, cok := CachedTokensFor(tt.api, tt.stream, []byte(tt.tail))
			if cok != tt.cachedKnown || c != tt.cached {
				t.Fatalf("cached %d %v, want %d %v", c, cok, tt.cached, tt.cachedKnown)
			}
			o, ook := CompletionTokensFor(tt.api, tt.stream, []byte(tt.tail))
			if ook != tt.ok || o != tt.out {
				t.Fatalf("completion tokens %d %v, want %d %v", o, ook, tt.out, tt.ok)
			}
		})
	}
}

// TestMaxTokensFor: each API's output bound by its own name.
func TestMaxTokensFor(t *testing.T) {
	body := []byte(`{"max_tokens":7,"max_output_tokens":9,"max_completion_tokens":5}`)
	for api, want := range map[API]int{Chat: 5, Completions: 5, Responses: 9, Messages: 7} {
		if n, ok := MaxTokensFor(api, body); !ok || n != want {
			t.Errorf("%s: %d %v, want %d", api, n, ok, want)
		}
	}
	if _, ok := MaxTokensFor(CountTokens, body); ok {
		t.Error("count_tokens has no output bound")
	}
}

// TestErrorShapes: /v1/messages (and every path under it) answers in
// Anthropic's error body, with Anthropic's type for the status, OpenAI's
// code kept in the message; the rest in OpenAI's.
func TestErrorShapes(t *testing.T) {
	tests := []struct {
		path string
		err  *Error
		typ  string
	}{
		{PathMessages, ModelNotFound("x"), "not_found_error"},
		{PathCountTokens, InvalidField("model", "model is required"), "invalid_request_error"},
		{"/v1/messages/nope", UnknownPath("POST", "/v1/messages/nope"), "not_found_error"},
		{PathMessages, &Error{Status: 401, Type: "invalid_request_error", Code: "invalid_api_key", Message: "no"}, "authentication_error"},
		{PathMessages, Forbiddenish(), "permission_error"},
		{PathMessages, RateLimited("requests", "slow down", 3), "rate_limit_error"},
		{PathMessages, TooLarge(10), "request_too_large"},
		{PathMessages, NoReplica("m"), "overloaded_error"},
		{PathMessages, Upstream(errString("boom")), "api_error"},
	}
	for _, tt := range tests {
		w := httptest.NewRecorder()
		WriteErrorAt(w, tt.path, tt.err)
		var b struct {
			Type  string `json:"type"`
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &b); err != nil || w.Code != tt.err.Status || b.Type != "error" ||
			b.Error.Type != tt.typ || !strings.HasPrefix(b.Error.Message, tt.err.Code+": ") {
			t.Errorf("%s %d: %d %s, want Anthropic's %s", tt.path, tt.err.Status, w.Code, w.Body, tt.typ)
		}
		if tt.err.RetryAfter > 0 && w.Header().Get("Retry-After") == "" {
			t.Errorf("%s: no Retry-After", tt.path)
		}
	}
	for _, path := range []string{PathResponses, PathChat, "/v1/messagesx", "/healthz"} {
		w := httptest.NewRecorder()
		WriteErrorAt(w, path, ModelNotFound("x"))
		var b struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if json.Unmarshal(w.Body.Bytes(), &b) != nil || b.Error.Code != "model_not_found" || w.Code != http.StatusNotFound {
			t.Errorf("%s: %s, want OpenAI's body", path, w.Body)
		}
	}
}

type errString string

func (e errString) Error() string { return string(e) }

func Forbiddenish() *Error {
	return &Error{Status: 403, Type: "invalid_request_error", Code: "model_not_allowed", Message: "no"}
}

// FuzzUsageFor: any tail reads as a usage or none, never a panic, and
// never a negative count from a well-formed one.
func FuzzUsageFor(f *testing.F) {
	f.Add([]byte(`{"usage":{"input_tokens":1,"output_tokens":2,"cache_read_input_tokens":3}}`), true)
	f.Add([]byte(`data: {"type":"message_delta","usage":{"input_tokens":1,"output_tokens":2}}`), true)
	f.Add([]byte(`"usage": {"input_tokens_details":{"cached_tokens":1}`), false)
	f.Fuzz(func(t *testing.T, tail []byte, stream bool) {
		for _, api := range []API{Chat, Responses, Messages} {
			_, _ = UsageFor(api, stream, tail)
			c := &EventCounter{API: api}
			_, _ = c.Write(tail)
			_ = c.Ended()
		}
	})
}
