package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
	"github.com/llmgw/llmgw/vllm"
)

// sseEvent is one server-sent event: its name (empty for data-only
// events) and data.
type sseEvent struct{ name, data string }

// readSSE reads every event of a stream to its end.
func readSSE(t *testing.T, r io.Reader) []sseEvent {
	t.Helper()
	var evs []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.data != "" || cur.name != "" {
				evs = append(evs, cur)
			}
			cur = sseEvent{}
		case strings.HasPrefix(line, "event: "):
			cur.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			cur.data = strings.TrimPrefix(line, "data: ")
		default:
			t.Fatalf("unexpected line in stream: %q", line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return evs
}

// stream posts body and returns its events, checking the stream's status
// and content type.
func stream(t *testing.T, url, body string) []sseEvent {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("content type %q", ct)
	}
	return readSSE(t, resp.Body)
}

// postOK posts body, wants 200 and decodes the answer into v.
func postOK(t *testing.T, url, body string, v any) []byte {
	t.Helper()
	resp, b := post(t, url, body)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return b
}

// names are the events' names.
func names(evs []sseEvent) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.name
	}
	return out
}

// setClock is a clock a test moves by hand; Sleep returns at once.
type setClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *setClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *setClock) set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

func (c *setClock) Sleep(ctx context.Context, _ time.Duration) error { return ctx.Err() }

const weatherSchema = `{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer","minimum":1,"maximum":7},"unit":{"enum":["c","f"]}},"required":["city","days"]}`

const chatTools = `"tools":[{"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{"tz":{"type":"string"}},"required":["tz"]}}},` +
	`{"type":"function","function":{"name":"get_weather","description":"the weather","parameters":` + weatherSchema + `}}]`

func TestResponsesNonStreamed(t *testing.T) {
	clock := &setClock{now: time.Unix(1700000000, 0)}
	_, ts := newTestServer(t, testConfig(), WithClock(clock))
	clock.set(time.Unix(1700000720, 0)) // twelve minutes after the engine started
	var cached []int
	for _, q := range []string{"first question", "a second question"} {
		var r vllm.ResponsesResponse
		postOK(t, ts.URL+"/v1/responses", `{"model":"llama","instructions":"`+longSystem+`","input":"`+q+`","max_output_tokens":4}`, &r)
		if !strings.HasPrefix(r.ID, "resp_") || r.Object != "response" || r.Model != "llama" || r.CreatedAt != 1700000720 {
			t.Errorf("envelope: %+v", r)
		}
		// The simulator's text runs to its limit, which vLLM reports as
		// incomplete.
		if r.Status != "incomplete" || r.IncompleteDetails == nil || r.IncompleteDetails.Reason != "max_output_tokens" || r.MaxOutputTokens != 4 {
			t.Errorf("status %q %+v, max_output_tokens %d", r.Status, r.IncompleteDetails, r.MaxOutputTokens)
		}
		if len(r.Output) != 1 || r.Output[0].Type != "message" || r.Output[0].Role != "assistant" || r.Output[0].Status != "completed" ||
			!strings.HasPrefix(r.Output[0].ID, "msg_") || len(r.Output[0].Content) != 1 || r.Output[0].Content[0].Type != "output_text" {
			t.Fatalf("output: %+v", r.Output)
		}
		u := r.Usage
		if u == nil || u.OutputTokens != 4 || u.TotalTokens != u.InputTokens+4 || u.InputTokensDetails.InputTokensPerTurn[0] != u.InputTokens {
			t.Fatalf("usage: %+v", u)
		}
		cached = append(cached, u.InputTokensDetails.CachedTokens)
	}
	if cached[0] != 0 || cached[1] == 0 || cached[1]%16 != 0 {
		t.Errorf("cached tokens %v: want the shared instructions cached on the second request", cached)
	}
}

func TestResponsesInputItemsRenderAsChat(t *testing.T) {
	s, ts := newTestServer(t, testConfig())
	// The same conversation as chat messages and as Responses items costs
	// the same prompt tokens: one template renders both.
	chat := `{"model":"llama","max_tokens":1,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"Hi there"},` +
		`{"role":"assistant","content":"Hello"},{"role":"user","content":"and now"}]}`
	resp := `{"model":"llama","max_output_tokens":1,"instructions":"be brief","input":[{"role":"user","content":"Hi there"},` +
		`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Hello"}]},{"role":"user","content":[{"type":"input_text","text":"and now"}]}]}`
	var c vllm.ChatCompletion
	postOK(t, ts.URL+"/v1/chat/completions", chat, &c)
	var r vllm.ResponsesResponse
	postOK(t, ts.URL+"/v1/responses", resp, &r)
	if c.Usage.PromptTokens != r.Usage.InputTokens {
		t.Errorf("chat prompt %d tokens, responses input %d", c.Usage.PromptTokens, r.Usage.InputTokens)
	}
	if r.Usage.InputTokensDetails.CachedTokens == 0 {
		t.Error("the Responses request did not hit the prefix the chat request cached")
	}
	_ = s
}

