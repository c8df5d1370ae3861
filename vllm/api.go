package vllm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// ErrorResponse is the body of every error vLLM's OpenAI server returns:
// {"error":{"message","type","param","code"}}, with the HTTP status equal
// to Code.
type ErrorResponse struct {
	Error ErrorBody `json:"error"`
}

// ErrorBody is the inside of an ErrorResponse. Param is null unless the
// error is about one field (vLLM names "model" for an unknown model).
type ErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// Error types vLLM puts in ErrorBody.Type.
const (
	ErrTypeBadRequest     = "BadRequestError"
	ErrTypeNotFound       = "NotFoundError"
	ErrTypeInvalidInput   = "InvalidUserInput"
	ErrTypeInternalServer = "InternalServerError"
	ErrTypeNotImplemented = "NotImplementedError"
)

// NewError builds the body vLLM sends with status code.
func NewError(code int, typ, message string) ErrorResponse {
	return ErrorResponse{Error: ErrorBody{Message: message, Type: typ, Code: code}}
}

// ModelNotFound is vLLM's 404 for a request naming a model it does not
// serve; routers match on it to tell "wrong replica" from "broken replica".
func ModelNotFound(model string) ErrorResponse {
	param := "model"
	e := NewError(404, ErrTypeNotFound, fmt.Sprintf("The model `%s` does not exist.", model))
	e.Error.Param = &param
	return e
}

// ModelList is GET /v1/models.
type ModelList struct {
	Object string      `json:"object"` // "list"
	Data   []ModelCard `json:"data"`
}

// ModelCard is one served model or adapter. Root is the model path (the
// adapter's path for an adapter); Parent is null for a base model and the
// base model's name for an adapter, whose MaxModelLen is null.
type ModelCard struct {
	ID          string            `json:"id"`
	Object      string            `json:"object"` // "model"
	Created     int64             `json:"created"`
	OwnedBy     string            `json:"owned_by"` // "vllm"
	Root        string            `json:"root"`
	Parent      *string           `json:"parent"`
	MaxModelLen *int              `json:"max_model_len"`
	Permission  []ModelPermission `json:"permission"`
}

// ModelPermission is the OpenAI-era permission object vLLM still emits.
type ModelPermission struct {
	ID                 string  `json:"id"`
	Object             string  `json:"object"` // "model_permission"
	Created            int64   `json:"created"`
	AllowCreateEngine  bool    `json:"allow_create_engine"`
	AllowSampling      bool    `json:"allow_sampling"`
	AllowLogprobs      bool    `json:"allow_logprobs"`
	AllowSearchIndices bool    `json:"allow_search_indices"`
	AllowView          bool    `json:"allow_view"`
	AllowFineTuning    bool    `json:"allow_fine_tuning"`
	Organization       string  `json:"organization"`
	Group              *string `json:"group"`
	IsBlocking         bool    `json:"is_blocking"`
}

// ChatMessage is one message of a chat request. Content is kept raw
// because OpenAI allows a string or an array of typed parts; Text flattens
// it. Fields the template may render (tool calls) are kept raw as well.
type ChatMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content,omitempty"`
	Name       string          `json:"name,omitempty"`
	ToolCalls  json.RawMessage `json:"tool_calls,omitempty"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
}

// Text is the message's text: the string itself, or the text parts of an
// array joined with newlines (non-text parts are skipped; the simulator has
// no vision). A null or absent content is "".
func (m ChatMessage) Text() (string, error) {
	c := bytes.TrimSpace(m.Content)
	if len(c) == 0 || string(c) == "null" {
		return "", nil
	}
	if c[0] == '"' {
		var s string
		if err := json.Unmarshal(c, &s); err != nil {
			return "", fmt.Errorf("content: %w", err)
		}
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(c, &parts); err != nil {
		return "", fmt.Errorf("content: neither a string nor an array of parts: %w", err)
	}
	var texts []string
	for _, p := range parts {
		if p.Type == "text" {
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, "\n"), nil
}

// TokenizeRequest is POST /tokenize in either of vLLM's forms: the
// completion form (Prompt set, Messages nil) or the chat form (Messages
// set). Use DecodeTokenizeRequest, which applies vLLM's defaults — they
// differ between the forms.
type TokenizeRequest struct {
	Model            string `json:"model,omitempty"`
	ReturnTokenStrs  bool   `json:"return_token_strs,omitempty"`
	AddSpecialTokens bool   `json:"add_special_tokens"`

	// Completion form.
	Prompt *string `json:"prompt,omitempty"`

	// Chat form.
	Messages             []ChatMessage   `json:"messages,omitempty"`
	AddGenerationPrompt  bool            `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message,omitempty"`
	ChatTemplate         *string         `json:"chat_template,omitempty"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs,omitempty"`
	Tools                json.RawMessage `json:"tools,omitempty"`
}

