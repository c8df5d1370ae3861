package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/llmgw/llmgw/vllm"
)

// POST /v1/messages and /v1/messages/count_tokens, Anthropic's Messages
// API as vLLM serves it (vllm/entrypoints/anthropic/serving.py,
// protocol.py, api_router.py): the request becomes a chat completion
// (_convert_anthropic_to_openai_request), runs as chat — same template,
// same engine path, the same refusal of tool_choice "auto" without
// --enable-auto-tool-choice — and the answer is converted back
// (messages_full_converter, message_stream_converter). Every error is in
// Anthropic's shape with vLLM's own error type.

func writeAnthropicError(w http.ResponseWriter, e vllm.ErrorResponse) {
	writeJSON(w, e.Error.Code, vllm.AnthropicErrorResponse{Type: "error",
		Error: vllm.AnthropicError{Type: e.Error.Type, Message: e.Error.Message}})
}

func anthropicBadRequest(w http.ResponseWriter, format string, args ...any) {
	writeAnthropicError(w, vllm.NewError(http.StatusBadRequest, vllm.ErrTypeBadRequest, fmt.Sprintf(format, args...)))
}

// anthropicChat is a Messages request converted to chat.
type anthropicChat struct {
	messages []vllm.ChatMessage
	tools    toolRequest
	// chatTools are the tools in chat's form, for the template.
	chatTools json.RawMessage
}

// checkAnthropicModel answers 404 in Anthropic's shape for a model the
// engine does not serve.
func (s *Server) checkAnthropicModel(w http.ResponseWriter, model string) bool {
	if model == "" {
		anthropicBadRequest(w, "Model is required")
		return false
	}
	rec := &discardWriter{header: http.Header{}}
	if s.checkModel(rec, model) {
		return true
	}
	writeAnthropicError(w, vllm.ModelNotFound(model))
	return false
}

// discardWriter swallows what checkModel would write in OpenAI's shape.
type discardWriter struct{ header http.Header }

