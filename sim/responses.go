package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/llmgw/llmgw/vllm"
)

// POST /v1/responses, as vLLM serves it for models without Harmony
// (vllm/entrypoints/openai/responses/serving.py, protocol.py, utils.py and
// simple_streaming_events.py; api_router.py frames the stream). The input
// — instructions, then a string or items — becomes chat messages
// (construct_input_messages) rendered by the same chat template as chat,
// so a conversation's prefix caches the same whichever API carries it; the
// request then runs in the engine as any other. Without
// VLLM_ENABLE_RESPONSES_API_STORE vLLM stores nothing: store is ignored,
// background is refused, and a previous_response_id is never found.

// errTypeInvalidRequest is the error type the Responses handler gives its
// own refusals.
const errTypeInvalidRequest = "invalid_request_error"

func responsesError(w http.ResponseWriter, code int, param, format string, args ...any) {
	e := vllm.NewError(code, errTypeInvalidRequest, fmt.Sprintf(format, args...))
	if param != "" {
		e.Error.Param = &param
	}
	writeError(w, e)
}

func (s *Server) handleResponses(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req vllm.ResponsesRequest
	if err := json.Unmarshal(body, &req); err != nil {
		badRequest(w, "invalid JSON body: %v", err)
		return
	}
	if len(req.Input) == 0 || string(req.Input) == "null" {
		badRequest(w, "input: required")
		return
	}
	if !s.checkModel(w, req.Model) {
		return
	}
	switch {
	case len(req.Prompt) > 0 && string(req.Prompt) != "null":
		responsesError(w, http.StatusBadRequest, "prompt", "prompt template is not supported")
		return
	case req.Background && req.Store != nil && !*req.Store:
		badRequest(w, "background can only be used when `store` is true")
		return
	case req.Background:
		responsesError(w, http.StatusBadRequest, "background", "This vLLM engine does not support `store=True` and therefore does not support the background mode. To enable these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server.")
		return
	case req.PreviousResponseID != nil:
		responsesError(w, http.StatusNotFound, "response_id", "Response with id '%s' not found.", *req.PreviousResponseID)
		return
	}
	messages, err := responsesMessages(req.Instructions, req.Input)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	tools, chatTools, err := parseResponsesTools(req.Tools, req.ToolChoice)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	format, err := parseTextFormat(req.Text)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	lp := logprobsRequest{}
	if slices.Contains(req.Include, vllm.IncludeOutputLogprobs) {
		lp.on = true
		if req.TopLogprobs != nil {
			lp.top = *req.TopLogprobs
		}
		if err := s.checkLogprobs(lp.top); err != nil {
			responsesError(w, http.StatusBadRequest, "top_logprobs", "%v", err)
			return
		}
	}
	text, err := RenderChat(ChatPrompt{Messages: messages, AddGenerationPrompt: true, Tools: chatTools})
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	id := req.RequestID
	if id == "" {
		id = "resp_" + s.newID()
	}
	g := s.newGenRequest(req.Model, s.tok.Encode(text), req.CacheSalt, id)
	n, maxLen := len(g.tokens), s.cfg.MaxModelLen
	if n >= maxLen {
		responsesError(w, http.StatusBadRequest, "input", "The engine prompt length %d exceeds the max_model_len %d. Please reduce prompt.", n, maxLen)
		return
	}
	// vLLM's Responses clamps max_output_tokens to the context left rather
	// than refusing it.
	asked := req.MaxOutputTokens
	if asked != nil && *asked > maxLen-n {
		clamped := maxLen - n
		asked = &clamped
	}
	if err := s.prepare(&g, asked, req.Priority, planInput{messages: messages, tools: tools,
		format: format, callIDPrefix: "call_"}); err != nil {
		badRequest(w, "%v", err)
		return
	}
	g.resp = s.newResponsesResponder(w, &g, &req, lp)
	s.serveGeneration(w, r, g)
}

// responsesItem is an input item of any type.
type responsesItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
}

