package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/llmgw/llmgw/internal/testkit"
	"github.com/llmgw/llmgw/sim"
)

// TestAgentAPIs (issue 31) drives the agent APIs through llmgw against the
// simulator, with API keys required: the official openai-go client's
// Responses (create, stream, a tool call round trip) and anthropic-sdk-go's
// Messages (create, stream, tool use, count_tokens), each API's refusals in
// its own error shape; then, for all four generating APIs, a client that
// goes away mid-stream: the engine must see the abort. The delay from the
// client's close to the engine's count is logged (docs/benchmarks.md, "Agent
// APIs (issue 31)"), asserted only within a generous scaled bound.
func TestAgentAPIs(t *testing.T) {
	d := startDev(t, "--sim-decode-ms-per-token", "5")
	out, err := d.ctl("apikey", "create", "agent", "-o", "json")
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var k struct{ Secret string }
	if err := json.Unmarshal([]byte(out), &k); err != nil || !strings.HasPrefix(k.Secret, "sk-llmgw-") {
		t.Fatalf("apikey create printed %q (%v)", out, err)
	}
	key := k.Secret
	if !eventually(10*time.Second, func() bool { code, _ := chatAs(d.http, "demo", ""); return code == http.StatusUnauthorized }) {
		t.Fatal("keys never became required after the first key")
	}
	ctx, cancel := context.WithTimeout(context.Background(), within(60*time.Second))
	defer cancel()

	t.Run("openai responses", func(t *testing.T) { testResponsesSDK(ctx, t, d, key) })
	t.Run("anthropic messages", func(t *testing.T) { testMessagesSDK(ctx, t, d, key) })
	t.Run("client abort reaches the engine", func(t *testing.T) { testAgentAborts(ctx, t, d, key) })
}

func testResponsesSDK(ctx context.Context, t *testing.T, d *devProcess, key string) {
	client := openai.NewClient(option.WithBaseURL("http://"+d.http+"/v1"), option.WithAPIKey(key), option.WithMaxRetries(0))
	params := responses.ResponseNewParams{
		Model:           "demo",
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("Say hello")},
		MaxOutputTokens: openai.Int(16),
	}

	t.Run("create", func(t *testing.T) {
		resp, err := client.Responses.New(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Status != responses.ResponseStatusCompleted && resp.Status != responses.ResponseStatusIncomplete {
			t.Fatalf("status %q", resp.Status)
		}
		if resp.OutputText() == "" || resp.Usage.OutputTokens == 0 || resp.Usage.InputTokens == 0 {
			t.Fatalf("text %q usage %+v", resp.OutputText(), resp.Usage)
		}
	})

	t.Run("stream", func(t *testing.T) {
		s := client.Responses.NewStreaming(ctx, params)
		var types []string
		var text strings.Builder
		var done responses.Response
		for s.Next() {
			ev := s.Current()
			types = append(types, ev.Type)
			switch ev.Type {
			case "response.output_text.delta":
				text.WriteString(ev.Delta)
			case "response.completed", "response.incomplete":
				done = ev.Response
			}
		}
		if err := s.Err(); err != nil {
			t.Fatal(err)
		}
		s.Close()
		if len(types) == 0 || types[0] != "response.created" {
			t.Fatalf("events %v: not opened by response.created", types)
		}
		last := types[len(types)-1]
		if last != "response.completed" && last != "response.incomplete" {
			t.Fatalf("events %v: not closed by response.completed", types)
		}
		if text.Len() == 0 || done.OutputText() != text.String() {
			t.Fatalf("deltas %q, final output %q", text.String(), done.OutputText())
		}
		if done.Usage.OutputTokens == 0 || done.Usage.InputTokens == 0 {
			t.Fatalf("final usage %+v", done.Usage)
		}
	})

	t.Run("tool call round trip", func(t *testing.T) {
		tool := responses.ToolParamOfFunction("get_weather", map[string]any{
			"type":       "object",
			"properties": map[string]any{"city": map[string]any{"type": "string"}},
			"required":   []string{"city"},
		}, false)
		input := responses.ResponseInputParam{responses.ResponseInputItemParamOfMessage("What is the weather in Paris?", responses.EasyInputMessageRoleUser)}
		first, err := client.Responses.New(ctx, responses.ResponseNewParams{
			Model:           "demo",
			Input:           responses.ResponseNewParamsInputUnion{OfInputItemList: input},
			Tools:           []responses.ToolUnionParam{tool},
			ToolChoice:      responses.ResponseNewParamsToolChoiceUnion{OfFunctionTool: &responses.ToolChoiceFunctionParam{Name: "get_weather"}},
			MaxOutputTokens: openai.Int(64),
		})
		if err != nil {
			t.Fatal(err)
		}
		var call responses.ResponseFunctionToolCall
		for _, item := range first.Output {
			if item.Type == "function_call" {
				call = item.AsFunctionCall()
			}
		}
		if call.Name != "get_weather" || call.CallID == "" {
			t.Fatalf("no get_weather call in %s", first.RawJSON())
		}
		var args map[string]any
		if err := json.Unmarshal([]byte(call.Arguments), &args); err != nil {
			t.Fatalf("arguments %q: %v", call.Arguments, err)
		}
		if _, ok := args["city"].(string); !ok {
			t.Fatalf("arguments %q lack the required city", call.Arguments)
		}
		output := responses.ResponseInputItemParamOfFunctionCallOutput(`{"temperature_c":18}`)
		output.OfFunctionCallOutput.CallID = openai.String(call.CallID)
		input = append(input,
			responses.ResponseInputItemParamOfFunctionCall(call.Arguments, call.CallID, call.Name),
			output)
		second, err := client.Responses.New(ctx, responses.ResponseNewParams{
			Model:           "demo",
			Input:           responses.ResponseNewParamsInputUnion{OfInputItemList: input},
			Tools:           []responses.ToolUnionParam{tool},
			MaxOutputTokens: openai.Int(16),
		})
		if err != nil {
			t.Fatal(err)
		}
		if second.OutputText() == "" {
			t.Fatalf("no text after the tool's output: %s", second.RawJSON())
		}
		if second.Usage.InputTokens <= first.Usage.InputTokens {
			t.Fatalf("second prompt %d tokens, first %d: the call and its output were not in the prompt", second.Usage.InputTokens, first.Usage.InputTokens)
		}
	})

	t.Run("errors", func(t *testing.T) {
		tests := []struct {
			name   string
			client openai.Client
			model  string
			status int
			code   string
		}{
			{"unknown model", client, "nope", 404, "model_not_found"},
			{"no key", openai.NewClient(option.WithBaseURL("http://"+d.http+"/v1"), option.WithAPIKey(""), option.WithMaxRetries(0)), "demo", 401, ""},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				p := params
				p.Model = tt.model
				_, err := tt.client.Responses.New(ctx, p)
				var apiErr *openai.Error
				if !errors.As(err, &apiErr) {
					t.Fatalf("error %v (%T) is not an *openai.Error", err, err)
				}
				if apiErr.StatusCode != tt.status || apiErr.Message == "" || apiErr.Type == "" || (tt.code != "" && apiErr.Code != tt.code) {
					t.Fatalf("status %d code %q type %q message %q, want %d %s", apiErr.StatusCode, apiErr.Code, apiErr.Type, apiErr.Message, tt.status, tt.code)
				}
			})
		}
	})
}

