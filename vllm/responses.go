package vllm

import "encoding/json"

// The OpenAI Responses API as vLLM serves it (POST /v1/responses), from
// vllm/entrypoints/openai/responses/{protocol,serving,api_router}.py and
// simple_streaming_events.py of the stored upstream copies: the request
// fields llmgw reads, the response object vLLM builds with
// ResponsesResponse.from_request, and its streamed events. Fields that vLLM
// echoes back unchanged (tools, tool_choice, text, metadata, reasoning) are
// kept raw.

// ResponsesRequest is the part of POST /v1/responses llmgw reads. Input is
// a string or an array of items (messages, function_call,
// function_call_output, reasoning), kept raw.
type ResponsesRequest struct {
	Model              string          `json:"model,omitempty"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions,omitempty"`
	MaxOutputTokens    *int            `json:"max_output_tokens,omitempty"`
	MaxToolCalls       *int            `json:"max_tool_calls,omitempty"`
	Stream             bool            `json:"stream,omitempty"`
	Store              *bool           `json:"store,omitempty"`
	Background         bool            `json:"background,omitempty"`
	PreviousResponseID *string         `json:"previous_response_id,omitempty"`
	Prompt             json.RawMessage `json:"prompt,omitempty"`
	Tools              json.RawMessage `json:"tools,omitempty"`
	ToolChoice         json.RawMessage `json:"tool_choice,omitempty"`
	ParallelToolCalls  *bool           `json:"parallel_tool_calls,omitempty"`
	// Text carries the output format: {"format":{"type":"text"|
	// "json_object"|"json_schema","name","schema","strict"}}.
	Text        json.RawMessage `json:"text,omitempty"`
	Include     []string        `json:"include,omitempty"`
	TopLogprobs *int            `json:"top_logprobs,omitempty"`
	Temperature *float64        `json:"temperature,omitempty"`
	TopP        *float64        `json:"top_p,omitempty"`
	Metadata    json.RawMessage `json:"metadata,omitempty"`
	Reasoning   json.RawMessage `json:"reasoning,omitempty"`
	ServiceTier string          `json:"service_tier,omitempty"`
	Truncation  string          `json:"truncation,omitempty"`
	User        *string         `json:"user,omitempty"`
	// vLLM's extensions.
	RequestID string `json:"request_id,omitempty"`
	Priority  int    `json:"priority,omitempty"`
	CacheSalt string `json:"cache_salt,omitempty"`
}

// IncludeOutputLogprobs is the value of ResponsesRequest.Include that asks
// for the output text's logprobs.
const IncludeOutputLogprobs = "message.output_text.logprobs"

// ResponsesResponse is the response object: the body of a non-streamed
// answer and the "response" of response.created, response.in_progress and
// response.completed. vLLM serialises every field, null or not.
type ResponsesResponse struct {
	ID                 string            `json:"id"`
	CreatedAt          int64             `json:"created_at"`
	IncompleteDetails  *IncompleteDetail `json:"incomplete_details"`
	Instructions       *string           `json:"instructions"`
	Metadata           json.RawMessage   `json:"metadata"`
	Model              string            `json:"model"`
	Object             string            `json:"object"` // "response"
	Output             []ResponseItem    `json:"output"`
	ParallelToolCalls  bool              `json:"parallel_tool_calls"`
	Temperature        float64           `json:"temperature"`
	ToolChoice         json.RawMessage   `json:"tool_choice"`
	Tools              json.RawMessage   `json:"tools"`
	TopP               float64           `json:"top_p"`
	Background         bool              `json:"background"`
	MaxOutputTokens    int               `json:"max_output_tokens"`
	MaxToolCalls       *int              `json:"max_tool_calls"`
	PreviousResponseID *string           `json:"previous_response_id"`
	Prompt             json.RawMessage   `json:"prompt"`
	Reasoning          json.RawMessage   `json:"reasoning"`
	ServiceTier        string            `json:"service_tier"`
	// Status is "completed", or "incomplete" when the output ran into
	// max_output_tokens; "in_progress" in the opening events.
	Status         string          `json:"status"`
	Text           json.RawMessage `json:"text"`
	TopLogprobs    *int            `json:"top_logprobs"`
	Truncation     string          `json:"truncation"`
	Usage          *ResponseUsage  `json:"usage"`
	User           *string         `json:"user"`
	InputMessages  json.RawMessage `json:"input_messages"`
	OutputMessages json.RawMessage `json:"output_messages"`
}

// IncompleteDetail says why a response is incomplete.
type IncompleteDetail struct {
	Reason string `json:"reason"` // "max_output_tokens"
}

// ResponseUsage is a response's usage. vLLM always fills
// InputTokensDetails.CachedTokens (the prefix cache's hits), whatever
// --enable-prompt-tokens-details says, and reports per turn (one turn
// without built-in tools).
type ResponseUsage struct {
	InputTokens         int                        `json:"input_tokens"`
	InputTokensDetails  ResponseInputTokensDetails `json:"input_tokens_details"`
	OutputTokens        int                        `json:"output_tokens"`
	OutputTokensDetails ResponseOutputTokenDetails `json:"output_tokens_details"`
	TotalTokens         int                        `json:"total_tokens"`
}