func (d *discardWriter) Header() http.Header         { return d.header }
func (d *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (d *discardWriter) WriteHeader(int)             {}

// toChat converts, with vLLM's rules: the system prompt (a string, or text
// blocks joined, less Claude Code's billing header) and the system
// messages inside messages become one system message; text blocks are
// content; tool_use blocks become the assistant's tool_calls (input
// printed by json.dumps); a user's tool_result blocks become tool messages
// placed before the rest of that user message; an assistant's become text
// "Tool result: …"; images and thinking are dropped (no vision; the
// template renders no reasoning).
func anthropicToChat(system json.RawMessage, messages []vllm.AnthropicMessage, tools []vllm.AnthropicTool,
	choice *vllm.AnthropicChoice) (anthropicChat, error) {
	var c anthropicChat
	str := func(s string) json.RawMessage { b, _ := json.Marshal(s); return b }
	var systemParts []string
	addSystem := func(raw json.RawMessage, where string) error {
		if len(raw) == 0 || string(raw) == "null" {
			return nil
		}
		var s string
		if json.Unmarshal(raw, &s) == nil {
			systemParts = append(systemParts, s)
			return nil
		}
		var blocks []vllm.AnthropicContentBlock
		if err := json.Unmarshal(raw, &blocks); err != nil {
			return fmt.Errorf("%s: neither a string nor an array of blocks", where)
		}
		for _, b := range blocks {
			if b.Type == "text" && b.Text != nil && *b.Text != "" && !strings.HasPrefix(*b.Text, "x-anthropic-billing-header") {
				systemParts = append(systemParts, *b.Text)
			}
		}
		return nil
	}
	if err := addSystem(system, "system"); err != nil {
		return c, err
	}
	for i, m := range messages {
		if m.Role == "system" {
			if err := addSystem(m.Content, fmt.Sprintf("messages[%d].content", i)); err != nil {
				return c, err
			}
		}
	}
	if len(systemParts) > 0 {
		c.messages = append(c.messages, vllm.ChatMessage{Role: "system", Content: str(strings.Join(systemParts, ""))})
	}
	for i, m := range messages {
		switch m.Role {
		case "system":
			continue
		case "user", "assistant":
		case "ctx", "msg": // Claude Code's roles, which vLLM maps to user
			m.Role = "user"
		default:
			return c, fmt.Errorf("messages[%d].role: %q: must be user or assistant", i, m.Role)
		}
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			c.messages = append(c.messages, vllm.ChatMessage{Role: m.Role, Content: str(s)})
			continue
		}
		var blocks []vllm.AnthropicContentBlock
		if err := json.Unmarshal(m.Content, &blocks); err != nil {
			return c, fmt.Errorf("messages[%d].content: neither a string nor an array of blocks", i)
		}
		var texts []string
		var calls []vllm.ToolCall
		for j, b := range blocks {
			switch b.Type {
			case "text":
				if b.Text != nil && *b.Text != "" {
					texts = append(texts, *b.Text)
				}
			case "tool_use":
				args := "{}"
				if len(b.Input) > 0 && string(b.Input) != "null" {
					v, err := decodeOrdered(b.Input)
					if err != nil {
						return c, fmt.Errorf("messages[%d].content[%d].input: %w", i, j, err)
					}
					out, _ := marshalOrdered(v)
					args = string(out)
				}
				calls = append(calls, vllm.ToolCall{ID: b.ID, Type: "function", Function: vllm.FunctionCall{Name: b.Name, Arguments: args}})
			case "tool_result":
				text, err := partsText(b.Content)
				if err != nil {
					return c, fmt.Errorf("messages[%d].content[%d].content: %w", i, j, err)
				}
				if m.Role == "user" {
					c.messages = append(c.messages, vllm.ChatMessage{Role: "tool", Content: str(text), ToolCallID: b.ToolUseID})
				} else {
					texts = append(texts, "Tool result: "+text)
				}
			case "image", "thinking", "redacted_thinking", "tool_reference":
			default:
				return c, fmt.Errorf("messages[%d].content[%d].type: %q is not a content block type", i, j, b.Type)
			}
		}
		if len(texts) == 0 && len(calls) == 0 {
			if m.Role == "assistant" {
				c.messages = append(c.messages, vllm.ChatMessage{Role: m.Role})
			}
			continue
		}
		msg := vllm.ChatMessage{Role: m.Role}
		if len(texts) > 0 {
			msg.Content = str(strings.Join(texts, "\n"))
		}
		if len(calls) > 0 {
			msg.ToolCalls, _ = json.Marshal(calls)
		}
		c.messages = append(c.messages, msg)
	}
	var chatTools []map[string]any
	for i, t := range tools {
		if t.Name == "" {
			return c, fmt.Errorf("tools[%d].name: required", i)
		}
		schema := t.InputSchema
		v, err := decodeOrdered(schema)
		o, isObj := v.(*ordered)
		if err != nil || !isObj {
			return c, fmt.Errorf("tools[%d].input_schema: must be a dictionary", i)
		}
		if !o.has("type") { // vLLM's default
			o.set("type", "object")
			b, _ := marshalOrdered(o)
			schema = b
		}
		c.tools.tools = append(c.tools.tools, toolSpec{name: t.Name, params: schema})
		chatTools = append(chatTools, map[string]any{"type": "function", "function": map[string]any{
			"name": t.Name, "description": t.Description, "parameters": json.RawMessage(schema)}})
	}
	if len(chatTools) > 0 {
		c.chatTools, _ = json.Marshal(chatTools)
	}
	switch {
	case choice == nil && len(tools) > 0:
		c.tools.mode = toolAuto
	case choice == nil || choice.Type == "none":
		c.tools.mode = toolNone
	case choice.Type == "auto":
		c.tools.mode = toolAuto
	case choice.Type == "any":
		c.tools.mode = toolRequired
	case choice.Type == "tool":
		if choice.Name == "" {
			return c, errors.New("tool_choice.name is required when type is 'tool'")
		}
		c.tools.mode, c.tools.named = toolNamed, choice.Name
	default:
		return c, fmt.Errorf("tool_choice.type: %q: must be auto, any, tool or none", choice.Type)
	}
	if c.tools.mode != toolNone && len(tools) == 0 {
		return c, errors.New("When using `tool_choice`, `tools` must be set.") //nolint:staticcheck // ST1005: vLLM's wording
	}
	if c.tools.mode == toolNamed {
		found := false
		for _, t := range c.tools.tools {
			found = found || t.name == c.tools.named
		}
		if !found {
			return c, errors.New("The tool specified in `tool_choice` does not match any of the specified `tools`") //nolint:staticcheck // ST1005: vLLM's wording
		}
	}
	return c, nil
}