func TestResponsesStreamEvents(t *testing.T) {
	_, ts := newTestServer(t, testConfig())
	evs := stream(t, ts.URL+"/v1/responses", `{"model":"llama","input":"hello","max_output_tokens":3,"stream":true,`+
		`"include":["message.output_text.logprobs"],"top_logprobs":2}`)
	want := []string{vllm.EventResponseCreated, vllm.EventResponseInProgress, vllm.EventOutputItemAdded, vllm.EventContentPartAdded,
		vllm.EventOutputTextDelta, vllm.EventOutputTextDelta, vllm.EventOutputTextDelta,
		vllm.EventOutputTextDone, vllm.EventContentPartDone, vllm.EventOutputItemDone, vllm.EventResponseCompleted}
	if !slices.Equal(names(evs), want) {
		t.Fatalf("events %v\nwant %v", names(evs), want)
	}
	var text, itemID string
	for i, e := range evs {
		var ev vllm.ResponseStreamEvent
		if err := json.Unmarshal([]byte(e.data), &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Type != e.name || ev.SequenceNumber != i {
			t.Errorf("event %d: type %q sequence %d", i, ev.Type, ev.SequenceNumber)
		}
		switch ev.Type {
		case vllm.EventResponseCreated, vllm.EventResponseInProgress:
			if ev.Response.Status != "in_progress" || len(ev.Response.Output) != 0 || ev.Response.Usage != nil {
				t.Errorf("%s: %s", ev.Type, e.data)
			}
		case vllm.EventOutputItemAdded:
			itemID = ev.Item.ID
		case vllm.EventOutputTextDelta:
			text += *ev.Delta
			if ev.ItemID != itemID || len(ev.Logprobs) != 1 || len(ev.Logprobs[0].TopLogprobs) != 2 || ev.Logprobs[0].Bytes != nil {
				t.Errorf("delta: %s", e.data)
			}
		case vllm.EventOutputTextDone:
			if *ev.Text != text || len(ev.Logprobs) != 3 {
				t.Errorf("done text %q, deltas %q: %s", *ev.Text, text, e.data)
			}
		case vllm.EventResponseCompleted:
			r := ev.Response
			if r.Status != "incomplete" || r.Usage == nil || r.Usage.OutputTokens != 3 || r.Output[0].ID != itemID ||
				r.Output[0].Content[0].Text != text || len(r.Output[0].Content[0].Logprobs) != 3 || *r.TopLogprobs != 2 {
				t.Errorf("completed: %s", e.data)
			}
		}
	}
}

func TestResponsesFunctionCall(t *testing.T) {
	_, ts := newTestServer(t, testConfig())
	tools := `"tools":[{"type":"web_search_preview"},{"type":"function","name":"get_weather","parameters":` + weatherSchema + `}]`
	for _, choice := range []string{`"required"`, `{"type":"function","name":"get_weather"}`} {
		t.Run(choice, func(t *testing.T) {
			body := `{"model":"llama","input":"weather in Paris?",` + tools + `,"tool_choice":` + choice
			var r vllm.ResponsesResponse
			postOK(t, ts.URL+"/v1/responses", body+`}`, &r)
			if r.Status != "completed" || len(r.Output) != 1 {
				t.Fatalf("response: %+v", r)
			}
			fc := r.Output[0]
			if fc.Type != "function_call" || fc.Name != "get_weather" || !strings.HasPrefix(fc.CallID, "call_") || !strings.HasPrefix(fc.ID, "fc_") {
				t.Fatalf("item: %+v", fc)
			}
			validateJSON(t, weatherSchema, fc.Arguments)

			evs := stream(t, ts.URL+"/v1/responses", body+`,"stream":true}`)
			got := names(evs)
			if got[2] != vllm.EventOutputItemAdded || got[len(got)-3] != vllm.EventFunctionCallArgumentsDone ||
				got[len(got)-2] != vllm.EventOutputItemDone || got[len(got)-1] != vllm.EventResponseCompleted {
				t.Fatalf("events %v", got)
			}
			var args string
			for _, e := range evs[3 : len(evs)-3] {
				var ev vllm.ResponseStreamEvent
				_ = json.Unmarshal([]byte(e.data), &ev)
				if ev.Type != vllm.EventFunctionCallArgumentsDelta {
					t.Fatalf("between added and done: %s", e.data)
				}
				args += *ev.Delta
			}
			var done, completed vllm.ResponseStreamEvent
			_ = json.Unmarshal([]byte(evs[len(evs)-3].data), &done)
			_ = json.Unmarshal([]byte(evs[len(evs)-1].data), &completed)
			if args != fc.Arguments || *done.Arguments != args || completed.Response.Output[0].Arguments != args {
				t.Errorf("arguments: deltas %q, done %q, non-streamed %q", args, *done.Arguments, fc.Arguments)
			}
		})
	}
}

func TestResponsesErrors(t *testing.T) {
	_, ts := newTestServer(t, testConfig())
	tests := []struct {
		name, body string
		status     int
		errType    string
		param, msg string
	}{
		{"previous response not stored", `{"input":"x","previous_response_id":"resp_1"}`, 404, "invalid_request_error", "response_id", "Response with id 'resp_1' not found."},
		{"background without store", `{"input":"x","background":true}`, 400, "invalid_request_error", "background", "VLLM_ENABLE_RESPONSES_API_STORE"},
		{"prompt template", `{"input":"x","prompt":{"id":"p"}}`, 400, "invalid_request_error", "prompt", "prompt template is not supported"},
		{"no input", `{"model":"llama"}`, 400, "BadRequestError", "", "input"},
		{"unknown model", `{"model":"gpt-4","input":"x"}`, 404, "NotFoundError", "model", "does not exist"},
		{"item type", `{"input":[{"type":"computer_call","id":"c"}]}`, 400, "BadRequestError", "", `item type "computer_call"`},
		{"schema", `{"input":"x","text":{"format":{"type":"json_schema","name":"s","schema":{"type":"string","pattern":"a+"}}}}`, 400, "BadRequestError", "", `keyword "pattern"`},
		{"hosted tool choice", `{"input":"x","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"web_search_preview"}}`, 400, "BadRequestError", "", "not emulated"},
		{"logprobs over the limit", `{"input":"x","include":["message.output_text.logprobs"],"top_logprobs":21}`, 400, "invalid_request_error", "top_logprobs", "greater than max allowed: 20"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := post(t, ts.URL+"/v1/responses", tc.body)
			var e vllm.ErrorResponse
			if err := json.Unmarshal(b, &e); err != nil || resp.StatusCode != tc.status {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			if e.Error.Type != tc.errType || e.Error.Code != tc.status || !strings.Contains(e.Error.Message, tc.msg) ||
				(tc.param != "" && (e.Error.Param == nil || *e.Error.Param != tc.param)) {
				t.Errorf("body %s", b)
			}
		})
	}
}

func TestMessagesNonStreamed(t *testing.T) {
	clock := &setClock{now: time.Unix(1700000000, 0)}
	_, ts := newTestServer(t, testConfig(), WithClock(clock))
	var cached []int
	for _, q := range []string{"first", "second one"} {
		var m vllm.AnthropicMessagesResponse
		raw := postOK(t, ts.URL+"/v1/messages", `{"model":"llama","max_tokens":5,"system":[{"type":"text","text":"`+longSystem+`"}],`+
			`"messages":[{"role":"user","content":[{"type":"text","text":"`+q+`"}]}]}`, &m)
		if !strings.HasPrefix(m.ID, "chatcmpl-") || m.Type != "message" || m.Role != "assistant" || m.Model != "llama" {
			t.Errorf("envelope: %s", raw)
		}
		if m.StopReason == nil || *m.StopReason != vllm.AnthropicStopMaxTokens || len(m.Content) != 1 || m.Content[0].Type != "text" {
			t.Errorf("content: %s", raw)
		}
		// vLLM writes the answer with exclude_none.
		if strings.Contains(string(raw), "null") || strings.Contains(string(raw), "stop_sequence") {
			t.Errorf("null fields in %s", raw)
		}
		u := m.Usage
		if u.OutputTokens != 5 || u.CacheReadInputTokens == nil || u.CacheCreationInputTokens == nil || *u.CacheCreationInputTokens != 0 {
			t.Fatalf("usage %s", raw)
		}
		cached = append(cached, *u.CacheReadInputTokens)
	}
	if cached[0] != 0 || cached[1] == 0 {
		t.Errorf("cache_read_input_tokens %v: want the system prompt read from the cache the second time", cached)
	}

	// Without --enable-prompt-tokens-details the cache fields are absent
	// and input_tokens counts the whole prompt.
	cfg := testConfig()
	cfg.EnablePromptTokensDetails = false
	_, plain := newTestServer(t, cfg)
	_, b := post(t, plain.URL+"/v1/messages", `{"model":"llama","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`)
	if strings.Contains(string(b), "cache_") {
		t.Errorf("cache fields without prompt tokens details: %s", b)
	}
}

func TestMessagesStreamEvents(t *testing.T) {
	_, ts := newTestServer(t, testConfig())
	body := `{"model":"llama","max_tokens":3,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
	evs := stream(t, ts.URL+"/v1/messages", body)
	want := []string{vllm.EventMessageStart, vllm.EventContentBlockStart, vllm.EventContentBlockDelta, vllm.EventContentBlockDelta,
		vllm.EventContentBlockDelta, vllm.EventContentBlockStop, vllm.EventMessageDelta, vllm.EventMessageStop}
	if !slices.Equal(names(evs), want) {
		t.Fatalf("events %v\nwant %v", names(evs), want)
	}
	var start struct {
		Type    string                     `json:"type"`
		Message map[string]json.RawMessage `json:"message"`
	}
	_ = json.Unmarshal([]byte(evs[0].data), &start)
	// vLLM writes message_start with exclude_unset: no type or role, null
	// stop fields, the prompt's tokens and no output yet.
	if _, ok := start.Message["role"]; ok || string(start.Message["stop_reason"]) != "null" || string(start.Message["content"]) != "[]" {
		t.Errorf("message_start: %s", evs[0].data)
	}
	var u vllm.AnthropicUsage
	_ = json.Unmarshal(start.Message["usage"], &u)
	var text string
	for _, e := range evs[1:] {
		var ev vllm.AnthropicStreamEvent
		if err := json.Unmarshal([]byte(e.data), &ev); err != nil || ev.Type != e.name {
			t.Fatalf("event %s: %s", e.name, e.data)
		}
		switch ev.Type {
		case vllm.EventContentBlockStart:
			if *ev.Index != 0 || ev.ContentBlock.Type != "text" || *ev.ContentBlock.Text != "" {
				t.Errorf("block start: %s", e.data)
			}
		case vllm.EventContentBlockDelta:
			if ev.Delta.Type != "text_delta" {
				t.Errorf("delta: %s", e.data)
			}
			text += *ev.Delta.Text
		case vllm.EventMessageDelta:
			if *ev.Delta.StopReason != vllm.AnthropicStopMaxTokens || ev.Usage.OutputTokens != 3 || ev.Usage.CacheReadInputTokens == nil ||
				ev.Usage.InputTokens+*ev.Usage.CacheReadInputTokens != u.InputTokens {
				t.Errorf("message_delta: %s (message_start input %d)", e.data, u.InputTokens)
			}
		}
	}
	var m vllm.AnthropicMessagesResponse
	postOK(t, ts.URL+"/v1/messages", strings.Replace(body, `"stream":true`, `"stream":false`, 1), &m)
	if text != *m.Content[0].Text {
		t.Errorf("streamed %q, not streamed %q", text, *m.Content[0].Text)
	}
}

func TestMessagesToolUse(t *testing.T) {
	_, ts := newTestServer(t, testConfig())
	tools := `"tools":[{"name":"get_weather","description":"the weather","input_schema":` + weatherSchema + `}]`
	tests := []struct {
		choice, stop string
	}{
		// any is vLLM's "required": tool_calls, hence tool_use; a named
		// tool finishes with "stop", which vLLM maps to end_turn.
		{`{"type":"any"}`, vllm.AnthropicStopToolUse},
		{`{"type":"tool","name":"get_weather"}`, vllm.AnthropicStopEndTurn},
	}
	for _, tc := range tests {
		t.Run(tc.choice, func(t *testing.T) {
			body := `{"model":"llama","max_tokens":200,"messages":[{"role":"user","content":"weather?"}],` + tools + `,"tool_choice":` + tc.choice
			var m vllm.AnthropicMessagesResponse
			postOK(t, ts.URL+"/v1/messages", body+`}`, &m)
			if len(m.Content) != 1 || m.Content[0].Type != "tool_use" || m.Content[0].Name != "get_weather" || *m.StopReason != tc.stop {
				t.Fatalf("answer: %+v", m)
			}
			validateJSON(t, weatherSchema, string(m.Content[0].Input))

			evs := stream(t, ts.URL+"/v1/messages", body+`,"stream":true}`)
			var partial string
			for _, e := range evs {
				var ev vllm.AnthropicStreamEvent
				_ = json.Unmarshal([]byte(e.data), &ev)
				switch ev.Type {
				case vllm.EventContentBlockStart:
					if ev.ContentBlock.Type != "tool_use" || !strings.HasPrefix(ev.ContentBlock.ID, "chatcmpl-tool-") ||
						ev.ContentBlock.Name != "get_weather" || string(ev.ContentBlock.Input) != "{}" {
						t.Errorf("block start: %s", e.data)
					}
				case vllm.EventContentBlockDelta:
					if ev.Delta.Type != "input_json_delta" {
						t.Errorf("delta: %s", e.data)
					}
					partial += *ev.Delta.PartialJSON
				case vllm.EventMessageDelta:
					if *ev.Delta.StopReason != tc.stop {
						t.Errorf("message_delta: %s", e.data)
					}
				}
			}
			// The same arguments: streamed as the model wrote them, then as
			// vLLM writes the parsed input (compact).
			var a, b any
			if json.Unmarshal([]byte(partial), &a) != nil || json.Unmarshal(m.Content[0].Input, &b) != nil || !reflect.DeepEqual(a, b) {
				t.Errorf("streamed input %q, not streamed %s", partial, m.Content[0].Input)
			}
		})
	}
}

func TestMessagesCountTokensAndErrors(t *testing.T) {
	_, ts := newTestServer(t, testConfig())
	// count_tokens counts what /tokenize counts for the same chat.
	var tr vllm.TokenizeResponse
	postOK(t, ts.URL+"/tokenize", `{"model":"llama","messages":[{"role":"system","content":"sys"},{"role":"user","content":"Hi there"}]}`, &tr)
	var ct vllm.AnthropicCountTokensResponse
	postOK(t, ts.URL+"/v1/messages/count_tokens", `{"model":"llama","system":"sys","messages":[{"role":"user","content":"Hi there"}]}`, &ct)
	if ct.InputTokens != tr.Count || ct.ContextManagement == nil || ct.ContextManagement.OriginalInputTokens != tr.Count {
		t.Errorf("count_tokens %+v, tokenize %d", ct, tr.Count)
	}
	tests := []struct {
		name, path, body string
		status           int
		errType, msg     string
	}{
		{"unknown model", "/v1/messages", `{"model":"claude","max_tokens":1,"messages":[{"role":"user","content":"x"}]}`, 404, "NotFoundError", "The model `claude` does not exist."},
		{"unknown model count", "/v1/messages/count_tokens", `{"model":"claude","messages":[{"role":"user","content":"x"}]}`, 404, "NotFoundError", "does not exist"},
		{"no max tokens", "/v1/messages", `{"model":"llama","messages":[{"role":"user","content":"x"}]}`, 400, "BadRequestError", "max_tokens"},
		{"zero max tokens", "/v1/messages", `{"model":"llama","max_tokens":0,"messages":[{"role":"user","content":"x"}]}`, 400, "BadRequestError", "max_tokens must be positive"},
		{"no messages", "/v1/messages", `{"model":"llama","max_tokens":1,"messages":[]}`, 400, "BadRequestError", "at least one item"},
		{"auto tools need the flags", "/v1/messages", `{"model":"llama","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"f","input_schema":{}}]}`, 400, "BadRequestError", "--enable-auto-tool-choice"},
		{"tool without name", "/v1/messages", `{"model":"llama","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"f","input_schema":{}}],"tool_choice":{"type":"tool"}}`, 400, "BadRequestError", "tool_choice.name is required"},
		{"too long", "/v1/messages", `{"model":"llama","max_tokens":5000,"messages":[{"role":"user","content":"x"}]}`, 400, "BadRequestError", "maximum context length"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := post(t, ts.URL+tc.path, tc.body)
			var e vllm.AnthropicErrorResponse
			if err := json.Unmarshal(b, &e); err != nil || resp.StatusCode != tc.status {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			if e.Type != "error" || e.Error.Type != tc.errType || !strings.Contains(e.Error.Message, tc.msg) {
				t.Errorf("body %s", b)
			}
		})
	}
}

