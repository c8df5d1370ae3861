package vllm

import (
	"bytes"
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
	// ToolChoice is "none", "auto", "required" or a named function
	// ({"type":"function","function":{"name":...}}), kept raw.
	ToolChoice json.RawMessage `json:"tool_choice,omitempty"`
	// ResponseFormat is {"type":"text"|"json_object"|"json_schema",
	// "json_schema":{"name","schema","strict"}}, kept raw.
	ResponseFormat json.RawMessage `json:"response_format,omitempty"`
	// Logprobs asks for the sampled tokens' log probabilities, and
	// TopLogprobs for that many alternatives at each position (0..20).
	Logprobs    bool `json:"logprobs,omitempty"`
	TopLogprobs *int `json:"top_logprobs,omitempty"`
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
	// Logprobs is how many alternatives to return at each position with
	// the sampled token's log probability (null: none).
	Logprobs       *int            `json:"logprobs,omitempty"`
	ResponseFormat json.RawMessage `json:"response_format,omitempty"`
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
// then content or tool-call pieces.
type ChatDelta struct {
	Role      string          `json:"role,omitempty"`
	Content   *string         `json:"content,omitempty"`
	ToolCalls []DeltaToolCall `json:"tool_calls,omitempty"`
}

// ToolCall is one tool call of an assistant message: Arguments is the
// function's arguments as a JSON text.
type ToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"` // "function"
	Function FunctionCall `json:"function"`
}

// FunctionCall is the function a ToolCall calls.
type FunctionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// DeltaToolCall is a streamed piece of a tool call, as vLLM sends it: the
// first piece of call Index carries ID, Type and the function's Name, the
// later ones only more Arguments text.
type DeltaToolCall struct {
	Index    int               `json:"index"`
	ID       string            `json:"id,omitempty"`
	Type     string            `json:"type,omitempty"`
	Function DeltaFunctionCall `json:"function"`
}

// DeltaFunctionCall is the function part of a DeltaToolCall.
type DeltaFunctionCall struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments,omitempty"`
}

// ChatLogprobs is a chat choice's logprobs: one entry per generated token.
type ChatLogprobs struct {
	Content []ChatLogprob `json:"content"`
}

// ChatLogprob is one generated token's log probability, its UTF-8 bytes
// and the most likely alternatives at its position (the sampled token
// among them when it ranks).
type ChatLogprob struct {
	Token       string       `json:"token"`
	Logprob     float64      `json:"logprob"`
	Bytes       []int        `json:"bytes"`
	TopLogprobs []TopLogprob `json:"top_logprobs"`
}

// TopLogprob is one alternative of a ChatLogprob.
type TopLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
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

// CompletionLogprobs is a completion choice's logprobs, the legacy
// completions shape: parallel lists, one entry per generated token.
// TextOffset is where each token starts in the choice's text.
type CompletionLogprobs struct {
	TextOffset    []int           `json:"text_offset"`
	TokenLogprobs []float64       `json:"token_logprobs"`
	Tokens        []string        `json:"tokens"`
	TopLogprobs   []TokenLogprobs `json:"top_logprobs"`
}

// TokenLogprobs is one position's most likely tokens, best first, as the
// completions API writes them: a JSON object from token to log
// probability, whose key order is the rank. (TopLogprob.Bytes is not part
// of this shape and is neither written nor read.)
type TokenLogprobs []TopLogprob

// MarshalJSON writes the object in rank order.
func (t TokenLogprobs) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, lp := range t {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := json.Marshal(lp.Token)
		if err != nil {
			return nil, err
		}
		v, err := json.Marshal(lp.Logprob)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// UnmarshalJSON reads the object keeping its key order.
func (t *TokenLogprobs) UnmarshalJSON(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return fmt.Errorf("top_logprobs entry: want an object, got %v", tok)
	}
	out := TokenLogprobs{}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return err
		}
		var v float64
		if err := dec.Decode(&v); err != nil {
			return err
		}
		out = append(out, TopLogprob{Token: k.(string), Logprob: v})
	}
	*t = out
	return nil
}