func (s *Server) handleMessages(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req vllm.AnthropicMessagesRequest
	if err := json.Unmarshal(body, &req); err != nil {
		anthropicBadRequest(w, "invalid JSON body: %v", err)
		return
	}
	if !s.checkAnthropicModel(w, req.Model) {
		return
	}
	switch {
	case req.MaxTokens == nil:
		anthropicBadRequest(w, "max_tokens: Field required")
		return
	case *req.MaxTokens <= 0:
		anthropicBadRequest(w, "max_tokens must be positive")
		return
	case len(req.Messages) == 0:
		anthropicBadRequest(w, "messages must contain at least one item")
		return
	}
	c, err := anthropicToChat(req.System, req.Messages, req.Tools, req.ToolChoice)
	if err != nil {
		anthropicBadRequest(w, "%v", err)
		return
	}
	if err := s.checkAutoTools(c.tools); err != nil {
		anthropicBadRequest(w, "%v", err)
		return
	}
	format, err := parseOutputConfig(req.OutputConfig)
	if err != nil {
		anthropicBadRequest(w, "%v", err)
		return
	}
	text, err := RenderChat(ChatPrompt{Messages: c.messages, AddGenerationPrompt: true, Tools: c.chatTools,
		TemplateKwargs: req.ChatTemplateKwargs})
	if err != nil {
		anthropicBadRequest(w, "%v", err)
		return
	}
	g := s.newGenRequest(req.Model, s.tok.Encode(text), "", "chatcmpl-"+s.baseRequestID(r))
	g.writeErr = writeAnthropicError
	if err := s.prepare(&g, req.MaxTokens, 0, planInput{messages: c.messages, tools: c.tools, format: format,
		callIDPrefix: "chatcmpl-tool-"}); err != nil {
		anthropicBadRequest(w, "%v", err)
		return
	}
	g.resp = s.newAnthropicResponder(w, &g, req.Stream)
	s.serveGeneration(w, r, g)
}

// parseOutputConfig reads output_config.format ({"type":"json_schema",
// "schema":…}), which vLLM turns into a json_schema response_format.
func parseOutputConfig(raw json.RawMessage) (outputFormat, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return outputFormat{}, nil
	}
	var oc struct {
		Format *struct {
			Type   string          `json:"type"`
			Schema json.RawMessage `json:"schema"`
		} `json:"format"`
	}
	if err := json.Unmarshal(raw, &oc); err != nil {
		return outputFormat{}, fmt.Errorf("output_config: %w", err)
	}
	if oc.Format == nil || len(oc.Format.Schema) == 0 || string(oc.Format.Schema) == "null" {
		return outputFormat{}, nil
	}
	if oc.Format.Type != "" && oc.Format.Type != "json_schema" {
		return outputFormat{}, fmt.Errorf("output_config.format.type: %q: must be json_schema", oc.Format.Type)
	}
	return outputFormat{kind: "json_schema", schema: oc.Format.Schema}, nil
}

// handleCountTokens is count_tokens: the prompt's tokens as the chat
// template renders the converted request (with the generation prompt, a
// chat request's default), twice, as vLLM answers.
func (s *Server) handleCountTokens(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req vllm.AnthropicCountTokensRequest
	if err := json.Unmarshal(body, &req); err != nil {
		anthropicBadRequest(w, "invalid JSON body: %v", err)
		return
	}
	if !s.checkAnthropicModel(w, req.Model) {
		return
	}
	c, err := anthropicToChat(req.System, req.Messages, req.Tools, req.ToolChoice)
	if err != nil {
		anthropicBadRequest(w, "%v", err)
		return
	}
	text, err := RenderChat(ChatPrompt{Messages: c.messages, AddGenerationPrompt: true, Tools: c.chatTools,
		TemplateKwargs: req.ChatTemplateKwargs})
	if err != nil {
		anthropicBadRequest(w, "%v", err)
		return
	}
	n := len(s.tok.Encode(text))
	writeJSON(w, http.StatusOK, vllm.AnthropicCountTokensResponse{InputTokens: n,
		ContextManagement: &vllm.AnthropicContextManagement{OriginalInputTokens: n}})
}

// anthropicResponder writes a Messages answer.
type anthropicResponder struct {
	w   http.ResponseWriter
	s   *Server
	g   *genRequest
	sse *sseWriter // nil: not streamed
	// started: message_start is out; block: a content block is open.
	started, block bool
}

func (s *Server) newAnthropicResponder(w http.ResponseWriter, g *genRequest, stream bool) *anthropicResponder {
	a := &anthropicResponder{w: w, s: s, g: g}
	if stream {
		a.sse = newSSEWriter(w, s.cfg.StreamWriteTimeout)
	}
	return a
}

func (a *anthropicResponder) begin() error { return nil }

// usage is vLLM's Messages usage (since vllm-project/vllm#40912): with
// cache details, input_tokens counts the tokens the cache did not supply.
func (a *anthropicResponder) usage(u usage) *vllm.AnthropicUsage {
	au := &vllm.AnthropicUsage{InputTokens: u.prompt, OutputTokens: u.completion}
	if a.s.cfg.EnablePromptTokensDetails {
		cached, zero := u.cached, 0
		au.InputTokens -= cached
		au.CacheReadInputTokens, au.CacheCreationInputTokens = &cached, &zero
	}
	return au
}