// IsChat says which form the request is in.
func (r *TokenizeRequest) IsChat() bool { return r.Messages != nil }

// ErrBadRequest is wrapped by decoding errors a server answers with 400.
var ErrBadRequest = errors.New("bad request")

// DecodeTokenizeRequest parses a /tokenize body and fills vLLM's
// per-form defaults: add_special_tokens true for a prompt and false for
// messages (the chat template already adds them); add_generation_prompt
// true. Unknown fields are ignored, as vLLM's pydantic models allow them.
func DecodeTokenizeRequest(body []byte) (TokenizeRequest, error) {
	var probe struct {
		Prompt              json.RawMessage `json:"prompt"`
		Messages            json.RawMessage `json:"messages"`
		AddSpecialTokens    *bool           `json:"add_special_tokens"`
		AddGenerationPrompt *bool           `json:"add_generation_prompt"`
	}
	if err := json.Unmarshal(body, &probe); err != nil {
		return TokenizeRequest{}, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	var r TokenizeRequest
	if err := json.Unmarshal(body, &r); err != nil {
		return TokenizeRequest{}, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	hasMessages := len(probe.Messages) > 0 && string(probe.Messages) != "null"
	hasPrompt := len(probe.Prompt) > 0 && string(probe.Prompt) != "null"
	switch {
	case hasMessages && hasPrompt:
		return TokenizeRequest{}, fmt.Errorf("%w: give either prompt or messages, not both", ErrBadRequest)
	case hasMessages:
		if r.Messages == nil {
			r.Messages = []ChatMessage{}
		}
		r.Prompt = nil
		r.AddSpecialTokens = probe.AddSpecialTokens != nil && *probe.AddSpecialTokens
		r.AddGenerationPrompt = probe.AddGenerationPrompt == nil || *probe.AddGenerationPrompt
		if r.AddGenerationPrompt && r.ContinueFinalMessage {
			return TokenizeRequest{}, fmt.Errorf("%w: Cannot set both `continue_final_message` and `add_generation_prompt` to True.", ErrBadRequest) //nolint:staticcheck // ST1005: vLLM's wording, verbatim
		}
	case hasPrompt:
		r.Messages = nil
		r.AddSpecialTokens = probe.AddSpecialTokens == nil || *probe.AddSpecialTokens
	default:
		return TokenizeRequest{}, fmt.Errorf("%w: prompt or messages is required", ErrBadRequest)
	}
	return r, nil
}

// TokenizeResponse is /tokenize's answer. TokenStrs is null unless asked
// for: vLLM serialises the whole model.
type TokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []int    `json:"tokens"`
	TokenStrs   []string `json:"token_strs"`
}

// DetokenizeRequest is POST /detokenize.
type DetokenizeRequest struct {
	Model  string `json:"model,omitempty"`
	Tokens []int  `json:"tokens"`
}

// DetokenizeResponse is /detokenize's answer.
type DetokenizeResponse struct {
	Prompt string `json:"prompt"`
}
