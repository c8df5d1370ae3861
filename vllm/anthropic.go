package vllm

import "encoding/json"

// The Anthropic Messages API as vLLM serves it (POST /v1/messages and
// /v1/messages/count_tokens, since 0.11), from
// vllm/entrypoints/anthropic/{protocol,serving,api_router}.py of the stored
// upstream copies. vLLM converts a Messages request into a chat completion
// (system first, tool_use blocks into tool_calls, tool_result blocks into
// tool messages, tool_choice any→required and tool→named), runs it as chat,
// and converts the answer back.

// AnthropicMessagesRequest is the part of POST /v1/messages llmgw reads.
// System is a string or an array of text blocks; ToolChoice, OutputConfig
// and ChatTemplateKwargs are kept raw.
type AnthropicMessagesRequest struct {
	Model              string             `json:"model"`
	Messages           []AnthropicMessage `json:"messages"`
	MaxTokens          *int               `json:"max_tokens"`
	System             json.RawMessage    `json:"system,omitempty"`
	Stream             bool               `json:"stream,omitempty"`
	Tools              []AnthropicTool    `json:"tools,omitempty"`
	ToolChoice         *AnthropicChoice   `json:"tool_choice,omitempty"`
	OutputConfig       json.RawMessage    `json:"output_config,omitempty"`
	StopSequences      []string           `json:"stop_sequences,omitempty"`
	Temperature        *float64           `json:"temperature,omitempty"`
	TopP               *float64           `json:"top_p,omitempty"`
	TopK               *int               `json:"top_k,omitempty"`
	Metadata           json.RawMessage    `json:"metadata,omitempty"`
	ChatTemplateKwargs json.RawMessage    `json:"chat_template_kwargs,omitempty"`
}

// AnthropicCountTokensRequest is POST /v1/messages/count_tokens.
type AnthropicCountTokensRequest struct {
	Model              string             `json:"model"`
	Messages           []AnthropicMessage `json:"messages"`
	System             json.RawMessage    `json:"system,omitempty"`
	Tools              []AnthropicTool    `json:"tools,omitempty"`
	ToolChoice         *AnthropicChoice   `json:"tool_choice,omitempty"`
	ChatTemplateKwargs json.RawMessage    `json:"chat_template_kwargs,omitempty"`
}

// AnthropicCountTokensResponse is count_tokens' answer: the rendered
// prompt's tokens, twice.
type AnthropicCountTokensResponse struct {
	InputTokens       int                         `json:"input_tokens"`
	ContextManagement *AnthropicContextManagement `json:"context_management,omitempty"`
}

// AnthropicContextManagement is count_tokens' context_management.
type AnthropicContextManagement struct {
	OriginalInputTokens int `json:"original_input_tokens"`
}

// AnthropicMessage is one message: Content is a string or an array of
// AnthropicContentBlock, kept raw.
type AnthropicMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// AnthropicContentBlock is a content block of a request or a response:
// "text" (Text), "tool_use" (ID, Name, Input), "tool_result" (ToolUseID,
// Content), "image", "thinking" (Thinking), "redacted_thinking".
type AnthropicContentBlock struct {
	Type      string          `json:"type"`
	Text      *string         `json:"text,omitempty"`
	ID        string          `json:"id,omitempty"`
	ToolUseID string          `json:"tool_use_id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Input     json.RawMessage `json:"input,omitempty"`
	Content   json.RawMessage `json:"content,omitempty"`
	IsError   *bool           `json:"is_error,omitempty"`
	Thinking  *string         `json:"thinking,omitempty"`
	Signature string          `json:"signature,omitempty"`
	Source    json.RawMessage `json:"source,omitempty"`
}

// AnthropicTool is a tool definition: InputSchema is its parameters' JSON
// schema.
type AnthropicTool struct {
	Name        string          `json:"name"`
	Description *string         `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema"`
}

// AnthropicChoice is tool_choice: Type "auto", "any", "tool" (with Name)
// or "none".
type AnthropicChoice struct {
	Type string `json:"type"`
	Name string `json:"name,omitempty"`
}

