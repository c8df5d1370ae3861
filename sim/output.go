package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strings"

	"github.com/llmgw/llmgw/vllm"
)

// What the simulated model says for a request (design §8 "Outputs"). By
// default it is text: deterministic words, exactly the request's token
// budget of them, finishing with "length" (as with ignore_eos). A request
// that constrains the output gets what a constrained vLLM engine returns:
//
//   - tools with tool_choice "required" or a named function: one call of
//     the chosen tool (the named one, else the first whose name the last
//     user message mentions, else the first), its arguments generated from
//     the function's parameters schema (jsonschema.go). vLLM forces these
//     with structured outputs: the model writes the arguments alone for a
//     named choice, and [{"name": …, "parameters": …}] for "required", and
//     ends there ("stop"; the chat answer says "stop" for a named call and
//     "tool_calls" for "required", as vLLM's does).
//   - tool_choice "auto", only when the engine runs with
//     --enable-auto-tool-choice and a --tool-call-parser (else chat refuses
//     it, as vLLM does): the model calls a tool when the conversation's last
//     message is the user's, and answers in text when it is a tool's result
//     — the agent loop call, result, answer — writing the call in Llama 3's
//     JSON tool syntax {"name": …, "parameters": …} whatever parser is
//     named, which the parser turns into a call ("tool_calls").
//   - response_format json_object: a small JSON object; json_schema: a JSON
//     value valid against the schema ("stop").
//
// An output that ends by itself gets the budget vLLM gives it — the
// request's max tokens, or else all the context the prompt leaves — and is
// cut there if longer ("length", and a cut call is left as text, as a
// parser would). Everything is drawn from the prompt's tokens and --seed,
// so a retried request gets the same answer.

// toolMode is how a request lets the model call its tools.
type toolMode int

const (
	toolNone toolMode = iota
	toolAuto
	toolRequired
	toolNamed
)

// toolSpec is one function tool: its name and parameters' schema.
type toolSpec struct {
	name   string
	params json.RawMessage
}

// toolRequest is a request's tools and tool choice, whatever its API.
type toolRequest struct {
	tools []toolSpec
	mode  toolMode
	named string // with toolNamed
}

// outputFormat is a request's response_format: "" (text), "json_object"
// or "json_schema" with schema.
type outputFormat struct {
	kind   string
	schema json.RawMessage
}

// toolCall is the call an output makes: Args spans [start, end) of the
// output's text.
type toolCall struct {
	id, name, args string
	start, end     int
}

// output is what the engine generates for a request: its tokens, their
// text, and how it reads.
type output struct {
	ids    []int
	pieces []string
	// offsets[i] is where piece i starts in the text.
	offsets []int
	// finish is the finish reason once every token is out.
	finish string
	// call is set when the output is a tool call, mode how it was asked.
	call *toolCall
	mode toolMode
	// seed is the prompt's: logprobs are drawn from it.
	seed uint64
	// limit is the most tokens the output could have taken (Responses
	// reports it as max_output_tokens).
	limit int
}

func (o *output) text() string { return strings.Join(o.pieces, "") }

// argsDelta is the part of the call's arguments token i carries ("" for a
// token of the wrapper around them).
func (o *output) argsDelta(i int) string {
	if o.call == nil {
		return ""
	}
	s, e := o.offsets[i], o.offsets[i]+len(o.pieces[i])
	s, e = max(s, o.call.start), min(e, o.call.end)
	if s >= e {
		return ""
	}
	return o.text()[s:e]
}

// finishReason is the chat finish reason of the output's end: "stop" for a
// named call (vLLM's and OpenAI's convention), "tool_calls" for another
// call, else how generation ended.
func (o *output) finishReason() string {
	if o.call != nil && o.finish == vllm.FinishedStop && o.mode != toolNamed {
		return "tool_calls"
	}
	return o.finish
}

// planInput is what decides a request's output.
type planInput struct {
	prompt   []int
	messages []vllm.ChatMessage
	// textTokens is a text answer's length; budget what an output that
	// ends by itself may take.
	textTokens, budget int
	tools              toolRequest
	format             outputFormat
	// callIDPrefix starts tool-call ids: "chatcmpl-tool-" (chat, Messages)
	// or "call_" (Responses).
	callIDPrefix string
}

