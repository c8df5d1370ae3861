package vllm

import (
	"encoding/json"
	"fmt"
)

// StreamOptions is the OpenAI stream_options object. A router sets
// IncludeUsage on every stream to learn cached_tokens (design §7.1).
type StreamOptions struct {
	IncludeUsage         bool `json:"include_usage"`
	ContinuousUsageStats bool `json:"continuous_usage_stats,omitempty"`
}

// ChatCompletionRequest is the part of POST /v1/chat/completions llmgw
// reads. Fields that change the rendered prompt (tools,
// chat_template_kwargs) are kept raw so they can be passed on unchanged.
type ChatCompletionRequest struct {
	Model               string          `json:"model"`
	Messages            []ChatMessage   `json:"messages"`
	Stream              bool            `json:"stream,omitempty"`
	StreamOptions       *StreamOptions  `json:"stream_options,omitempty"`
	MaxTokens           *int            `json:"max_tokens,omitempty"`
	MaxCompletionTokens *int            `json:"max_completion_tokens,omitempty"`
	N                   *int            `json:"n,omitempty"`
	Tools               json.RawMessage `json:"tools,omitempty"`
	ChatTemplateKwargs  json.RawMessage `json:"chat_template_kwargs,omitempty"`
	AddGenerationPrompt *bool           `json:"add_generation_prompt,omitempty"`
	CacheSalt           string          `json:"cache_salt,omitempty"`
	// Priority is vLLM's extension: lower is served first when the engine
	// runs --scheduling-policy priority; anything but 0 is refused otherwise.
	Priority int `json:"priority,omitempty"`
}

// CompletionRequest is the part of POST /v1/completions llmgw reads.
// Prompt is kept raw: a string, an array of token ids, or arrays of
// either.
type CompletionRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	Stream        bool            `json:"stream,omitempty"`
	StreamOptions *StreamOptions  `json:"stream_options,omitempty"`
	MaxTokens     *int            `json:"max_tokens,omitempty"`
	N             *int            `json:"n,omitempty"`
	CacheSalt     string          `json:"cache_salt,omitempty"`
	Priority      int             `json:"priority,omitempty"`
}

// PromptInput is one completion prompt: text, or token ids given directly.
type PromptInput struct {
	Text   string
	Tokens []int
	IsText bool
}

// Prompts decodes the prompt field into its items. vLLM accepts a string,
// a list of strings, a list of token ids, or a list of lists of ids.
func (r *CompletionRequest) Prompts() ([]PromptInput, error) {
	if len(r.Prompt) == 0 || string(r.Prompt) == "null" {
		return nil, fmt.Errorf("%w: prompt is required", ErrBadRequest)
	}
	var s string
	if json.Unmarshal(r.Prompt, &s) == nil {
		return []PromptInput{{Text: s, IsText: true}}, nil
	}
	var ids []int
	if json.Unmarshal(r.Prompt, &ids) == nil && len(ids) > 0 {
		return []PromptInput{{Tokens: ids}}, nil
	}
	var ss []string
	if json.Unmarshal(r.Prompt, &ss) == nil && len(ss) > 0 {
		out := make([]PromptInput, len(ss))
		for i, x := range ss {
			out[i] = PromptInput{Text: x, IsText: true}
		}
		return out, nil
	}
	var idss [][]int
	if json.Unmarshal(r.Prompt, &idss) == nil && len(idss) > 0 {
		out := make([]PromptInput, len(idss))
		for i, x := range idss {
			out[i] = PromptInput{Tokens: x}
		}
		return out, nil
	}
	return nil, fmt.Errorf("%w: prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids", ErrBadRequest)
}

// Usage is the usage object of a response or of a stream's last chunk.
// PromptTokensDetails is null unless the engine runs with
// --enable-prompt-tokens-details; without it there are no cached_tokens.
type Usage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details"`
}

// PromptTokensDetails carries how many prompt tokens the prefix cache
// supplied: the figure prefix-aware routing is judged by.
type PromptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// ChatCompletion is a non-streamed chat answer.
type ChatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"` // "chat.completion"
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []ChatChoice `json:"choices"`
	Usage   *Usage       `json:"usage"`
}

// ChatChoice is one choice of a ChatCompletion.
type ChatChoice struct {
	Index        int              `json:"index"`
	Message      AssistantMessage `json:"message"`
	Logprobs     json.RawMessage  `json:"logprobs"`
	FinishReason *string          `json:"finish_reason"`
	StopReason   json.RawMessage  `json:"stop_reason"`
}

// AssistantMessage is the message of a ChatChoice.
type AssistantMessage struct {
	Role      string            `json:"role"`
	Content   string            `json:"content"`
	ToolCalls []json.RawMessage `json:"tool_calls"`
}

// ChatCompletionChunk is one SSE event of a streamed chat answer. Usage is
// omitted on every chunk but the usage chunk, whose Choices is empty.
type ChatCompletionChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"` // "chat.completion.chunk"
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []ChatChunkChoice `json:"choices"`
	Usage   *Usage            `json:"usage,omitempty"`
}

// ChatChunkChoice is one choice of a ChatCompletionChunk.
type ChatChunkChoice struct {
	Index        int             `json:"index"`
	Delta        ChatDelta       `json:"delta"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
	StopReason   json.RawMessage `json:"stop_reason,omitempty"`
}

// ChatDelta is the increment a chunk carries: the role on the first chunk,
// then content.
type ChatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

// Completion is a non-streamed completion answer, and (with Object
// "text_completion" too) each chunk of a streamed one.
type Completion struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"` // "text_completion"
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []CompletionChoice `json:"choices"`
	Usage   *Usage             `json:"usage,omitempty"`
}

// CompletionChoice is one choice of a Completion.
type CompletionChoice struct {
	Index        int             `json:"index"`
	Text         string          `json:"text"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
	StopReason   json.RawMessage `json:"stop_reason,omitempty"`
}
