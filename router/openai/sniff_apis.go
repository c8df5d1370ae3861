package openai

import "bytes"

// The prompt text of the Responses and Messages APIs for the prefix tree
// (design §7.5 tier 1), in chat's layout: "role\x00text\x00" per message,
// the system prompt first. A routing hint only: a shape the router cannot
// read ends the text there (what follows would not be a prefix), and
// nothing here refuses a request — the engine validates.

// responsesText reads the Responses API's instructions and input as vLLM
// turns them into chat messages (vllm/entrypoints/openai/responses/utils.py
// construct_input_messages): the instructions as the system message, a
// string input as one user message, and each input item in order — a
// message by its role and its text parts (input_text, output_text), a
// function call's output as the tool's, a function call as the
// assistant's arguments. Reasoning items add nothing.
func responsesText(instructions, input []byte) string {
	out := make([]byte, 0, min(len(instructions)+len(input), MaxPromptBytes+64))
	if s, ok := stringValue(instructions); ok && s != "" {
		out = appendMessage(out, "system", s)
	}
	if s, ok := stringValue(input); ok {
		return truncate(string(appendMessage(out, "user", s)))
	}
	if len(input) == 0 || input[0] != '[' {
		return truncate(string(out))
	}
	eachElement(input, 0, func(is, ie int) bool {
		if len(out) >= MaxPromptBytes {
			return false
		}
		item := input[is:ie]
		if item[0] != '{' {
			return false
		}
		var typ, role, content, output, arguments []byte
		eachField(item, 0, func(key []byte, vs, ve int) bool {
			switch {
			case keyIs(key, "type"):
				typ = item[vs:ve]
			case keyIs(key, "role"):
				role = item[vs:ve]
			case keyIs(key, "content"):
				content = item[vs:ve]
			case keyIs(key, "output"):
				output = item[vs:ve]
			case keyIs(key, "arguments"):
				arguments = item[vs:ve]
			}
			return true
		})
		t, _ := stringValue(typ)
		switch {
		case role != nil:
			r, ok := stringValue(role)
			if !ok {
				return false
			}
			var ok2 bool
			if out, ok2 = appendContent(append(append(out, r...), 0), content, nil); !ok2 {
				return false
			}
			out = append(out, 0)
		case t == "function_call_output":
			s, ok := stringValue(output)
			if !ok {
				return false
			}
			out = appendMessage(out, "tool", s)
		case t == "function_call":
			s, ok := stringValue(arguments)
			if !ok {
				return false
			}
			out = appendMessage(out, "assistant", s)
		case t == "reasoning":
		default:
			return false
		}
		return true
	})
	return truncate(string(out))
}

// billingHeader starts the system block Claude Code adds to every request,
// a per-request hash that would make every prompt unique; vLLM drops it
// before rendering (vllm/entrypoints/anthropic/serving.py
// _convert_system_message), and so does the prefix tree.
var billingHeader = []byte("x-anthropic-billing-header")

// messagesText reads Anthropic's system and messages as vLLM turns them
// into chat messages (vllm/entrypoints/anthropic/serving.py): the system
// prompt, a string or text blocks joined, then each message by its role
// and its blocks' text — text blocks, and a tool result's text (its
// string, or its text items). Tool uses add their input as written;
// thinking and images add nothing.
func messagesText(system, messages []byte) string {
	out := make([]byte, 0, min(len(system)+len(messages), MaxPromptBytes+64))
	if system != nil && string(system) != "null" {
		n := len(out)
		out = append(out, "system\x00"...)
		var ok bool
		if out, ok = appendContent(out, system, billingHeader); !ok {
			return ""
		}
		if len(out) == n+len("system\x00") {
			out = out[:n] // no text: vLLM adds no system message
		} else {
			out = append(out, 0)
		}
	}
	if len(messages) == 0 || messages[0] != '[' {
		return truncate(string(out))
	}
	eachElement(messages, 0, func(ms, me int) bool {
		if len(out) >= MaxPromptBytes {
			return false
		}
		msg := messages[ms:me]
		if msg[0] != '{' {
			return false
		}
		var role, content []byte
		eachField(msg, 0, func(key []byte, vs, ve int) bool {
			switch {
			case keyIs(key, "role"):
				role = msg[vs:ve]
			case keyIs(key, "content"):
				content = msg[vs:ve]
			}
			return true
		})
		r, ok := stringValue(role)
		if !ok {
			return false
		}
		if out, ok = appendContent(append(append(out, r...), 0), content, nil); !ok {
			return false
		}
		out = append(out, 0)
		return true
	})
	return truncate(string(out))
}

// appendMessage appends one message's role and text.
func appendMessage(out []byte, role, text string) []byte {
	out = append(out, role...)
	out = append(out, 0)
	out = append(out, text...)
	return append(out, 0)
}

// appendContent appends the text of a message's content: a string, or a
// list of blocks (parts) whose text counts — text, input_text and
// output_text blocks' text, a tool_result's content (recursively), a
// tool_use's input as written — skipping blocks whose text starts with
// skip. False when content is neither a string nor a list of objects.
func appendContent(out, content, skip []byte) ([]byte, bool) {
	if s, ok := stringValue(content); ok {
		return append(out, s...), true
	}
	if len(content) == 0 || content[0] != '[' {
		return out, false
	}
	good := true
	eachElement(content, 0, func(bs, be int) bool {
		b := content[bs:be]
		if b[0] != '{' {
			good = false
			return false
		}
		var typ, text, inner, input []byte
		eachField(b, 0, func(key []byte, vs, ve int) bool {
			switch {
			case keyIs(key, "type"):
				typ = b[vs:ve]
			case keyIs(key, "text"):
				text = b[vs:ve]
			case keyIs(key, "content"):
				inner = b[vs:ve]
			case keyIs(key, "input"):
				input = b[vs:ve]
			}
			return true
		})
		switch t, _ := stringValue(typ); t {
		case "text", "input_text", "output_text":
			if s, ok := stringValue(text); ok && (skip == nil || !bytes.HasPrefix([]byte(s), skip)) {
				out = append(out, s...)
			}
		case "tool_result":
			if inner != nil && string(inner) != "null" {
				out, _ = appendContent(out, inner, nil)
			}
		case "tool_use":
			out = append(out, input...)
		}
		return true
	})
	return out, good
}