func testMessagesSDK(ctx context.Context, t *testing.T, d *devProcess, key string) {
	client := anthropic.NewClient(aoption.WithBaseURL("http://"+d.http), aoption.WithAPIKey(key), aoption.WithMaxRetries(0))
	params := anthropic.MessageNewParams{
		Model:     "demo",
		MaxTokens: 16,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Say hello"))},
	}

	t.Run("create", func(t *testing.T) {
		msg, err := client.Messages.New(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		if msg.Role != "assistant" || len(msg.Content) == 0 || msg.Content[0].Type != "text" || msg.Content[0].Text == "" {
			t.Fatalf("message %s", msg.RawJSON())
		}
		if msg.StopReason != anthropic.StopReasonEndTurn && msg.StopReason != anthropic.StopReasonMaxTokens {
			t.Fatalf("stop reason %q", msg.StopReason)
		}
		if msg.Usage.InputTokens == 0 || msg.Usage.OutputTokens == 0 {
			t.Fatalf("usage %s", msg.Usage.RawJSON())
		}
	})

	t.Run("stream", func(t *testing.T) {
		s := client.Messages.NewStreaming(ctx, params)
		var msg anthropic.Message
		var types []string
		for s.Next() {
			ev := s.Current()
			types = append(types, ev.Type)
			if err := msg.Accumulate(ev); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Err(); err != nil {
			t.Fatal(err)
		}
		s.Close()
		if len(types) < 2 || types[0] != "message_start" || types[len(types)-1] != "message_stop" {
			t.Fatalf("events %v: want message_start ... message_stop", types)
		}
		if len(msg.Content) == 0 || msg.Content[0].Text == "" || msg.StopReason == "" {
			t.Fatalf("accumulated %+v", msg)
		}
		if msg.Usage.InputTokens == 0 || msg.Usage.OutputTokens == 0 {
			t.Fatalf("accumulated usage %+v", msg.Usage)
		}
	})

	tool := anthropic.ToolUnionParamOfTool(anthropic.ToolInputSchemaParam{
		Properties: map[string]any{"city": map[string]any{"type": "string"}},
		Required:   []string{"city"},
	}, "get_weather")
	question := anthropic.NewUserMessage(anthropic.NewTextBlock("What is the weather in Paris?"))

	// A named tool (tool_choice tool) runs as vLLM's named tool choice,
	// which finishes "stop": vLLM's Messages endpoint then says end_turn,
	// not tool_use (design §8), and the simulator does as vLLM does. "any"
	// runs as required, which finishes tool_calls: tool_use.
	for _, tc := range []struct {
		name   string
		choice anthropic.ToolChoiceUnionParam
		stop   anthropic.StopReason
	}{
		{"tool use round trip, named tool", anthropic.ToolChoiceParamOfTool("get_weather"), anthropic.StopReasonEndTurn},
		{"tool use round trip, any tool", anthropic.ToolChoiceUnionParam{OfAny: &anthropic.ToolChoiceAnyParam{}}, anthropic.StopReasonToolUse},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first, err := client.Messages.New(ctx, anthropic.MessageNewParams{
				Model:      "demo",
				MaxTokens:  64,
				Messages:   []anthropic.MessageParam{question},
				Tools:      []anthropic.ToolUnionParam{tool},
				ToolChoice: tc.choice,
			})
			if err != nil {
				t.Fatal(err)
			}
			var use anthropic.ToolUseBlock
			for _, b := range first.Content {
				if b.Type == "tool_use" {
					use = b.AsToolUse()
				}
			}
			if use.Name != "get_weather" || use.ID == "" || first.StopReason != tc.stop {
				t.Fatalf("no get_weather tool_use with stop reason %q in %s", tc.stop, first.RawJSON())
			}
			var input map[string]any
			if err := json.Unmarshal(use.Input, &input); err != nil {
				t.Fatalf("input %s: %v", use.Input, err)
			}
			if _, ok := input["city"].(string); !ok {
				t.Fatalf("input %s lacks the required city", use.Input)
			}
			second, err := client.Messages.New(ctx, anthropic.MessageNewParams{
				Model:     "demo",
				MaxTokens: 16,
				Messages: []anthropic.MessageParam{question, first.ToParam(),
					anthropic.NewUserMessage(anthropic.NewToolResultBlock(use.ID, `{"temperature_c":18}`, false))},
				Tools:      []anthropic.ToolUnionParam{tool},
				ToolChoice: anthropic.ToolChoiceUnionParam{OfNone: &anthropic.ToolChoiceNoneParam{}},
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(second.Content) == 0 || second.Content[0].Type != "text" || second.Content[0].Text == "" {
				t.Fatalf("no text after the tool's result: %s", second.RawJSON())
			}
			if promptTokens(second.Usage) <= promptTokens(first.Usage) {
				t.Fatalf("second prompt %d tokens, first %d: the tool_use and its result were not in the prompt", promptTokens(second.Usage), promptTokens(first.Usage))
			}
		})
	}

	t.Run("count tokens", func(t *testing.T) {
		count, err := client.Messages.CountTokens(ctx, anthropic.MessageCountTokensParams{
			Model:    "demo",
			Messages: params.Messages,
		})
		if err != nil {
			t.Fatal(err)
		}
		msg, err := client.Messages.New(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		if count.InputTokens == 0 || count.InputTokens != promptTokens(msg.Usage) {
			t.Fatalf("count_tokens %d, the same request's prompt %d", count.InputTokens, promptTokens(msg.Usage))
		}
	})

	t.Run("errors", func(t *testing.T) {
		tests := []struct {
			name   string
			client anthropic.Client
			params anthropic.MessageNewParams
			status int
			typ    string
		}{
			{"unknown model", client, func() anthropic.MessageNewParams { p := params; p.Model = "nope"; return p }(), 404, "not_found_error"},
			// The router's own refusals carry Anthropic's type for their
			// status; one the engine makes (max_tokens 0) is passed on as
			// the engine wrote it, in Anthropic's shape with vLLM's type
			// (BadRequestError, design §8): only the shape is checked.
			{"max_tokens 0, refused by the engine", client, func() anthropic.MessageNewParams { p := params; p.MaxTokens = 0; return p }(), 400, ""},
			{"no key", anthropic.NewClient(aoption.WithBaseURL("http://"+d.http), aoption.WithAPIKey("sk-llmgw-not-a-key"), aoption.WithMaxRetries(0)), params, 401, "authentication_error"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				_, err := tt.client.Messages.New(ctx, tt.params)
				var apiErr *anthropic.Error
				if !errors.As(err, &apiErr) {
					t.Fatalf("error %v (%T) is not an *anthropic.Error", err, err)
				}
				var shape struct {
					Type  string `json:"type"`
					Error struct {
						Type    string `json:"type"`
						Message string `json:"message"`
					} `json:"error"`
				}
				if err := json.Unmarshal([]byte(apiErr.RawJSON()), &shape); err != nil {
					t.Fatalf("body %q: %v", apiErr.RawJSON(), err)
				}
				want := tt.typ
				if want == "" {
					want = shape.Error.Type
				}
				if apiErr.StatusCode != tt.status || shape.Error.Type == "" || string(apiErr.Type()) != want || apiErr.Message == "" || shape.Type != "error" || shape.Error.Message != apiErr.Message {
					t.Fatalf("status %d type %q message %q body %s, want %d %s in Anthropic's shape", apiErr.StatusCode, apiErr.Type(), apiErr.Message, apiErr.RawJSON(), tt.status, tt.typ)
				}
			})
		}
	})
}

// promptTokens is a Messages answer's whole prompt: input_tokens excludes
// the cached tokens in Anthropic's meaning, which vLLM follows since PR
// #40912 (design §7.1.1).
func promptTokens(u anthropic.Usage) int64 {
	return u.InputTokens + u.CacheReadInputTokens + u.CacheCreationInputTokens
}

// abortTries is how many streams per API the abort test closes; the median
// delay is logged.
const abortTries = 5

func testAgentAborts(ctx context.Context, t *testing.T, d *devProcess, key string) {
	var engines []string
	for _, r := range d.modelReplicas("demo") {
		if r.ready() {
			engines = append(engines, r.Status.Address)
		}
	}
	if len(engines) == 0 {
		t.Fatal("no ready demo engine")
	}
	// aborted sums the client aborts over demo's engines: the router may
	// send a stream to either.
	aborted := func() float64 {
		var n float64
		for _, e := range engines {
			v, _ := testkit.Scrape(e, sim.MetricSimAbortedRequests, testkit.Labels{"reason": sim.AbortReasonClient})
			n += v
		}
		return n
	}
	const long = 4000 // tokens: 20 s at 5 ms a token, far longer than a try
	apis := []struct{ name, path, body string }{
		{"chat completions", "/v1/chat/completions", fmt.Sprintf(`{"model":"demo","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"Tell me a long story"}]}`, long)},
		{"completions", "/v1/completions", fmt.Sprintf(`{"model":"demo","stream":true,"max_tokens":%d,"prompt":"Once upon a time"}`, long)},
		{"responses", "/v1/responses", fmt.Sprintf(`{"model":"demo","stream":true,"max_output_tokens":%d,"input":"Tell me a long story"}`, long)},
		{"messages", "/v1/messages", fmt.Sprintf(`{"model":"demo","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"Tell me a long story"}]}`, long)},
	}
	for _, api := range apis {
		t.Run(api.name, func(t *testing.T) {
			var delays []time.Duration
			for try := range abortTries {
				before := aborted()
				reqCtx, closeConn := context.WithCancel(ctx)
				req, err := http.NewRequestWithContext(reqCtx, http.MethodPost, "http://"+d.http+api.path, strings.NewReader(api.body))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+key)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					closeConn()
					t.Fatal(err)
				}
				if resp.StatusCode != http.StatusOK {
					closeConn()
					resp.Body.Close()
					t.Fatalf("try %d: status %d", try, resp.StatusCode)
				}
				// The first event is out: the engine is generating.
				br := bufio.NewReader(resp.Body)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						closeConn()
						t.Fatalf("try %d: stream ended before its first event: %v", try, err)
					}
					if strings.HasPrefix(line, "data:") {
						break
					}
				}
				closed := time.Now()
				closeConn()
				resp.Body.Close()
				var delay time.Duration
				deadline := closed.Add(within(2 * time.Second))
				for {
					if aborted() > before {
						delay = time.Since(closed)
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("try %d: the engine counted no client abort within %v of the close", try, within(2*time.Second))
					}
					time.Sleep(5 * time.Millisecond)
				}
				delays = append(delays, delay)
			}
			slices.Sort(delays)
			t.Logf("%s: client close to engine abort, median %v of %d (min %v, max %v)", api.name, delays[len(delays)/2], len(delays), delays[0], delays[len(delays)-1])
		})
	}
}