func TestChatToolCalls(t *testing.T) {
	_, ts := newTestServer(t, testConfig())
	msgs := `"messages":[{"role":"user","content":"what is the weather? use get_weather"}]`
	tests := []struct {
		name, choice, finish string
		content              *string
	}{
		// A named call finishes with "stop" (OpenAI's and vLLM's
		// convention), "required" with "tool_calls"; content is "" beside
		// either.
		{"named", `{"type":"function","function":{"name":"get_weather"}}`, "stop", new(string)},
		{"required picks the tool the user names", `"required"`, "tool_calls", new(string)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body := `{"model":"llama",` + msgs + `,` + chatTools + `,"tool_choice":` + tc.choice
			var c struct {
				Choices []struct {
					Message struct {
						Content   *string         `json:"content"`
						ToolCalls []vllm.ToolCall `json:"tool_calls"`
					} `json:"message"`
					FinishReason string `json:"finish_reason"`
				} `json:"choices"`
				Usage vllm.Usage `json:"usage"`
			}
			postOK(t, ts.URL+"/v1/chat/completions", body+`}`, &c)
			ch := c.Choices[0]
			if ch.FinishReason != tc.finish || ch.Message.Content == nil || *ch.Message.Content != *tc.content || len(ch.Message.ToolCalls) != 1 {
				t.Fatalf("choice: %+v", ch)
			}
			call := ch.Message.ToolCalls[0]
			if call.Type != "function" || call.Function.Name != "get_weather" || !strings.HasPrefix(call.ID, "chatcmpl-tool-") {
				t.Errorf("call: %+v", call)
			}
			validateJSON(t, weatherSchema, call.Function.Arguments)

			// Streamed, the pieces add up to the same call.
			evs := stream(t, ts.URL+"/v1/chat/completions", body+`,"stream":true,"stream_options":{"include_usage":true}}`)
			var args, id, name, finish string
			for _, e := range evs[1:] {
				if e.data == "[DONE]" {
					break
				}
				var chunk vllm.ChatCompletionChunk
				if err := json.Unmarshal([]byte(e.data), &chunk); err != nil {
					t.Fatal(err)
				}
				if len(chunk.Choices) == 0 {
					if chunk.Usage.CompletionTokens != c.Usage.CompletionTokens {
						t.Errorf("streamed usage %+v, not streamed %+v", chunk.Usage, c.Usage)
					}
					continue
				}
				d := chunk.Choices[0].Delta
				if d.Content != nil {
					t.Errorf("content beside a call: %s", e.data)
				}
				for _, tcall := range d.ToolCalls {
					if tcall.ID != "" {
						if id != "" {
							t.Errorf("second id: %s", e.data)
						}
						id, name = tcall.ID, tcall.Function.Name
					}
					args += tcall.Function.Arguments
				}
				if f := chunk.Choices[0].FinishReason; f != nil {
					finish = *f
				}
			}
			if name != "get_weather" || finish != tc.finish || args != call.Function.Arguments || id == "" {
				t.Errorf("streamed call %s(%s) id %q finish %q; not streamed %s", name, args, id, finish, call.Function.Arguments)
			}
		})
	}
}

