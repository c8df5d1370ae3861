package tokenize

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
)

// vLLM serves the Responses and Messages APIs by turning each request
// into chat messages and rendering those with the model's chat template,
// as it renders /v1/chat/completions. Its /tokenize takes only OpenAI's
// chat form (vllm/entrypoints/serve/tokenize/protocol.py
// TokenizeChatRequest: messages, tools, chat_template_kwargs,
// add_generation_prompt, continue_final_message), so the router makes the
// same turn before asking it, and the tokens — hence the block hashes —
// are the engine's own.
//
// The turns follow vLLM's code as of the commits read for issue 31:
// vllm/entrypoints/anthropic/serving.py (0001948b) and
// vllm/entrypoints/openai/responses/utils.py (d0ac5791). Older vLLM
// releases turned some blocks differently (the system messages inside
// messages, a tool result's list, Claude Code's billing header); against
// one of those the prediction misses from the first differing message
// on, which llmgw_router_kv_prediction_error_blocks shows, and no request
// fails for it. What cannot be turned exactly — images (ErrMultimodal), a
// float in a tool call's input, the Responses API's tools or reasoning
// settings, previous_response_id — is routed by tier 1 (ErrUnsupported).

// prepareConverted builds the /tokenize body of a Responses or Messages
// request for model.
func prepareConverted(kind Kind, model json.RawMessage, body []byte) (Request, error) {
	var out map[string]any
	var err error
	switch kind {
	case Messages:
		out, err = convertMessages(body)
	case Responses:
		out, err = convertResponses(body)
	default:
		err = fmt.Errorf("%w: kind %d", ErrUnsupported, kind)
	}
	if err != nil {
		return Request{}, err
	}
	out["model"] = model
	b, err := json.Marshal(out)
	if err != nil {
		return Request{}, fmt.Errorf("%w: %w", ErrUnsupported, err)
	}
	return Request{body: b, key: sha256.Sum256(b)}, nil
}

// anthropicBlock is a content block of Anthropic's Messages API, as vLLM
// reads one (AnthropicContentBlock).
type anthropicBlock struct {
	Type      string          `json:"type"`
	Text      *string         `json:"text"`
	ID        *string         `json:"id"`
	ToolUseID *string         `json:"tool_use_id"`
	Name      *string         `json:"name"`
	Input     json.RawMessage `json:"input"`
	Content   json.RawMessage `json:"content"`
	Thinking  *string         `json:"thinking"`
	Source    json.RawMessage `json:"source"`
}

// anthropicContent is a message's content: a string or blocks.
type anthropicContent struct {
	text   *string
	blocks []anthropicBlock
}

func (c *anthropicContent) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		c.text = &s
		return nil
	}
	return json.Unmarshal(b, &c.blocks)
}

// billingHeader starts the system block Claude Code adds to every
// request, which vLLM drops (its per-request hash would defeat the cache).
const billingHeader = "x-anthropic-billing-header"

