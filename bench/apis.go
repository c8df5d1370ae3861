package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Wire formats a run may send its requests in (--api). One conversation
// is the same prompt in each: the engines render all three through the chat
// template, so a comparison of APIs compares the routers' handling of them,
// not different prompts.
const (
	APIChat      = "chat"      // POST /v1/chat/completions
	APIMessages  = "messages"  // POST /v1/messages, Anthropic's Messages API
	APIResponses = "responses" // POST /v1/responses
)

var apiNames = []string{APIChat, APIMessages, APIResponses}

// APINames returns the accepted --api values in a stable order.
func APINames() []string { return slices.Clone(apiNames) }

// apiPath is the route a request of the API goes to.
func apiPath(api string) string {
	switch api {
	case APIMessages:
		return "/v1/messages"
	case APIResponses:
		return "/v1/responses"
	}
	return "/v1/chat/completions"
}

// chatBody is the chat request body; streaming with usage is always on,
// since the per-chunk timing and cached_tokens are the point.
type chatBody struct {
	Model         string    `json:"model"`
	Messages      []Message `json:"messages"`
	MaxTokens     int       `json:"max_tokens,omitempty"`
	IgnoreEOS     bool      `json:"ignore_eos,omitempty"`
	Stream        bool      `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// textBlock is a Messages content block of text.
type textBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type messagesMessage struct {
	Role    string      `json:"role"`
	Content []textBlock `json:"content"`
}

// messagesBody is an Anthropic Messages request: the system prompt apart,
// each turn's content as blocks, as Anthropic's SDKs send them; max_tokens
// is required by the API.
type messagesBody struct {
	Model     string            `json:"model"`
	System    string            `json:"system,omitempty"`
	Messages  []messagesMessage `json:"messages"`
	MaxTokens int               `json:"max_tokens"`
	Stream    bool              `json:"stream"`
}

// responsesBody is a Responses request with the conversation as input
// messages; store is off, since the bench resends the history itself as an
// agent without server-side state does.
type responsesBody struct {
	Model           string    `json:"model"`
	Input           []Message `json:"input"`
	MaxOutputTokens int       `json:"max_output_tokens,omitempty"`
	Stream          bool      `json:"stream"`
	Store           bool      `json:"store"`
}

// encodeBody is the streamed request body of req in the API's form.
func encodeBody(api string, req Request) ([]byte, error) {
	switch api {
	case APIMessages:
		b := messagesBody{Model: req.Model, MaxTokens: req.MaxTokens, Stream: true, Messages: []messagesMessage{}}
		if b.MaxTokens == 0 {
			b.MaxTokens = 128 // the workloads' default; the API has none
		}
		var system []string
		for _, m := range req.Messages {
			if m.Role == "system" {
				system = append(system, m.Content)
				continue
			}
			b.Messages = append(b.Messages, messagesMessage{Role: m.Role, Content: []textBlock{{Type: "text", Text: m.Content}}})
		}
		b.System = strings.Join(system, "\n")
		return json.Marshal(b)
	case APIResponses:
		return json.Marshal(responsesBody{Model: req.Model, Input: req.Messages, MaxOutputTokens: req.MaxTokens, Stream: true})
	}
	body := chatBody{Model: req.Model, Messages: req.Messages, MaxTokens: req.MaxTokens, IgnoreEOS: req.IgnoreEOS, Stream: true}
	body.StreamOptions.IncludeUsage = true
	return json.Marshal(body)
}

// parserFor returns the SSE payload decoder of the API.
func parserFor(api string) func([]byte) (streamEvent, error) {
	switch api {
	case APIMessages:
		return parseMessagesEvent
	case APIResponses:
		return parseResponsesEvent
	}
	return parseEvent
}

// messagesEvent is the part of a Messages stream event the bench reads.
type messagesEvent struct {
	Type  string `json:"type"`
	Delta *struct {
		Text *string `json:"text"`
	} `json:"delta"`
	Usage *struct {
		InputTokens          int  `json:"input_tokens"`
		OutputTokens         int  `json:"output_tokens"`
		CacheReadInputTokens *int `json:"cache_read_input_tokens"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// parseMessagesEvent decodes one Messages stream event. A text delta is a
// token; message_stop ends the stream (there is no [DONE]); message_delta
// carries the final usage. vLLM's convention (vllm-project/vllm#40912), as
// Anthropic's: with cache details present, input_tokens counts only the
// tokens the cache did not supply, so the prompt is their sum.
func parseMessagesEvent(data []byte) (streamEvent, error) {
	var e messagesEvent
	if err := json.Unmarshal(bytes.TrimSpace(data), &e); err != nil {
		return streamEvent{}, fmt.Errorf("%w: %w", errBadChunk, err)
	}
	var ev streamEvent
	switch e.Type {
	case "message_stop":
		ev.done = true
	case "error":
		ev.errText = "error without a message"
		if e.Error != nil && e.Error.Message != "" {
			ev.errText = e.Error.Message
		}
	case "content_block_delta":
		if e.Delta != nil && e.Delta.Text != nil && *e.Delta.Text != "" {
			ev.token, ev.text = true, *e.Delta.Text
		}
	case "message_delta":
		if u := e.Usage; u != nil {
			ev.usage = &Usage{PromptTokens: u.InputTokens, CompletionTokens: u.OutputTokens}
			if u.CacheReadInputTokens != nil {
				ev.usage.PromptTokens += *u.CacheReadInputTokens
				ev.usage.PromptTokensDetails = &PromptTokensDetails{CachedTokens: *u.CacheReadInputTokens}
			}
		}
	}
	return ev, nil
}

// responsesEvent is the part of a Responses stream event the bench reads.
type responsesEvent struct {
	Type     string  `json:"type"`
	Delta    *string `json:"delta"`
	Response *struct {
		Usage *struct {
			InputTokens        int `json:"input_tokens"`
			OutputTokens       int `json:"output_tokens"`
			InputTokensDetails *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"input_tokens_details"`
		} `json:"usage"`
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	} `json:"response"`
	Message string `json:"message"` // an "error" event's
}

// parseResponsesEvent decodes one Responses stream event: an output text
// delta is a token; response.completed or response.incomplete (max output
// tokens reached) ends the stream with the usage; response.failed and error
// are failures.
func parseResponsesEvent(data []byte) (streamEvent, error) {
	var e responsesEvent
	if err := json.Unmarshal(bytes.TrimSpace(data), &e); err != nil {
		return streamEvent{}, fmt.Errorf("%w: %w", errBadChunk, err)
	}
	var ev streamEvent
	switch e.Type {
	case "response.output_text.delta":
		if e.Delta != nil && *e.Delta != "" {
			ev.token, ev.text = true, *e.Delta
		}
	case "response.completed", "response.incomplete":
		ev.done = true
		if e.Response != nil && e.Response.Usage != nil {
			u := e.Response.Usage
			ev.usage = &Usage{PromptTokens: u.InputTokens, CompletionTokens: u.OutputTokens}
			if u.InputTokensDetails != nil {
				ev.usage.PromptTokensDetails = &PromptTokensDetails{CachedTokens: u.InputTokensDetails.CachedTokens}
			}
		}
	case "response.failed", "error":
		ev.errText = e.Message
		if e.Response != nil && e.Response.Error != nil {
			ev.errText = e.Response.Error.Message
		}
		if ev.errText == "" {
			ev.errText = "error without a message"
		}
	}
	return ev, nil
}