// plan decides the output. An error is the request's fault (a schema it
// cannot generate for): the handler answers 400.
func (s *Server) plan(in planInput) (*output, error) {
	seed := s.promptSeed(in.prompt)
	o := &output{seed: seed, finish: vllm.FinishedLength, limit: in.budget}
	if spec, mode, ok := s.chooseTool(in); ok {
		args := "{}"
		if len(in.tools.tools) > 0 && len(spec.params) > 0 && string(spec.params) != "null" {
			var err error
			if args, err = genJSON(spec.params, seed^fnvString(spec.name)); err != nil {
				return nil, fmt.Errorf("tools[%s].parameters: %w", spec.name, err)
			}
		}
		var text string
		var start int
		switch mode {
		case toolNamed:
			text = args
		case toolRequired:
			text = `[{"name": ` + pyString(spec.name) + `, "parameters": `
			start, text = len(text), text+args+"}]"
		default:
			text = `{"name": ` + pyString(spec.name) + `, "parameters": `
			start, text = len(text), text+args+"}"
		}
		o.mode = mode
		o.call = &toolCall{id: in.callIDPrefix + s.newID(), name: spec.name, args: args, start: start, end: start + len(args)}
		s.setText(o, text, in.budget)
		if o.finish != vllm.FinishedStop && mode != toolNamed {
			o.call = nil // cut short: no parser finds a whole call
		} else if o.finish != vllm.FinishedStop {
			o.call.end = min(o.call.end, len(o.text()))
			o.call.args = o.text()[o.call.start:o.call.end]
		}
		return o, nil
	}
	switch in.format.kind {
	case "json_object":
		s.setText(o, genJSONObject(seed), in.budget)
		return o, nil
	case "json_schema":
		text, err := genJSON(in.format.schema, seed)
		if err != nil {
			return nil, fmt.Errorf("response_format.json_schema.schema: %w", err)
		}
		s.setText(o, text, in.budget)
		return o, nil
	}
	o.limit = in.textTokens
	ids, texts := s.generate(in.prompt, in.textTokens)
	o.ids, o.pieces = ids, texts
	o.offsets = offsetsOf(texts)
	return o, nil
}

// setText makes text the output, cut to budget tokens.
func (s *Server) setText(o *output, text string, budget int) {
	o.ids, o.pieces = s.tok.EncodePieces(text)
	o.finish = vllm.FinishedStop
	if len(o.ids) > budget {
		o.ids, o.pieces = o.ids[:budget], o.pieces[:budget]
		o.finish = vllm.FinishedLength
	}
	o.offsets = offsetsOf(o.pieces)
}

func offsetsOf(pieces []string) []int {
	offs := make([]int, len(pieces))
	n := 0
	for i, p := range pieces {
		offs[i] = n
		n += len(p)
	}
	return offs
}

// chooseTool applies the tool rules: which tool, if any, the output calls.
func (s *Server) chooseTool(in planInput) (toolSpec, toolMode, bool) {
	t := in.tools
	if len(t.tools) == 0 {
		return toolSpec{}, toolNone, false
	}
	switch t.mode {
	case toolNamed:
		for _, spec := range t.tools {
			if spec.name == t.named {
				return spec, toolNamed, true
			}
		}
		return toolSpec{}, toolNone, false
	case toolRequired:
		return mentionedTool(t.tools, in.messages), toolRequired, true
	case toolAuto:
		if !s.cfg.EnableAutoToolChoice || len(in.messages) == 0 || in.messages[len(in.messages)-1].Role != "user" {
			return toolSpec{}, toolNone, false
		}
		return mentionedTool(t.tools, in.messages), toolAuto, true
	}
	return toolSpec{}, toolNone, false
}

// mentionedTool is the first tool the last user message names, else the
// first tool.
func mentionedTool(tools []toolSpec, messages []vllm.ChatMessage) toolSpec {
	for i := len(messages) - 1; i >= 0; i-- {
		if messages[i].Role != "user" {
			continue
		}
		text, _ := messages[i].Text()
		for _, spec := range tools {
			if spec.name != "" && strings.Contains(text, spec.name) {
				return spec
			}
		}
		break
	}
	return tools[0]
}

// promptSeed is the seed of everything drawn for a prompt.
func (s *Server) promptSeed(prompt []int) uint64 {
	h := fnv.New64a()
	var b [8]byte
	for _, t := range prompt {
		for i := range b {
			b[i] = byte(uint64(t) >> (8 * i))
		}
		h.Write(b[:])
	}
	return h.Sum64() ^ uint64(s.cfg.Seed)
}