func TestChatAutoToolChoice(t *testing.T) {
	// Without the flags, "auto" (the default with tools) is refused.
	_, plain := newTestServer(t, testConfig())
	resp, b := post(t, plain.URL+"/v1/chat/completions", `{"model":"llama","messages":[{"role":"user","content":"x"}],`+chatTools+`}`)
	if resp.StatusCode != 400 || !strings.Contains(string(b), `\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set`) {
		t.Errorf("auto without flags: %d %s", resp.StatusCode, b)
	}
	// "none" is fine: the tools are only rendered.
	if resp, b := post(t, plain.URL+"/v1/chat/completions", `{"model":"llama","messages":[{"role":"user","content":"x"}],`+chatTools+`,"tool_choice":"none"}`); resp.StatusCode != 200 || strings.Contains(string(b), `"tool_calls":[{`) {
		t.Errorf("tool_choice none: %d %s", resp.StatusCode, b)
	}

	cfg := testConfig()
	cfg.EnableAutoToolChoice, cfg.ToolCallParser = true, "llama3_json"
	_, ts := newTestServer(t, cfg)
	tests := []struct {
		name, messages string
		call           string // "" for a text answer
	}{
		{"the user asks: a call of the first tool", `[{"role":"user","content":"hello"}]`, "get_time"},
		{"the user names a tool", `[{"role":"user","content":"call get_weather please"}]`, "get_weather"},
		{"after the tool's result: text", `[{"role":"user","content":"hello"},{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"get_time","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"noon"}]`, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var c struct {
				Choices []struct {
					Message struct {
						Content   *string         `json:"content"`
						ToolCalls []vllm.ToolCall `json:"tool_calls"`
					} `json:"message"`
					FinishReason string `json:"finish_reason"`
				} `json:"choices"`
			}
			raw := postOK(t, ts.URL+"/v1/chat/completions", `{"model":"llama","max_tokens":100,"messages":`+tc.messages+`,`+chatTools+`}`, &c)
			ch := c.Choices[0]
			if tc.call == "" {
				if len(ch.Message.ToolCalls) != 0 || ch.Message.Content == nil || *ch.Message.Content == "" || ch.FinishReason != "length" {
					t.Errorf("want text: %s", raw)
				}
				return
			}
			// An auto-tool parser leaves content null beside the call.
			if len(ch.Message.ToolCalls) != 1 || ch.Message.ToolCalls[0].Function.Name != tc.call || ch.Message.Content != nil || ch.FinishReason != "tool_calls" {
				t.Errorf("want a call of %s: %s", tc.call, raw)
			}
		})
	}
}

