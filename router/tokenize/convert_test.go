package tokenize

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/llmgw/llmgw/vllm"
)

// TestPythonJSON: a tool call's input is written as Python's json.dumps
// writes it (the expectations are Python 3's own output), and what Python
// would write otherwise — floats, a repeated key — is refused.
func TestPythonJSON(t *testing.T) {
	tests := []struct {
		in, want string
		err      error
	}{
		{`{"path":"/tmp/ä","n":[1,-0,12345678901234567890],"ok":true,"x":null,"e":{},"l":[],"s":"\u2028\t\u0001😀"}`,
			`{"path": "/tmp/\u00e4", "n": [1, 0, 12345678901234567890], "ok": true, "x": null, "e": {}, "l": [], "s": "\u2028\t\u0001\ud83d\ude00"}`, nil},
		{` { "b" : 1 , "a" : [ "\"\\/" , "` + "\x7f" + `" ] } `, `{"b": 1, "a": ["\"\\/", "\u007f"]}`, nil},
		{`{"t":1.5}`, "", ErrUnsupported},
		{`{"t":1e3}`, "", ErrUnsupported},
		{`{"a":1,"a":2}`, "", ErrUnsupported},
		{`{"a":1} {}`, "", ErrUnsupported},
	}
	for _, tt := range tests {
		got, err := pythonJSON([]byte(tt.in))
		if !errors.Is(err, tt.err) || got != tt.want {
			t.Errorf("pythonJSON(%s) = %s, %v; want %s, %v", tt.in, got, err, tt.want, tt.err)
		}
	}
}

// TestPrepareMessages: an Anthropic Messages request is tokenized in the
// chat form vLLM turns it into (vllm/entrypoints/anthropic/serving.py):
// one system message from the system field and the system-role
// messages, a user's tool results as tool messages ahead of the rest of
// its message, tool uses as tool calls, thinking as reasoning, tools as
// OpenAI functions.
func TestPrepareMessages(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    string // the /tokenize body
		wantErr error
	}{
		{"strings", `{"model":"claude","max_tokens":5,"system":"be brief","messages":[{"role":"user","content":"hi"}],"temperature":0.2,"stream":true}`,
			`{"messages":[{"content":"be brief","role":"system"},{"content":"hi","role":"user"}],"model":"base"}`, nil},
		{"blocks", `{"model":"c","max_tokens":5,
			"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1; cch=00000;"},{"type":"text","text":"You are "},{"type":"text","text":"Claude Code."}],
			"messages":[
				{"role":"user","content":[{"type":"text","text":"read a"}]},
				{"role":"assistant","content":[{"type":"thinking","thinking":"need a","signature":"s"},{"type":"text","text":"reading"},{"type":"tool_use","id":"tu_1","name":"Read","input":{"path":"a","lines":[1,2]}}]},
				{"role":"user","content":[{"type":"tool_result","tool_use_id":"tu_1","content":[{"type":"text","text":"line1"},{"type":"text","text":"line2"}]},{"type":"text","text":"and?"},{"type":"text","text":"go"}]},
				{"role":"system","content":" Be kind."},
				{"role":"user","content":[{"type":"tool_result","tool_use_id":"tu_2","content":"done"}]}],
			"tools":[{"name":"Read","description":"reads","input_schema":{"properties":{"path":{"type":"string"}}}},{"name":"Bash","input_schema":{"type":"object"},"defer_loading":true}],
			"chat_template_kwargs":{"enable_thinking":true}}`,
			`{"chat_template_kwargs":{"enable_thinking":true},"messages":[` +
				`{"content":"You are Claude Code. Be kind.","role":"system"},` +
				`{"content":"read a","role":"user"},` +
				`{"content":"reading","reasoning":"need a","role":"assistant","tool_calls":[{"function":{"arguments":"{\"path\": \"a\", \"lines\": [1, 2]}","name":"Read"},"id":"tu_1","type":"function"}]},` +
				`{"content":"line1\nline2","role":"tool","tool_call_id":"tu_1"},` +
				`{"content":[{"text":"and?","type":"text"},{"text":"go","type":"text"}],"role":"user"},` +
				`{"content":"done","role":"tool","tool_call_id":"tu_2"}],"model":"base",` +
				`"tools":[{"function":{"defer_loading":null,"description":"reads","name":"Read","parameters":{"properties":{"path":{"type":"string"}},"type":"object"}},"type":"function"},` +
				`{"function":{"defer_loading":true,"description":null,"name":"Bash","parameters":{"type":"object"}},"type":"function"}]}`, nil},
		{"assistant without content", `{"model":"c","max_tokens":5,"messages":[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"redacted_thinking","data":"x"}]},{"role":"user","content":[{"type":"text","text":""}]}]}`,
			`{"messages":[{"content":"a","role":"user"},{"role":"assistant"}],"model":"base"}`, nil},
		{"an image", `{"model":"c","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","data":"AA=="}}]}]}`, "", ErrMultimodal},
		{"an image in a tool result", `{"model":"c","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"image","source":{}}]}]}]}`, "", ErrMultimodal},
		{"a float in a tool call", `{"model":"c","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"x":0.5}}]}]}`, "", ErrUnsupported},
		{"a tool use without an id", `{"model":"c","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_use","name":"f","input":{}}]}]}`, "", ErrUnsupported},
		{"effort", `{"model":"c","max_tokens":5,"output_config":{"effort":"high"},"messages":[{"role":"user","content":"a"}]}`, "", ErrUnsupported},
		{"no messages", `{"model":"c","max_tokens":5,"messages":[]}`, "", ErrUnsupported},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Prepare(Messages, "base", []byte(tt.body))
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Prepare error = %v, want %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			checkBody(t, r.body, tt.want)
		})
	}
}