func fnvString(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// tokenLogprob is the simulated log probability of output token i and its
// top alternatives (the sampled token first, as the most likely): top
// entries in all, deterministic in the prompt and the position.
func (o *output) tokenLogprob(i, top int) (float64, []vllm.TopLogprob) {
	rng := rand.New(rand.NewPCG(o.seed, uint64(i)+0x6c6f6770))
	lp := -rng.Float64() * 0.7
	tok := o.pieces[i]
	alts := make([]vllm.TopLogprob, 0, top)
	if top > 0 {
		alts = append(alts, vllm.TopLogprob{Token: tok, Logprob: lp, Bytes: utf8Bytes(tok)})
	}
	prev := lp
	for k := rng.IntN(len(generatedWords)); len(alts) < top; k = (k + 1) % len(generatedWords) {
		alt := " " + generatedWords[k]
		if alt == tok {
			continue
		}
		prev -= 0.3 + rng.Float64()*1.5
		alts = append(alts, vllm.TopLogprob{Token: alt, Logprob: prev, Bytes: utf8Bytes(alt)})
	}
	return lp, alts
}

func utf8Bytes(s string) []int {
	b := make([]int, len(s))
	for i := range len(s) {
		b[i] = int(s[i])
	}
	return b
}

// chatLogprobs is tokens [from, to)'s logprobs in chat's shape.
func (o *output) chatLogprobs(from, to, top int) *vllm.ChatLogprobs {
	lps := &vllm.ChatLogprobs{Content: []vllm.ChatLogprob{}}
	for i := from; i < to; i++ {
		lp, alts := o.tokenLogprob(i, top)
		lps.Content = append(lps.Content, vllm.ChatLogprob{Token: o.pieces[i], Logprob: lp,
			Bytes: utf8Bytes(o.pieces[i]), TopLogprobs: alts})
	}
	return lps
}

// completionLogprobs is tokens [from, to)'s logprobs in the completions
// shape: each position's top_logprobs holds the sampled token and up to top
// alternatives (vLLM returns top+1 entries, the sampled one among them;
// here the sampled token ranks first, so its entry is not repeated).
func (o *output) completionLogprobs(from, to, top int) *vllm.CompletionLogprobs {
	lps := &vllm.CompletionLogprobs{TextOffset: []int{}, TokenLogprobs: []float64{}, Tokens: []string{},
		TopLogprobs: []vllm.TokenLogprobs{}}
	for i := from; i < to; i++ {
		lp, alts := o.tokenLogprob(i, max(top, 1))
		lps.TextOffset = append(lps.TextOffset, o.offsets[i])
		lps.TokenLogprobs = append(lps.TokenLogprobs, lp)
		lps.Tokens = append(lps.Tokens, o.pieces[i])
		lps.TopLogprobs = append(lps.TopLogprobs, alts)
	}
	return lps
}

// parseChatTools reads chat's tools and tool_choice with vLLM's checks
// (ChatCompletionRequest.check_tool_usage): tool_choice defaults to "auto"
// when tools are given, needs tools, and a named function must be one of
// them.
func parseChatTools(toolsRaw, choiceRaw json.RawMessage) (toolRequest, error) {
	var tr toolRequest
	hasTools := len(toolsRaw) > 0 && string(toolsRaw) != "null"
	if hasTools {
		var tools []struct {
			Type     string `json:"type"`
			Function *struct {
				Name       string          `json:"name"`
				Parameters json.RawMessage `json:"parameters"`
			} `json:"function"`
		}
		if err := json.Unmarshal(toolsRaw, &tools); err != nil {
			return tr, fmt.Errorf("tools: %w", err)
		}
		for i, t := range tools {
			if t.Type != "function" || t.Function == nil || t.Function.Name == "" {
				return tr, fmt.Errorf("tools[%d]: want {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": ...}}", i)
			}
			tr.tools = append(tr.tools, toolSpec{name: t.Function.Name, params: t.Function.Parameters})
		}
	}
	choice, named, err := parseToolChoice(choiceRaw, func(raw json.RawMessage) (string, error) {
		var c struct {
			Function *struct {
				Name *string `json:"name"`
			} `json:"function"`
		}
		usage := "Correct usage: `{\"type\": \"function\", \"function\": {\"name\": \"my_function\"}}`"
		if err := json.Unmarshal(raw, &c); err != nil || c.Function == nil {
			return "", fmt.Errorf("Invalid value for `function` in `tool_choice`! %s", usage) //nolint:staticcheck // ST1005: vLLM's wording
		}
		if c.Function.Name == nil {
			return "", fmt.Errorf("Expected field `name` in `function` in `tool_choice`! %s", usage) //nolint:staticcheck // ST1005: vLLM's wording
		}
		if *c.Function.Name == "" {
			return "", fmt.Errorf("Invalid `name` in `function`: `` in `tool_choice`! %s", usage) //nolint:staticcheck // ST1005: vLLM's wording
		}
		return *c.Function.Name, nil
	})
	if err != nil {
		return tr, err
	}
	if choice == "" {
		choice = "none"
		if hasTools {
			choice = "auto"
		}
	}
	return finishToolRequest(tr, choice, named, hasTools)
}