func TestChatToolErrors(t *testing.T) {
	_, ts := newTestServer(t, testConfig())
	tests := []struct{ name, extra, msg string }{
		{"choice without tools", `"tool_choice":"required"`, "When using `tool_choice`, `tools` must be set."},
		{"unknown named tool", chatTools + `,"tool_choice":{"type":"function","function":{"name":"nope"}}`, "does not match any of the specified `tools`"},
		{"bad choice", chatTools + `,"tool_choice":"sometimes"`, "Invalid value for `tool_choice`: sometimes!"},
		{"no name", chatTools + `,"tool_choice":{"type":"function","function":{}}`, "Expected field `name`"},
		{"tool schema the simulator cannot follow", `"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"string","pattern":"x"}}}}}],"tool_choice":"required"`, `tools[f].parameters: cannot generate JSON for this schema: keyword`},
		{"structural tag", `"response_format":{"type":"structural_tag"}`, "not emulated"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := post(t, ts.URL+"/v1/chat/completions", `{"model":"llama","messages":[{"role":"user","content":"x"}],`+tc.extra+`}`)
			if resp.StatusCode != 400 || !strings.Contains(string(b), tc.msg) {
				t.Errorf("%d %s, want 400 with %q", resp.StatusCode, b, tc.msg)
			}
		})
	}
}