// AnthropicMessagesResponse is a non-streamed answer (vLLM writes it with
// exclude_none: no null fields), and the "message" of message_start (which
// vLLM writes with exclude_unset: no type or role, but null stop_reason
// and stop_sequence).
type AnthropicMessagesResponse struct {
	ID           string                  `json:"id"`
	Type         string                  `json:"type,omitempty"` // "message"
	Role         string                  `json:"role,omitempty"` // "assistant"
	Content      []AnthropicContentBlock `json:"content"`
	Model        string                  `json:"model"`
	StopReason   *string                 `json:"stop_reason,omitempty"`
	StopSequence *string                 `json:"stop_sequence,omitempty"`
	Usage        *AnthropicUsage         `json:"usage,omitempty"`
}

// AnthropicUsage is a Messages usage. Since vLLM PR #40912, when the chat
// usage it converts carries prompt_tokens_details (the engine runs with
// --enable-prompt-tokens-details), InputTokens excludes the cached tokens,
// which are CacheReadInputTokens, and CacheCreationInputTokens is 0; without
// them both cache fields are absent and InputTokens is every prompt token.
type AnthropicUsage struct {
	InputTokens              int  `json:"input_tokens"`
	OutputTokens             int  `json:"output_tokens"`
	CacheCreationInputTokens *int `json:"cache_creation_input_tokens,omitempty"`
	CacheReadInputTokens     *int `json:"cache_read_input_tokens,omitempty"`
}

// Stop reasons, from the chat finish reasons vLLM maps them from: stop →
// end_turn, length → max_tokens, tool_calls → tool_use (a named tool
// choice finishes with "stop", hence end_turn).
const (
	AnthropicStopEndTurn   = "end_turn"
	AnthropicStopMaxTokens = "max_tokens"
	AnthropicStopToolUse   = "tool_use"
)

// The streamed events of a Messages answer, as vLLM sends them:
// message_start (at the first chunk), then per content block
// content_block_start, content_block_delta…, content_block_stop, then
// message_delta (the stop reason and the usage) and message_stop. vLLM
// sends no ping. Each is sent as "event: TYPE\ndata: JSON\n\n".
const (
	EventMessageStart      = "message_start"
	EventMessageDelta      = "message_delta"
	EventMessageStop       = "message_stop"
	EventContentBlockStart = "content_block_start"
	EventContentBlockDelta = "content_block_delta"
	EventContentBlockStop  = "content_block_stop"
)

// AnthropicStreamEvent is any streamed event; Type says which fields are
// set.
type AnthropicStreamEvent struct {
	Type         string                     `json:"type"`
	Message      *AnthropicMessagesResponse `json:"message,omitempty"`
	Index        *int                       `json:"index,omitempty"`
	ContentBlock *AnthropicContentBlock     `json:"content_block,omitempty"`
	Delta        *AnthropicDelta            `json:"delta,omitempty"`
	Usage        *AnthropicUsage            `json:"usage,omitempty"`
	Error        *AnthropicError            `json:"error,omitempty"`
}

// AnthropicDelta is a content_block_delta's delta (Type "text_delta" with
// Text, "input_json_delta" with PartialJSON) or a message_delta's
// (StopReason, always written, null for an aborted request).
type AnthropicDelta struct {
	Type        string  `json:"type,omitempty"`
	Text        *string `json:"text,omitempty"`
	PartialJSON *string `json:"partial_json,omitempty"`
	StopReason  *string `json:"stop_reason,omitempty"`
}

// AnthropicErrorResponse is every error of the Messages routes:
// {"type":"error","error":{"type","message"}}, where vLLM puts its own
// error type (BadRequestError, NotFoundError…) and the HTTP status is the
// error's code.
type AnthropicErrorResponse struct {
	Type  string         `json:"type"` // "error"
	Error AnthropicError `json:"error"`
}

// AnthropicError is the inside of an AnthropicErrorResponse.
type AnthropicError struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}