// convertMessages turns an Anthropic Messages request into /tokenize's chat
// fields as vLLM's AnthropicServingMessages._convert_anthropic_to_openai_request
// does: the system prompt (the system field's text blocks and every
// system-role message's, joined) first, then each message — text blocks
// as text (one alone as a string), thinking as reasoning, tool uses as
// tool calls with the input as Python's json.dumps writes it, a user's
// tool results as tool messages ahead of what else the message says —
// and the tools as OpenAI functions.
func convertMessages(body []byte) (map[string]any, error) {
	var req struct {
		System   *anthropicContent `json:"system"`
		Messages []struct {
			Role    string           `json:"role"`
			Content anthropicContent `json:"content"`
		} `json:"messages"`
		Tools []struct {
			Name         string          `json:"name"`
			Description  *string         `json:"description"`
			InputSchema  json.RawMessage `json:"input_schema"`
			DeferLoading *bool           `json:"defer_loading"`
		} `json:"tools"`
		ChatTemplateKwargs json.RawMessage `json:"chat_template_kwargs"`
		OutputConfig       *struct {
			Effort *string `json:"effort"`
		} `json:"output_config"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnsupported, err)
	}
	if len(req.Messages) == 0 {
		return nil, fmt.Errorf("%w: messages must be a non-empty list", ErrUnsupported)
	}
	if req.OutputConfig != nil && req.OutputConfig.Effort != nil {
		// vLLM passes it to the template as reasoning_effort, in ways that
		// vary by release.
		return nil, fmt.Errorf("%w: output_config.effort", ErrUnsupported)
	}
	msgs := []any{}
	var system []string
	addSystem := func(c *anthropicContent) {
		if c.text != nil {
			system = append(system, *c.text)
			return
		}
		for _, b := range c.blocks {
			if b.Type == "text" && b.Text != nil && *b.Text != "" && !hasPrefix(*b.Text, billingHeader) {
				system = append(system, *b.Text)
			}
		}
	}
	if req.System != nil && (req.System.text == nil || *req.System.text != "") {
		addSystem(req.System)
	}
	for i := range req.Messages {
		if req.Messages[i].Role == "system" {
			addSystem(&req.Messages[i].Content)
		}
	}
	if len(system) > 0 {
		joined := ""
		for _, s := range system {
			joined += s
		}
		msgs = append(msgs, map[string]any{"role": "system", "content": joined})
	}
	for _, m := range req.Messages {
		role := m.Role
		switch role {
		case "system":
			continue
		case "ctx", "msg": // Claude Code's, which vLLM maps to user
			role = "user"
		case "user", "assistant":
		default:
			return nil, fmt.Errorf("%w: role %q", ErrUnsupported, m.Role)
		}
		msg := map[string]any{"role": role}
		if m.Content.text != nil {
			msgs = append(msgs, map[string]any{"role": role, "content": *m.Content.text})
			continue
		}
		var parts []map[string]any
		var calls []any
		reasoning, hasReasoning := "", false
		for _, b := range m.Content.blocks {
			switch b.Type {
			case "text":
				if b.Text != nil && *b.Text != "" {
					parts = append(parts, map[string]any{"type": "text", "text": *b.Text})
				}
			case "image":
				if len(b.Source) > 0 && string(b.Source) != "null" {
					return nil, fmt.Errorf("%w: an image block", ErrMultimodal)
				}
			case "thinking":
				if b.Thinking != nil {
					reasoning += *b.Thinking
					hasReasoning = true
				}
			case "redacted_thinking", "tool_reference":
			case "tool_use":
				if b.ID == nil || *b.ID == "" {
					// vLLM makes one up from the clock.
					return nil, fmt.Errorf("%w: a tool_use block without an id", ErrUnsupported)
				}
				args := "{}"
				if len(b.Input) > 0 && string(b.Input) != "null" && string(bytes.TrimSpace(b.Input)) != "{}" {
					a, err := pythonJSON(b.Input)
					if err != nil {
						return nil, err
					}
					args = a
				}
				name := ""
				if b.Name != nil {
					name = *b.Name
				}
				calls = append(calls, map[string]any{"id": *b.ID, "type": "function",
					"function": map[string]any{"name": name, "arguments": args}})
			case "tool_result":
				text, err := toolResultText(b.Content)
				if err != nil {
					return nil, err
				}
				if role != "user" {
					if b.Content != nil && string(b.Content) != "null" && (len(b.Content) < 1 || b.Content[0] != '"') {
						return nil, fmt.Errorf("%w: an assistant's tool_result list", ErrUnsupported) // vLLM writes Python's repr
					}
					parts = append(parts, map[string]any{"type": "text", "text": "Tool result: " + text})
					continue
				}
				id := ""
				if b.ToolUseID != nil {
					id = *b.ToolUseID
				}
				msgs = append(msgs, map[string]any{"role": "tool", "tool_call_id": id, "content": text})
			default:
				return nil, fmt.Errorf("%w: a %q block", ErrUnsupported, b.Type)
			}
		}
		if hasReasoning {
			msg["reasoning"] = reasoning
		}
		if len(calls) > 0 {
			msg["tool_calls"] = calls
		}
		switch {
		case len(parts) == 1:
			msg["content"] = parts[0]["text"]
		case len(parts) > 1:
			msg["content"] = parts
		}
		if _, ok := msg["content"]; role == "user" && !ok {
			continue // vLLM drops a user message left without content
		}
		msgs = append(msgs, msg)
	}
	out := map[string]any{"messages": msgs}
	if len(req.ChatTemplateKwargs) > 0 && string(req.ChatTemplateKwargs) != "null" {
		out["chat_template_kwargs"] = req.ChatTemplateKwargs
	}
	if req.Tools != nil {
		tools := make([]any, 0, len(req.Tools))
		for _, t := range req.Tools {
			params, err := withObjectType(t.InputSchema)
			if err != nil {
				return nil, err
			}
			tools = append(tools, map[string]any{"type": "function", "function": map[string]any{
				"name": t.Name, "description": t.Description, "parameters": params, "defer_loading": t.DeferLoading}})
		}
		out["tools"] = tools
	}
	return out, nil
}

// toolResultText is a user's tool result as vLLM writes it into the tool
// message: its string, or its text items joined by newlines (an image item
// is multimodal; other items add nothing).
func toolResultText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	if raw[0] == '"' {
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	}
	var items []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return "", fmt.Errorf("%w: tool_result content: %w", ErrUnsupported, err)
	}
	text := ""
	n := 0
	for _, it := range items {
		var typ string
		_ = json.Unmarshal(it["type"], &typ)
		switch typ {
		case "text":
			var s string
			if t, ok := it["text"]; ok && json.Unmarshal(t, &s) != nil {
				return "", fmt.Errorf("%w: a tool_result text item", ErrUnsupported)
			}
			if n > 0 {
				text += "\n"
			}
			text += s
			n++
		case "image":
			return "", fmt.Errorf("%w: an image in a tool result", ErrMultimodal)
		case "tool_reference":
			return "", fmt.Errorf("%w: a tool_reference in a tool result", ErrUnsupported)
		}
	}
	return text, nil
}

// withObjectType is a tool's input_schema as vLLM keeps it: an object, to
// which "type": "object" is added last when it has no type.
func withObjectType(schema json.RawMessage) (json.RawMessage, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(schema, &fields); err != nil || fields == nil {
		return nil, fmt.Errorf("%w: input_schema must be an object", ErrUnsupported)
	}
	if _, ok := fields["type"]; ok {
		return schema, nil
	}
	s := bytes.TrimSpace(schema)
	inner := bytes.TrimSpace(s[1 : len(s)-1])
	out := make([]byte, 0, len(s)+16)
	out = append(out, '{')
	out = append(out, inner...)
	if len(inner) > 0 {
		out = append(out, ',')
	}
	out = append(out, `"type":"object"}`...)
	return out, nil
}

// convertResponses turns a Responses API request into /tokenize's chat
// fields as vLLM's construct_input_messages does: the instructions as the
// system message, a string input as a user message, and each input item
// — a message by its role and its text (input_text and output_text parts
// render as text parts do), a function call as the assistant's tool call,
// its output as a tool message. A last message still in progress is
// continued, not answered (should_continue_final_message).
func convertResponses(body []byte) (map[string]any, error) {
	var req struct {
		Instructions       *string         `json:"instructions"`
		Input              json.RawMessage `json:"input"`
		PreviousResponseID *string         `json:"previous_response_id"`
		PreviousInput      json.RawMessage `json:"previous_input_messages"`
		Tools              []any           `json:"tools"`
		ToolChoice         json.RawMessage `json:"tool_choice"`
		Reasoning          json.RawMessage `json:"reasoning"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnsupported, err)
	}
	switch {
	case req.PreviousResponseID != nil:
		// The conversation so far is in the engine's store, not the body.
		return nil, fmt.Errorf("%w: previous_response_id", ErrUnsupported)
	case len(req.PreviousInput) > 0 && string(req.PreviousInput) != "null":
		return nil, fmt.Errorf("%w: previous_input_messages", ErrUnsupported)
	case len(req.Tools) > 0 && string(req.ToolChoice) != `"none"`:
		// vLLM hands the template each tool's whole model_dump, in the
		// order of OpenAI's types, which /tokenize's tools cannot repeat.
		return nil, fmt.Errorf("%w: tools", ErrUnsupported)
	case len(req.Reasoning) > 0 && string(req.Reasoning) != "null":
		return nil, fmt.Errorf("%w: reasoning", ErrUnsupported)
	}
	msgs := []any{}
	if req.Instructions != nil && *req.Instructions != "" {
		msgs = append(msgs, map[string]any{"role": "system", "content": *req.Instructions})
	}
	out := map[string]any{}
	var s string
	if len(req.Input) > 0 && req.Input[0] == '"' {
		if err := json.Unmarshal(req.Input, &s); err != nil {
			return nil, fmt.Errorf("%w: input: %w", ErrUnsupported, err)
		}
		out["messages"] = append(msgs, map[string]any{"role": "user", "content": s})
		return out, nil
	}
	var items []struct {
		Type      *string         `json:"type"`
		Role      *string         `json:"role"`
		Content   json.RawMessage `json:"content"`
		Status    *string         `json:"status"`
		ID        *string         `json:"id"`
		CallID    *string         `json:"call_id"`
		Name      *string         `json:"name"`
		Arguments *string         `json:"arguments"`
		Output    json.RawMessage `json:"output"`
	}
	if err := json.Unmarshal(req.Input, &items); err != nil || len(items) == 0 {
		return nil, fmt.Errorf("%w: input must be a string or a non-empty list", ErrUnsupported)
	}
	for i, it := range items {
		typ := "message"
		if it.Type != nil {
			typ = *it.Type
		}
		switch {
		case typ == "message" && it.Role != nil:
			content, err := responsesContent(it.Content)
			if err != nil {
				return nil, err
			}
			msgs = append(msgs, map[string]any{"role": *it.Role, "content": content})
			if i == len(items)-1 && it.Status != nil && (*it.Status == "in_progress" || *it.Status == "incomplete") {
				out["add_generation_prompt"] = false
				out["continue_final_message"] = true
			}
		case typ == "function_call" && it.CallID != nil && it.Name != nil && it.Arguments != nil:
			if it.ID != nil && hasPrefix(*it.ID, "mcp_") {
				return nil, fmt.Errorf("%w: an MCP call", ErrUnsupported) // vLLM merges it into the reasoning message before it
			}
			msgs = append(msgs, map[string]any{"role": "assistant", "tool_calls": []any{map[string]any{
				"id": *it.CallID, "type": "function", "function": map[string]any{"name": *it.Name, "arguments": *it.Arguments}}}})
		case typ == "function_call_output" && it.CallID != nil:
			var o string
			if err := json.Unmarshal(it.Output, &o); err != nil {
				return nil, fmt.Errorf("%w: function_call_output.output is not a string", ErrUnsupported)
			}
			msgs = append(msgs, map[string]any{"role": "tool", "content": o, "tool_call_id": *it.CallID})
		default:
			return nil, fmt.Errorf("%w: an input item of type %q", ErrUnsupported, typ)
		}
	}
	out["messages"] = msgs
	return out, nil
}

// responsesContent is an input message's content for the chat form: its
// string, or its text parts as text parts (input_text and output_text are
// parsed as text by vLLM's chat_utils); anything else is multimodal or
// unknown.
func responsesContent(raw json.RawMessage) (any, error) {
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("%w: content: %w", ErrUnsupported, err)
		}
		return s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil || parts == nil {
		return nil, fmt.Errorf("%w: content must be a string or a list of parts", ErrUnsupported)
	}
	out := make([]any, 0, len(parts))
	for _, p := range parts {
		switch p.Type {
		case "input_text", "output_text", "text":
			if p.Text == nil {
				return nil, fmt.Errorf("%w: a text part without text", ErrUnsupported)
			}
			out = append(out, map[string]any{"type": "text", "text": *p.Text})
		case "input_image", "input_audio", "input_file":
			return nil, fmt.Errorf("%w: a %q part", ErrMultimodal, p.Type)
		default:
			return nil, fmt.Errorf("%w: a %q part", ErrUnsupported, p.Type)
		}
	}
	return out, nil
}

func hasPrefix(s, prefix string) bool { return len(s) >= len(prefix) && s[:len(prefix)] == prefix }