func TestResponseFormat(t *testing.T) {
	_, ts := newTestServer(t, testConfig())
	schema := `{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0},"tags":{"type":"array","items":{"type":"string"}}},"required":["name","age"]}`
	t.Run("chat json_object", func(t *testing.T) {
		var c vllm.ChatCompletion
		postOK(t, ts.URL+"/v1/chat/completions", `{"model":"llama","messages":[{"role":"user","content":"json please"}],"response_format":{"type":"json_object"}}`, &c)
		var v map[string]any
		if err := json.Unmarshal([]byte(c.Choices[0].Message.Content), &v); err != nil || *c.Choices[0].FinishReason != "stop" {
			t.Errorf("content %q (finish %s) is not a JSON object: %v", c.Choices[0].Message.Content, *c.Choices[0].FinishReason, err)
		}
	})
	t.Run("chat json_schema", func(t *testing.T) {
		var c vllm.ChatCompletion
		postOK(t, ts.URL+"/v1/chat/completions", `{"model":"llama","messages":[{"role":"user","content":"a person"}],"response_format":{"type":"json_schema","json_schema":{"name":"p","schema":`+schema+`}}}`, &c)
		validateJSON(t, schema, c.Choices[0].Message.Content)
		if c.Usage.CompletionTokens <= 16 {
			t.Logf("completion tokens %d", c.Usage.CompletionTokens)
		}
	})
	t.Run("completions json_schema streamed", func(t *testing.T) {
		evs := stream(t, ts.URL+"/v1/completions", `{"model":"llama","prompt":"a person","stream":true,"response_format":{"type":"json_schema","json_schema":{"name":"p","schema":`+schema+`}}}`)
		var text string
		for _, e := range evs {
			if e.data == "[DONE]" {
				break
			}
			var c vllm.Completion
			_ = json.Unmarshal([]byte(e.data), &c)
			text += c.Choices[0].Text
		}
		validateJSON(t, schema, text)
	})
	t.Run("responses json_schema", func(t *testing.T) {
		var r vllm.ResponsesResponse
		postOK(t, ts.URL+"/v1/responses", `{"model":"llama","input":"a person","text":{"format":{"type":"json_schema","name":"p","schema":`+schema+`}}}`, &r)
		if r.Status != "completed" {
			t.Errorf("status %q", r.Status)
		}
		validateJSON(t, schema, r.Output[0].Content[0].Text)
	})
	t.Run("messages output_config", func(t *testing.T) {
		var m vllm.AnthropicMessagesResponse
		postOK(t, ts.URL+"/v1/messages", `{"model":"llama","max_tokens":300,"messages":[{"role":"user","content":"a person"}],"output_config":{"format":{"type":"json_schema","schema":`+schema+`}}}`, &m)
		validateJSON(t, schema, *m.Content[0].Text)
		if *m.StopReason != vllm.AnthropicStopEndTurn {
			t.Errorf("stop reason %q", *m.StopReason)
		}
	})
	t.Run("cut by max_tokens", func(t *testing.T) {
		var c vllm.ChatCompletion
		postOK(t, ts.URL+"/v1/chat/completions", `{"model":"llama","max_tokens":3,"messages":[{"role":"user","content":"a person"}],"response_format":{"type":"json_schema","json_schema":{"name":"p","schema":`+schema+`}}}`, &c)
		if *c.Choices[0].FinishReason != "length" || c.Usage.CompletionTokens != 3 || json.Valid([]byte(c.Choices[0].Message.Content)) {
			t.Errorf("want 3 tokens of cut JSON: %+v %q", c.Usage, c.Choices[0].Message.Content)
		}
	})
}