// parseToolChoice reads a tool_choice: a string, or an object whose named
// function named reads.
func parseToolChoice(raw json.RawMessage, named func(json.RawMessage) (string, error)) (string, string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", "", nil
	}
	var str string
	if json.Unmarshal(raw, &str) == nil {
		return str, "", nil
	}
	var obj struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", "", fmt.Errorf("tool_choice: %w", err)
	}
	name, err := named(raw)
	if err != nil {
		return "", "", err
	}
	return "named", name, nil
}

func finishToolRequest(tr toolRequest, choice, named string, hasTools bool) (toolRequest, error) {
	switch choice {
	case "none":
		tr.mode = toolNone
		return tr, nil
	case "auto", "required", "named":
	default:
		return tr, fmt.Errorf("Invalid value for `tool_choice`: %s! Only named tools, \"none\", \"auto\" or \"required\" are supported.", choice) //nolint:staticcheck // ST1005: vLLM's wording
	}
	if !hasTools {
		return tr, errors.New("When using `tool_choice`, `tools` must be set.") //nolint:staticcheck // ST1005: vLLM's wording
	}
	switch choice {
	case "auto":
		tr.mode = toolAuto
	case "required":
		tr.mode = toolRequired
		if len(tr.tools) == 0 { // vLLM: as "none", as OpenAI does
			tr.mode = toolNone
		}
	default:
		tr.mode, tr.named = toolNamed, named
		found := false
		for _, t := range tr.tools {
			found = found || t.name == named
		}
		if !found {
			return tr, errors.New("The tool specified in `tool_choice` does not match any of the specified `tools`") //nolint:staticcheck // ST1005: vLLM's wording
		}
	}
	return tr, nil
}

// parseResponseFormat reads chat's and completions' response_format.
// structural_tag is refused: the simulator cannot follow a grammar.
func parseResponseFormat(raw json.RawMessage) (outputFormat, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return outputFormat{}, nil
	}
	var rf struct {
		Type       string `json:"type"`
		JSONSchema *struct {
			Schema json.RawMessage `json:"schema"`
		} `json:"json_schema"`
	}
	if err := json.Unmarshal(raw, &rf); err != nil {
		return outputFormat{}, fmt.Errorf("response_format: %w", err)
	}
	switch rf.Type {
	case "text":
		return outputFormat{}, nil
	case "json_object":
		return outputFormat{kind: "json_object"}, nil
	case "json_schema":
		if rf.JSONSchema == nil || len(rf.JSONSchema.Schema) == 0 || string(rf.JSONSchema.Schema) == "null" {
			return outputFormat{}, errors.New("response_format: json_schema.schema is required by the simulator")
		}
		return outputFormat{kind: "json_schema", schema: rf.JSONSchema.Schema}, nil
	case "structural_tag":
		return outputFormat{}, errors.New("response_format: structural_tag is not emulated by the simulator")
	}
	return outputFormat{}, fmt.Errorf("response_format.type: %q: must be text, json_object or json_schema", rf.Type)
}

// checkLogprobs applies vLLM's limit on alternatives (--max-logprobs,
// checked by its input processor) to a request's top count.
func (s *Server) checkLogprobs(top int) error {
	if top == -1 {
		return errors.New("top_logprobs -1 (the whole vocabulary) is not emulated by the simulator")
	}
	if top < 0 {
		return errors.New("`top_logprobs` must be a positive value or -1.") //nolint:staticcheck // ST1005: vLLM's wording
	}
	if s.cfg.MaxLogprobs >= 0 && top > s.cfg.MaxLogprobs {
		return fmt.Errorf("Requested sample logprobs of %d, which is greater than max allowed: %d", top, s.cfg.MaxLogprobs) //nolint:staticcheck // ST1005: vLLM's wording
	}
	return nil
}
