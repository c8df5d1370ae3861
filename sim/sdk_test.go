package sim

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"
)

// TestOpenAIClient sends what issue 31's openai-go client sent — a forced
// named function, json_object and json_schema formats, logprobs — and the
// Responses API, through the official client, and reads the answers as
// that client reads them.
func TestOpenAIClient(t *testing.T) {
	_, ts := newTestServer(t, testConfig())
	client := openai.NewClient(option.WithBaseURL(ts.URL+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	ctx := context.Background()
	var weather map[string]any
	if err := json.Unmarshal([]byte(weatherSchema), &weather); err != nil {
		t.Fatal(err)
	}
	user := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("What is the weather in Paris?")}

	t.Run("forced named function", func(t *testing.T) {
		resp, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model: "llama", Messages: user,
			Tools: []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
				Name: "get_weather", Parameters: weather})},
			ToolChoice: openai.ToolChoiceOptionFunctionToolChoice(openai.ChatCompletionNamedToolChoiceFunctionParam{Name: "get_weather"}),
		})
		if err != nil {
			t.Fatal(err)
		}
		calls := resp.Choices[0].Message.ToolCalls
		if len(calls) != 1 || calls[0].Function.Name != "get_weather" {
			t.Fatalf("tool calls %+v", calls)
		}
		validateJSON(t, weatherSchema, calls[0].Function.Arguments)
	})
	t.Run("json_schema and logprobs", func(t *testing.T) {
		resp, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model: "llama", Messages: user, Logprobs: openai.Bool(true), TopLogprobs: openai.Int(2),
			ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
				JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "weather", Schema: weather}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		validateJSON(t, weatherSchema, resp.Choices[0].Message.Content)
		lps := resp.Choices[0].Logprobs.Content
		if int64(len(lps)) != resp.Usage.CompletionTokens || len(lps[0].TopLogprobs) != 2 {
			t.Errorf("%d logprobs for %d tokens: %+v", len(lps), resp.Usage.CompletionTokens, lps[0])
		}
	})
	t.Run("json_object", func(t *testing.T) {
		resp, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "llama", Messages: user,
			ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONObject: &shared.ResponseFormatJSONObjectParam{}}})
		if err != nil {
			t.Fatal(err)
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(resp.Choices[0].Message.Content), &v); err != nil {
			t.Errorf("content %q: %v", resp.Choices[0].Message.Content, err)
		}
	})
	t.Run("responses", func(t *testing.T) {
		params := responses.ResponseNewParams{Model: "llama", MaxOutputTokens: openai.Int(6),
			Instructions: openai.String("be brief"),
			Input:        responses.ResponseNewParamsInputUnion{OfString: openai.String("Say hello")}}
		resp, err := client.Responses.New(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		if resp.OutputText() == "" || resp.Usage.OutputTokens != 6 || resp.Status != responses.ResponseStatusIncomplete {
			t.Fatalf("response %+v", resp)
		}
		s := client.Responses.NewStreaming(ctx, params)
		var text strings.Builder
		var types []string
		for s.Next() {
			ev := s.Current()
			types = append(types, ev.Type)
			if ev.Type == "response.output_text.delta" {
				text.WriteString(ev.Delta)
			}
			if ev.Type == "response.completed" && ev.Response.OutputText() != text.String() {
				t.Errorf("completed %q, deltas %q", ev.Response.OutputText(), text.String())
			}
		}
		if err := s.Err(); err != nil {
			t.Fatal(err)
		}
		s.Close()
		if text.String() != resp.OutputText() || types[0] != "response.created" || types[len(types)-1] != "response.completed" {
			t.Errorf("streamed %q (%v), not streamed %q", text.String(), types, resp.OutputText())
		}
	})
}