// responsesMessages turns instructions and input into chat messages, as
// vLLM's construct_input_messages does: instructions as the system
// message, a string input as the user's message, message items by their
// role (text parts joined; images and files are skipped, the simulator has
// no vision), function_call items as the assistant's tool calls (merged
// into the assistant message before them), function_call_output items as
// tool messages. Reasoning items are dropped: the template does not render
// reasoning.
func responsesMessages(instructions *string, input json.RawMessage) ([]vllm.ChatMessage, error) {
	var msgs []vllm.ChatMessage
	str := func(s string) json.RawMessage { b, _ := json.Marshal(s); return b }
	if instructions != nil && *instructions != "" {
		msgs = append(msgs, vllm.ChatMessage{Role: "system", Content: str(*instructions)})
	}
	var text string
	if json.Unmarshal(input, &text) == nil {
		return append(msgs, vllm.ChatMessage{Role: "user", Content: str(text)}), nil
	}
	var items []responsesItem
	if err := json.Unmarshal(input, &items); err != nil {
		return nil, fmt.Errorf("input: neither a string nor an array of items: %w", err)
	}
	for i, it := range items {
		switch it.Type {
		case "function_call":
			call := vllm.ToolCall{ID: it.CallID, Type: "function", Function: vllm.FunctionCall{Name: it.Name, Arguments: it.Arguments}}
			if last := len(msgs) - 1; last >= 0 && msgs[last].Role == "assistant" {
				var calls []vllm.ToolCall
				if len(msgs[last].ToolCalls) > 0 {
					_ = json.Unmarshal(msgs[last].ToolCalls, &calls)
				}
				msgs[last].ToolCalls, _ = json.Marshal(append(calls, call))
				continue
			}
			calls, _ := json.Marshal([]vllm.ToolCall{call})
			msgs = append(msgs, vllm.ChatMessage{Role: "assistant", ToolCalls: calls})
		case "function_call_output":
			out, err := partsText(it.Output)
			if err != nil {
				return nil, fmt.Errorf("input[%d].output: %w", i, err)
			}
			msgs = append(msgs, vllm.ChatMessage{Role: "tool", Content: str(out), ToolCallID: it.CallID})
		case "reasoning":
		case "message", "":
			if it.Role == "" {
				return nil, fmt.Errorf("input[%d]: an item needs a type or a role", i)
			}
			content, err := partsText(it.Content)
			if err != nil {
				return nil, fmt.Errorf("input[%d].content: %w", i, err)
			}
			msgs = append(msgs, vllm.ChatMessage{Role: it.Role, Content: str(content)})
		default:
			return nil, fmt.Errorf("input[%d]: item type %q is not supported by the simulator", i, it.Type)
		}
	}
	return msgs, nil
}

// partsText is a content's text: a string, or the text parts of an array
// (input_text, output_text, text) joined with newlines.
func partsText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("neither a string nor an array of parts")
	}
	var texts []string
	for _, p := range parts {
		switch p.Type {
		case "input_text", "output_text", "text":
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, "\n"), nil
}