// TestPrepareResponses: a Responses API request is tokenized in the chat
// form of vLLM's construct_input_messages; what vLLM renders otherwise
// (tools, reasoning settings, a stored conversation) goes to tier 1.
func TestPrepareResponses(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    string
		wantErr error
	}{
		{"string", `{"model":"m","instructions":"be brief","input":"hi","max_output_tokens":9}`,
			`{"messages":[{"content":"be brief","role":"system"},{"content":"hi","role":"user"}],"model":"base"}`, nil},
		{"items", `{"model":"m","input":[
				{"role":"developer","content":"rules"},
				{"type":"message","role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]},
				{"type":"function_call","id":"fc_1","call_id":"c1","name":"f","arguments":"{\"x\":1}"},
				{"type":"function_call_output","call_id":"c1","output":"42"},
				{"type":"message","role":"assistant","status":"incomplete","content":[{"type":"output_text","text":"The answer"}]}],
			"tools":[{"type":"function","name":"f","parameters":{}}],"tool_choice":"none"}`,
			`{"add_generation_prompt":false,"continue_final_message":true,"messages":[{"content":"rules","role":"developer"},` +
				`{"content":[{"text":"a","type":"text"},{"text":"b","type":"text"}],"role":"user"},` +
				`{"role":"assistant","tool_calls":[{"function":{"arguments":"{\"x\":1}","name":"f"},"id":"c1","type":"function"}]},` +
				`{"content":"42","role":"tool","tool_call_id":"c1"},` +
				`{"content":[{"text":"The answer","type":"text"}],"role":"assistant"}],"model":"base"}`, nil},
		{"tools", `{"model":"m","input":"hi","tools":[{"type":"function","name":"f","parameters":{}}]}`, "", ErrUnsupported},
		{"reasoning", `{"model":"m","input":"hi","reasoning":{"effort":"low"}}`, "", ErrUnsupported},
		{"previous response", `{"model":"m","input":"hi","previous_response_id":"resp_1"}`, "", ErrUnsupported},
		{"an image", `{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]}`, "", ErrMultimodal},
		{"a reasoning item", `{"model":"m","input":[{"type":"reasoning","summary":[]}]}`, "", ErrUnsupported},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Prepare(Responses, "base", []byte(tt.body))
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Prepare error = %v, want %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			checkBody(t, r.body, tt.want)
		})
	}
}

// checkBody holds a /tokenize body against want (both as canonical JSON)
// and against vLLM's own decoding of one.
func checkBody(t *testing.T, body []byte, want string) {
	t.Helper()
	var got, exp any
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(want), &exp); err != nil {
		t.Fatalf("the test's want: %v", err)
	}
	if g, w := mustJSON(t, got), mustJSON(t, exp); g != w {
		t.Errorf("body =\n%s\nwant\n%s", g, w)
	}
	if _, err := vllm.DecodeTokenizeRequest(body); err != nil {
		t.Errorf("vLLM's decoder refuses the body: %v", err)
	}
}

// TestPrepareNone: a request tier 2 does not route by is never prepared.
func TestPrepareNone(t *testing.T) {
	if _, err := Prepare(None, "base", []byte(`{"model":"m","messages":[{"role":"user","content":"a"}]}`)); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("Prepare(None) = %v, want ErrUnsupported", err)
	}
}