// ResponseInputTokensDetails is ResponseUsage's input breakdown.
type ResponseInputTokensDetails struct {
	CachedTokens        int   `json:"cached_tokens"`
	InputTokensPerTurn  []int `json:"input_tokens_per_turn"`
	CachedTokensPerTurn []int `json:"cached_tokens_per_turn"`
}

// ResponseOutputTokenDetails is ResponseUsage's output breakdown.
type ResponseOutputTokenDetails struct {
	ReasoningTokens         int   `json:"reasoning_tokens"`
	ToolOutputTokens        int   `json:"tool_output_tokens"`
	OutputTokensPerTurn     []int `json:"output_tokens_per_turn"`
	ToolOutputTokensPerTurn []int `json:"tool_output_tokens_per_turn"`
}

// ResponseItem is one output item: a message (Type "message": Role,
// Content) or a function call (Type "function_call": CallID, Name,
// Arguments).
type ResponseItem struct {
	ID     string `json:"id"`
	Type   string `json:"type"`
	Status string `json:"status"` // "in_progress" or "completed"
	// A message.
	Role    string            `json:"role,omitempty"`
	Content []ResponseContent `json:"content,omitempty"`
	// A function call.
	CallID    string `json:"call_id,omitempty"`
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments,omitempty"`
}

// MarshalJSON writes a message's content even when empty, and a function
// call's arguments even when empty, as the OpenAI types vLLM uses do.
func (it ResponseItem) MarshalJSON() ([]byte, error) {
	type plain ResponseItem
	if it.Type == "function_call" {
		return json.Marshal(struct {
			plain
			Arguments string `json:"arguments"`
		}{plain(it), it.Arguments})
	}
	content := it.Content
	if content == nil {
		content = []ResponseContent{}
	}
	return json.Marshal(struct {
		plain
		Content []ResponseContent `json:"content"`
	}{plain(it), content})
}

// ResponseContent is a part of a message item: Type "output_text".
// Logprobs is null unless the request included IncludeOutputLogprobs.
type ResponseContent struct {
	Type        string            `json:"type"`
	Text        string            `json:"text"`
	Annotations []json.RawMessage `json:"annotations"`
	Logprobs    []ResponseLogprob `json:"logprobs"`
}

// ResponseLogprob is one output token's log probability in a
// ResponseContent; in a streamed delta event Bytes is absent (nil) at
// both levels.
type ResponseLogprob struct {
	Token       string               `json:"token"`
	Logprob     float64              `json:"logprob"`
	Bytes       []int                `json:"bytes,omitempty"`
	TopLogprobs []ResponseTopLogprob `json:"top_logprobs"`
}

// ResponseTopLogprob is one alternative of a ResponseLogprob.
type ResponseTopLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes,omitempty"`
}

// The streamed events of a Responses answer, in the order vLLM sends them
// for a text output (simple, non-Harmony models): created, in_progress,
// output_item.added, content_part.added, output_text.delta…,
// output_text.done, content_part.done, output_item.done, completed; for a
// function call: created, in_progress, output_item.added,
// function_call_arguments.delta…, function_call_arguments.done,
// output_item.done, completed. Each is sent as "event: TYPE\ndata: JSON\n\n"
// with sequence_number counting from 0; there is no [DONE].
const (
	EventResponseCreated            = "response.created"
	EventResponseInProgress         = "response.in_progress"
	EventResponseCompleted          = "response.completed"
	EventOutputItemAdded            = "response.output_item.added"
	EventOutputItemDone             = "response.output_item.done"
	EventContentPartAdded           = "response.content_part.added"
	EventContentPartDone            = "response.content_part.done"
	EventOutputTextDelta            = "response.output_text.delta"
	EventOutputTextDone             = "response.output_text.done"
	EventFunctionCallArgumentsDelta = "response.function_call_arguments.delta"
	EventFunctionCallArgumentsDone  = "response.function_call_arguments.done"
)

// ResponseStreamEvent is any streamed event: Type says which fields are
// set (Response for created/in_progress/completed; Item for
// output_item.*; Part for content_part.*; Delta for *.delta; Text or
// Arguments for *.done).
type ResponseStreamEvent struct {
	Type           string             `json:"type"`
	SequenceNumber int                `json:"sequence_number"`
	Response       *ResponsesResponse `json:"response,omitempty"`
	OutputIndex    *int               `json:"output_index,omitempty"`
	ContentIndex   *int               `json:"content_index,omitempty"`
	ItemID         string             `json:"item_id,omitempty"`
	Item           *ResponseItem      `json:"item,omitempty"`
	Part           *ResponseContent   `json:"part,omitempty"`
	Delta          *string            `json:"delta,omitempty"`
	Text           *string            `json:"text,omitempty"`
	Arguments      *string            `json:"arguments,omitempty"`
	Name           string             `json:"name,omitempty"`
	Logprobs       []ResponseLogprob  `json:"logprobs,omitempty"`
}