func TestLogprobs(t *testing.T) {
	_, ts := newTestServer(t, testConfig())
	t.Run("chat", func(t *testing.T) {
		var c struct {
			Choices []struct {
				Logprobs *vllm.ChatLogprobs `json:"logprobs"`
				Message  vllm.AssistantMessage
			} `json:"choices"`
		}
		postOK(t, ts.URL+"/v1/chat/completions", chatBody("hi", `,"max_tokens":4,"logprobs":true,"top_logprobs":3`), &c)
		lps := c.Choices[0].Logprobs
		if lps == nil || len(lps.Content) != 4 {
			t.Fatalf("logprobs: %+v", lps)
		}
		var text string
		for _, lp := range lps.Content {
			text += lp.Token
			if lp.Logprob > 0 || string(intsToBytes(lp.Bytes)) != lp.Token || len(lp.TopLogprobs) != 3 ||
				lp.TopLogprobs[0].Token != lp.Token || lp.TopLogprobs[0].Logprob != lp.Logprob ||
				!(lp.TopLogprobs[1].Logprob < lp.TopLogprobs[0].Logprob && lp.TopLogprobs[2].Logprob < lp.TopLogprobs[1].Logprob) {
				t.Errorf("entry %+v", lp)
			}
		}
		if text != c.Choices[0].Message.Content {
			t.Errorf("tokens %q, content %q", text, c.Choices[0].Message.Content)
		}
		// Deterministic: the same request, the same figures.
		var again struct {
			Choices []struct {
				Logprobs *vllm.ChatLogprobs `json:"logprobs"`
			} `json:"choices"`
		}
		postOK(t, ts.URL+"/v1/chat/completions", chatBody("hi", `,"max_tokens":4,"logprobs":true,"top_logprobs":3`), &again)
		if again.Choices[0].Logprobs.Content[2].Logprob != lps.Content[2].Logprob {
			t.Error("logprobs differ between equal requests")
		}
	})
	t.Run("chat without top", func(t *testing.T) {
		evs := stream(t, ts.URL+"/v1/chat/completions", chatBody("hi", `,"max_tokens":2,"logprobs":true,"stream":true`))
		for _, e := range evs[1:3] {
			var chunk struct {
				Choices []struct {
					Logprobs *vllm.ChatLogprobs `json:"logprobs"`
				} `json:"choices"`
			}
			_ = json.Unmarshal([]byte(e.data), &chunk)
			lp := chunk.Choices[0].Logprobs
			if lp == nil || len(lp.Content) != 1 || lp.Content[0].TopLogprobs == nil || len(lp.Content[0].TopLogprobs) != 0 {
				t.Errorf("chunk %s", e.data)
			}
		}
	})
	t.Run("completions", func(t *testing.T) {
		var c struct {
			Choices []struct {
				Text     string                   `json:"text"`
				Logprobs *vllm.CompletionLogprobs `json:"logprobs"`
			} `json:"choices"`
		}
		postOK(t, ts.URL+"/v1/completions", `{"model":"llama","prompt":"hello","max_tokens":3,"logprobs":2}`, &c)
		lp := c.Choices[0].Logprobs
		if lp == nil || len(lp.Tokens) != 3 || len(lp.TokenLogprobs) != 3 || len(lp.TopLogprobs) != 3 || len(lp.TextOffset) != 3 {
			t.Fatalf("logprobs %+v", lp)
		}
		for i, tok := range lp.Tokens {
			if c.Choices[0].Text[lp.TextOffset[i]:lp.TextOffset[i]+len(tok)] != tok {
				t.Errorf("token %d %q not at offset %d of %q", i, tok, lp.TextOffset[i], c.Choices[0].Text)
			}
			if len(lp.TopLogprobs[i]) != 2 || lp.TopLogprobs[i][0].Token != tok || lp.TopLogprobs[i][0].Logprob != lp.TokenLogprobs[i] {
				t.Errorf("top %d: %+v", i, lp.TopLogprobs[i])
			}
		}
	})
	t.Run("off by default", func(t *testing.T) {
		_, b := post(t, ts.URL+"/v1/chat/completions", chatBody("hi", `,"max_tokens":1`))
		if !strings.Contains(string(b), `"logprobs":null`) {
			t.Errorf("%s", b)
		}
	})
	for _, tc := range []struct{ name, path, body, msg string }{
		{"top without logprobs", "/v1/chat/completions", chatBody("hi", `,"top_logprobs":2`), "`logprobs` must be set to true"},
		{"over the limit", "/v1/chat/completions", chatBody("hi", `,"logprobs":true,"top_logprobs":21`), "greater than max allowed: 20"},
		{"completions over the limit", "/v1/completions", `{"prompt":"x","logprobs":30}`, "greater than max allowed: 20"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := post(t, ts.URL+tc.path, tc.body)
			if resp.StatusCode != 400 || !strings.Contains(string(b), tc.msg) {
				t.Errorf("%d %s", resp.StatusCode, b)
			}
		})
	}
}