// stopReason maps a chat finish reason as vLLM does; nil for an abort.
func stopReason(finish string) *string {
	var r string
	switch finish {
	case vllm.FinishedStop:
		r = vllm.AnthropicStopEndTurn
	case vllm.FinishedLength:
		r = vllm.AnthropicStopMaxTokens
	case "tool_calls":
		r = vllm.AnthropicStopToolUse
	default:
		return nil
	}
	return &r
}

// messageStart is message_start's message, written as vLLM writes it
// (exclude_unset): no type or role, null stop fields, the prompt's tokens.
type messageStart struct {
	ID           string                       `json:"id"`
	Content      []vllm.AnthropicContentBlock `json:"content"`
	Model        string                       `json:"model"`
	StopReason   *string                      `json:"stop_reason"`
	StopSequence *string                      `json:"stop_sequence"`
	Usage        vllm.AnthropicUsage          `json:"usage"`
}

func (a *anthropicResponder) start() error {
	if a.started {
		return nil
	}
	a.started = true
	ev := struct {
		Type    string       `json:"type"`
		Message messageStart `json:"message"`
	}{vllm.EventMessageStart, messageStart{ID: a.g.id, Content: []vllm.AnthropicContentBlock{}, Model: a.g.model,
		Usage: vllm.AnthropicUsage{InputTokens: len(a.g.tokens)}}}
	return a.sse.event(vllm.EventMessageStart, ev)
}

func (a *anthropicResponder) token(i int) error {
	if a.sse == nil {
		return nil
	}
	if err := a.start(); err != nil {
		return err
	}
	out := a.g.out
	zero := 0
	delta := vllm.AnthropicDelta{Type: "text_delta", Text: &out.pieces[i]}
	if out.call != nil {
		args := out.argsDelta(i)
		if args == "" {
			return nil
		}
		delta = vllm.AnthropicDelta{Type: "input_json_delta", PartialJSON: &args}
	}
	if !a.block {
		a.block = true
		block := vllm.AnthropicContentBlock{Type: "text", Text: new(string)}
		if out.call != nil {
			block = vllm.AnthropicContentBlock{Type: "tool_use", ID: out.call.id, Name: out.call.name, Input: json.RawMessage("{}")}
		}
		if err := a.sse.event(vllm.EventContentBlockStart, vllm.AnthropicStreamEvent{Type: vllm.EventContentBlockStart,
			Index: &zero, ContentBlock: &block}); err != nil {
			return err
		}
	}
	return a.sse.event(vllm.EventContentBlockDelta, vllm.AnthropicStreamEvent{Type: vllm.EventContentBlockDelta,
		Index: &zero, Delta: &delta})
}

func (a *anthropicResponder) end(n int, finish string, u usage) error {
	out := a.g.out
	reason := finish
	if finish != vllm.FinishedAbort {
		reason = out.finishReason()
	}
	if a.sse == nil {
		content := []vllm.AnthropicContentBlock{}
		text := strings.Join(out.pieces[:n], "")
		if out.call != nil && finish != vllm.FinishedAbort {
			content = append(content, vllm.AnthropicContentBlock{Type: "tool_use", ID: out.call.id, Name: out.call.name,
				Input: json.RawMessage(out.call.args)})
		} else if text != "" {
			content = append(content, vllm.AnthropicContentBlock{Type: "text", Text: &text})
		}
		writeJSON(a.w, http.StatusOK, vllm.AnthropicMessagesResponse{ID: a.g.id, Type: "message", Role: "assistant",
			Content: content, Model: a.g.model, StopReason: stopReason(reason), Usage: a.usage(u)})
		return nil
	}
	if err := a.start(); err != nil {
		return err
	}
	if a.block {
		zero := 0
		if err := a.sse.event(vllm.EventContentBlockStop, vllm.AnthropicStreamEvent{Type: vllm.EventContentBlockStop,
			Index: &zero}); err != nil {
			return err
		}
	}
	ev := struct {
		Type  string `json:"type"`
		Delta struct {
			StopReason *string `json:"stop_reason"`
		} `json:"delta"`
		Usage *vllm.AnthropicUsage `json:"usage"`
	}{Type: vllm.EventMessageDelta, Usage: a.usage(u)}
	ev.Delta.StopReason = stopReason(reason)
	if err := a.sse.event(vllm.EventMessageDelta, ev); err != nil {
		return err
	}
	return a.sse.event(vllm.EventMessageStop, vllm.AnthropicStreamEvent{Type: vllm.EventMessageStop})
}