// parseResponsesTools reads Responses' function tools ({"type":"function",
// "name","parameters"}; built-in tools are ignored, as vLLM without a tool
// server ignores them) and tool_choice, and returns the tools in chat's
// form for the template, as vLLM's construct_tool_dicts renders them.
func parseResponsesTools(toolsRaw, choiceRaw json.RawMessage) (toolRequest, json.RawMessage, error) {
	var tr toolRequest
	var chatTools []map[string]any
	if len(toolsRaw) > 0 && string(toolsRaw) != "null" {
		var tools []struct {
			Type        string          `json:"type"`
			Name        string          `json:"name"`
			Description *string         `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
		}
		if err := json.Unmarshal(toolsRaw, &tools); err != nil {
			return tr, nil, fmt.Errorf("tools: %w", err)
		}
		for i, t := range tools {
			if t.Type != "function" {
				continue
			}
			if t.Name == "" {
				return tr, nil, fmt.Errorf("tools[%d].name: required", i)
			}
			tr.tools = append(tr.tools, toolSpec{name: t.Name, params: t.Parameters})
			fn := map[string]any{"name": t.Name, "description": t.Description, "parameters": t.Parameters}
			if len(t.Parameters) == 0 {
				fn["parameters"] = nil
			}
			chatTools = append(chatTools, map[string]any{"type": "function", "function": fn})
		}
	}
	choice, named, err := parseToolChoice(choiceRaw, func(raw json.RawMessage) (string, error) {
		var c struct {
			Type string `json:"type"`
			Name string `json:"name"`
		}
		_ = json.Unmarshal(raw, &c)
		if c.Type != "function" || c.Name == "" {
			return "", fmt.Errorf("tool_choice: %s is not emulated by the simulator (only \"none\", \"auto\", \"required\" and {\"type\": \"function\", \"name\": ...})", raw)
		}
		return c.Name, nil
	})
	if err != nil {
		return tr, nil, err
	}
	var rendered json.RawMessage
	if len(chatTools) > 0 {
		rendered, _ = json.Marshal(chatTools)
	}
	switch choice {
	case "", "auto":
		tr.mode = toolAuto
	case "none":
		tr.mode = toolNone
	case "required":
		tr.mode = toolRequired
	case "named":
		tr.mode, tr.named = toolNamed, named
		if !slices.ContainsFunc(tr.tools, func(t toolSpec) bool { return t.name == named }) {
			return tr, nil, fmt.Errorf("tool_choice names the function %q, which is not among the tools", named)
		}
	default:
		return tr, nil, fmt.Errorf("tool_choice: %q: must be none, auto, required or a function", choice)
	}
	return tr, rendered, nil
}

// parseTextFormat reads Responses' text.format: json_schema (vLLM's
// structured output), json_object (vLLM's Responses ignores it; the
// simulator writes a JSON object, as for chat) or text.
func parseTextFormat(raw json.RawMessage) (outputFormat, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return outputFormat{}, nil
	}
	var t struct {
		Format *struct {
			Type   string          `json:"type"`
			Schema json.RawMessage `json:"schema"`
		} `json:"format"`
	}
	if err := json.Unmarshal(raw, &t); err != nil {
		return outputFormat{}, fmt.Errorf("text: %w", err)
	}
	if t.Format == nil {
		return outputFormat{}, nil
	}
	switch t.Format.Type {
	case "text":
		return outputFormat{}, nil
	case "json_object":
		return outputFormat{kind: "json_object"}, nil
	case "json_schema":
		if len(t.Format.Schema) == 0 || string(t.Format.Schema) == "null" {
			return outputFormat{}, errors.New("text.format.schema: required")
		}
		return outputFormat{kind: "json_schema", schema: t.Format.Schema}, nil
	}
	return outputFormat{}, fmt.Errorf("text.format.type: %q: must be text, json_object or json_schema", t.Format.Type)
}

// responsesResponder writes a Responses answer: the response object, or
// its events.
type responsesResponder struct {
	w   http.ResponseWriter
	s   *Server
	g   *genRequest
	req *vllm.ResponsesRequest
	sse *sseWriter // nil: not streamed
	lp  logprobsRequest
	seq int
	// itemID is the output item's id, opened whether its
	// output_item.added is out.
	itemID string
	opened bool
}

func (s *Server) newResponsesResponder(w http.ResponseWriter, g *genRequest, req *vllm.ResponsesRequest, lp logprobsRequest) *responsesResponder {
	r := &responsesResponder{w: w, s: s, g: g, req: req, lp: lp, itemID: "msg_" + s.newID()}
	if g.out.call != nil {
		r.itemID = "fc_" + s.newID()
	}
	if req.Stream {
		r.sse = newSSEWriter(w, s.cfg.StreamWriteTimeout)
	}
	return r
}

// response is the response object in a state.
func (r *responsesResponder) response(status string, output []vllm.ResponseItem, u *vllm.ResponseUsage) *vllm.ResponsesResponse {
	req := r.req
	orDefault := func(p *float64, d float64) float64 {
		if p != nil {
			return *p
		}
		return d
	}
	tools := req.Tools
	if len(tools) == 0 || string(tools) == "null" {
		tools = json.RawMessage("[]")
	}
	choice := req.ToolChoice
	if len(choice) == 0 || string(choice) == "null" {
		choice = json.RawMessage(`"auto"`)
	}
	tier, trunc := req.ServiceTier, req.Truncation
	if tier == "" {
		tier = "auto"
	}
	if trunc == "" {
		trunc = "disabled"
	}
	resp := &vllm.ResponsesResponse{ID: r.g.id, CreatedAt: r.g.created, Instructions: req.Instructions,
		Metadata: req.Metadata, Model: r.g.model, Object: "response", Output: output,
		ParallelToolCalls: req.ParallelToolCalls == nil || *req.ParallelToolCalls,
		Temperature:       orDefault(req.Temperature, 1), ToolChoice: choice, Tools: tools,
		TopP: orDefault(req.TopP, 1), MaxOutputTokens: r.g.out.limit, MaxToolCalls: req.MaxToolCalls,
		Reasoning: req.Reasoning, ServiceTier: tier, Status: status, Text: req.Text, Truncation: trunc,
		Usage: u, User: req.User}
	if output == nil {
		resp.Output = []vllm.ResponseItem{}
	}
	if r.lp.on {
		top := r.lp.top
		resp.TopLogprobs = &top
	}
	if status == "incomplete" {
		resp.IncompleteDetails = &vllm.IncompleteDetail{Reason: "max_output_tokens"}
	}
	return resp
}

// emit sends one event, numbered.
func (r *responsesResponder) emit(v any, typ string) error {
	r.seq++
	return r.sse.event(typ, v)
}

type evBase struct {
	Type           string `json:"type"`
	SequenceNumber int    `json:"sequence_number"`
}

func (r *responsesResponder) base(typ string) evBase { return evBase{Type: typ, SequenceNumber: r.seq} }

func (r *responsesResponder) begin() error {
	if r.sse == nil {
		return nil
	}
	for _, typ := range []string{vllm.EventResponseCreated, vllm.EventResponseInProgress} {
		ev := struct {
			evBase
			Response *vllm.ResponsesResponse `json:"response"`
		}{r.base(typ), r.response("in_progress", nil, nil)}
		if err := r.emit(ev, typ); err != nil {
			return err
		}
	}
	return nil
}

// logprobs is tokens [from, to)'s logprobs in Responses' shape: with
// bytes in the response object, without in a streamed delta.
func (r *responsesResponder) logprobs(from, to int, bytes bool) []vllm.ResponseLogprob {
	if !r.lp.on {
		return nil
	}
	out := []vllm.ResponseLogprob{}
	for i := from; i < to; i++ {
		lp, alts := r.g.out.tokenLogprob(i, r.lp.top)
		e := vllm.ResponseLogprob{Token: r.g.out.pieces[i], Logprob: lp, TopLogprobs: []vllm.ResponseTopLogprob{}}
		if bytes {
			e.Bytes = utf8Bytes(e.Token)
		}
		for _, a := range alts {
			t := vllm.ResponseTopLogprob{Token: a.Token, Logprob: a.Logprob}
			if bytes {
				t.Bytes = a.Bytes
			}
			e.TopLogprobs = append(e.TopLogprobs, t)
		}
		out = append(out, e)
	}
	return out
}

func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func (r *responsesResponder) token(i int) error {
	if r.sse == nil {
		return nil
	}
	out := r.g.out
	zero := 0
	if out.call != nil {
		args := out.argsDelta(i)
		if args == "" {
			return nil
		}
		if !r.opened {
			r.opened = true
			ev := struct {
				evBase
				OutputIndex int               `json:"output_index"`
				Item        vllm.ResponseItem `json:"item"`
			}{r.base(vllm.EventOutputItemAdded), 0, vllm.ResponseItem{ID: r.itemID, Type: "function_call",
				Status: "in_progress", CallID: out.call.id, Name: out.call.name}}
			if err := r.emit(ev, vllm.EventOutputItemAdded); err != nil {
				return err
			}
		}
		ev := struct {
			evBase
			OutputIndex int    `json:"output_index"`
			ItemID      string `json:"item_id"`
			Delta       string `json:"delta"`
		}{r.base(vllm.EventFunctionCallArgumentsDelta), 0, r.itemID, args}
		return r.emit(ev, vllm.EventFunctionCallArgumentsDelta)
	}
	if !r.opened {
		r.opened = true
		added := struct {
			evBase
			OutputIndex int               `json:"output_index"`
			Item        vllm.ResponseItem `json:"item"`
		}{r.base(vllm.EventOutputItemAdded), 0, vllm.ResponseItem{ID: r.itemID, Type: "message", Role: "assistant",
			Status: "in_progress"}}
		if err := r.emit(added, vllm.EventOutputItemAdded); err != nil {
			return err
		}
		part := struct {
			evBase
			OutputIndex  int                  `json:"output_index"`
			ItemID       string               `json:"item_id"`
			ContentIndex int                  `json:"content_index"`
			Part         vllm.ResponseContent `json:"part"`
		}{r.base(vllm.EventContentPartAdded), 0, r.itemID, zero, vllm.ResponseContent{Type: "output_text",
			Annotations: []json.RawMessage{}, Logprobs: []vllm.ResponseLogprob{}}}
		if err := r.emit(part, vllm.EventContentPartAdded); err != nil {
			return err
		}
	}
	ev := struct {
		evBase
		ContentIndex int                    `json:"content_index"`
		OutputIndex  int                    `json:"output_index"`
		ItemID       string                 `json:"item_id"`
		Delta        string                 `json:"delta"`
		Logprobs     []vllm.ResponseLogprob `json:"logprobs"`
	}{r.base(vllm.EventOutputTextDelta), 0, 0, r.itemID, out.pieces[i], orEmpty(r.logprobs(i, i+1, false))}
	return r.emit(ev, vllm.EventOutputTextDelta)
}

// end builds the final response: a function_call item for a call, else a
// message item with the text. Its status is "incomplete" when the output
// ran into its token limit, else "completed" — an aborted request too,
// as vLLM's catch-all for non-Harmony models.
func (r *responsesResponder) end(n int, finish string, u usage) error {
	out := r.g.out
	var item vllm.ResponseItem
	text := strings.Join(out.pieces[:n], "")
	if out.call != nil {
		// An aborted call ends with the arguments it had.
		args := out.call.args
		if n < len(out.ids) {
			args = ""
			for i := range n {
				args += out.argsDelta(i)
			}
		}
		item = vllm.ResponseItem{ID: r.itemID, Type: "function_call", Status: "completed", CallID: out.call.id,
			Name: out.call.name, Arguments: args}
	} else {
		item = vllm.ResponseItem{ID: r.itemID, Type: "message", Role: "assistant", Status: "completed",
			Content: []vllm.ResponseContent{}}
		if text != "" {
			item.Content = []vllm.ResponseContent{{Type: "output_text", Text: text,
				Annotations: []json.RawMessage{}, Logprobs: r.logprobs(0, n, true)}}
		}
	}
	status := "completed"
	if finish == vllm.FinishedLength {
		status = "incomplete"
	}
	ru := &vllm.ResponseUsage{InputTokens: u.prompt, OutputTokens: u.completion, TotalTokens: u.prompt + u.completion,
		InputTokensDetails: vllm.ResponseInputTokensDetails{CachedTokens: u.cached,
			InputTokensPerTurn: []int{u.prompt}, CachedTokensPerTurn: []int{u.cached}},
		OutputTokensDetails: vllm.ResponseOutputTokenDetails{OutputTokensPerTurn: []int{u.completion},
			ToolOutputTokensPerTurn: []int{0}}}
	final := r.response(status, []vllm.ResponseItem{item}, ru)
	if r.sse == nil {
		writeJSON(r.w, http.StatusOK, final)
		return nil
	}
	if r.opened {
		if err := r.closeItem(item, text); err != nil {
			return err
		}
	}
	ev := struct {
		evBase
		Response *vllm.ResponsesResponse `json:"response"`
	}{r.base(vllm.EventResponseCompleted), final}
	return r.emit(ev, vllm.EventResponseCompleted)
}

// closeItem sends the events that close the streamed item.
func (r *responsesResponder) closeItem(item vllm.ResponseItem, text string) error {
	zero := 0
	if item.Type == "function_call" {
		done := struct {
			evBase
			OutputIndex int    `json:"output_index"`
			ItemID      string `json:"item_id"`
			Arguments   string `json:"arguments"`
			Name        string `json:"name"`
		}{r.base(vllm.EventFunctionCallArgumentsDone), 0, r.itemID, item.Arguments, item.Name}
		if err := r.emit(done, vllm.EventFunctionCallArgumentsDone); err != nil {
			return err
		}
	} else {
		textDone := struct {
			evBase
			OutputIndex  int                    `json:"output_index"`
			ContentIndex int                    `json:"content_index"`
			ItemID       string                 `json:"item_id"`
			Text         string                 `json:"text"`
			Logprobs     []vllm.ResponseLogprob `json:"logprobs"`
		}{r.base(vllm.EventOutputTextDone), 0, zero, r.itemID, text, []vllm.ResponseLogprob{}}
		if len(item.Content) > 0 {
			textDone.Logprobs = orEmpty(item.Content[0].Logprobs)
		}
		if err := r.emit(textDone, vllm.EventOutputTextDone); err != nil {
			return err
		}
		part := vllm.ResponseContent{Type: "output_text", Text: text, Annotations: []json.RawMessage{}}
		partDone := struct {
			evBase
			ItemID       string               `json:"item_id"`
			OutputIndex  int                  `json:"output_index"`
			ContentIndex int                  `json:"content_index"`
			Part         vllm.ResponseContent `json:"part"`
		}{r.base(vllm.EventContentPartDone), r.itemID, 0, zero, part}
		if err := r.emit(partDone, vllm.EventContentPartDone); err != nil {
			return err
		}
	}
	done := struct {
		evBase
		OutputIndex int               `json:"output_index"`
		Item        vllm.ResponseItem `json:"item"`
	}{r.base(vllm.EventOutputItemDone), 0, item}
	return r.emit(done, vllm.EventOutputItemDone)
}