func intsToBytes(is []int) []byte {
	b := make([]byte, len(is))
	for i, x := range is {
		b[i] = byte(x)
	}
	return b
}

// TestCreatedIsRequestTime: answers carry the request's time, not the
// engine's start (issue 31: twelve minutes stale).
func TestCreatedIsRequestTime(t *testing.T) {
	clock := &setClock{now: time.Unix(1700000000, 0)}
	_, ts := newTestServer(t, testConfig(), WithClock(clock))
	clock.set(time.Unix(1700000720, 0))
	var c vllm.ChatCompletion
	postOK(t, ts.URL+"/v1/chat/completions", chatBody("hi", `,"max_tokens":1`), &c)
	var p vllm.Completion
	postOK(t, ts.URL+"/v1/completions", `{"prompt":"x","max_tokens":1}`, &p)
	evs := stream(t, ts.URL+"/v1/chat/completions", chatBody("hi", `,"max_tokens":1,"stream":true`))
	var chunk vllm.ChatCompletionChunk
	_ = json.Unmarshal([]byte(evs[0].data), &chunk)
	var m vllm.ModelList
	resp, err := http.Get(ts.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	_ = json.NewDecoder(resp.Body).Decode(&m)
	resp.Body.Close()
	for what, got := range map[string]int64{"chat": c.Created, "completion": p.Created, "chunk": chunk.Created, "model card": m.Data[0].Created} {
		if got != 1700000720 {
			t.Errorf("%s created %d, want the request's time 1700000720", what, got)
		}
	}
}

// TestSimMetricNames: the abort counter is registered from the start, at
// zero, beside vLLM's.
func TestSimMetricNames(t *testing.T) {
	s, _ := newTestServer(t, testConfig())
	for _, reason := range []string{AbortReasonClient, AbortReasonEngine} {
		if _, ok, _ := testkit.Gathered(s.met.reg, MetricSimAbortedRequests, testkit.Labels{LabelAbortReason: reason}); !ok {
			t.Errorf("%s{reason=%q} is not registered", MetricSimAbortedRequests, reason)
		}
	}
}

// TestToolConversationCostsTheSameEverywhere: one conversation with a tool
// call and its result, as chat messages and as Anthropic messages, renders
// to the same prompt (vLLM renders both through one template, tools as
// model_dump'ed chat tools).
func TestToolConversationCostsTheSameEverywhere(t *testing.T) {
	_, ts := newTestServer(t, testConfig())
	var tr vllm.TokenizeResponse
	postOK(t, ts.URL+"/tokenize", `{"model":"llama","messages":[{"role":"system","content":"sys"},{"role":"user","content":"weather?"},`+
		`{"role":"assistant","tool_calls":[{"id":"t1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},`+
		`{"role":"tool","tool_call_id":"t1","content":"sunny"}],`+
		`"tools":[{"type":"function","function":{"name":"get_weather","description":"the weather","parameters":`+weatherSchema+`}}]}`, &tr)
	var ct vllm.AnthropicCountTokensResponse
	postOK(t, ts.URL+"/v1/messages/count_tokens", `{"model":"llama","system":"sys","messages":[{"role":"user","content":"weather?"},`+
		`{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"get_weather","input":{"city":"Paris"}}]},`+
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"sunny"}]}],`+
		`"tools":[{"name":"get_weather","description":"the weather","input_schema":`+weatherSchema+`}]}`, &ct)
	if ct.InputTokens != tr.Count {
		t.Errorf("Messages count %d, chat %d", ct.InputTokens, tr.Count)
	}
	var r vllm.ResponsesResponse
	postOK(t, ts.URL+"/v1/responses", `{"model":"llama","max_output_tokens":1,"instructions":"sys","input":[{"role":"user","content":"weather?"},`+
		`{"type":"function_call","call_id":"t1","name":"get_weather","arguments":"{\"city\": \"Paris\"}"},`+
		`{"type":"function_call_output","call_id":"t1","output":"sunny"}],`+
		`"tools":[{"type":"function","name":"get_weather","description":"the weather","parameters":`+weatherSchema+`}],"tool_choice":"none"}`, &r)
	if r.Usage.InputTokens != tr.Count {
		t.Errorf("Responses input %d, chat %d", r.Usage.InputTokens, tr.Count)
	}
}
