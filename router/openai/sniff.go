package openai

import (
	"encoding/json"
	"errors"
)

// Request is all the router reads of a request body; the body itself is
// forwarded byte for byte (design §7.1).
type Request struct {
	Model  string
	Stream bool
	// Prompt is the prompt's leading text as the prefix tree keys it
	// (design §7.5 tier 1): each chat message as "role\x00content\x00" in
	// order, or the completion prompt. At most MaxPromptBytes; "" when the
	// request has no text the router understands. It is a routing hint
	// only: a shape it cannot read costs affinity, never the request.
	Prompt string
}

// MaxPromptBytes bounds the prompt text kept for routing: 8 KiB, past a
// system prompt and a few turns, where replicas' caches stop differing in
// ways the prefix tree could tell apart.
const MaxPromptBytes = 8 << 10

// Sniff reads model, stream and the prompt's text from a JSON request
// body. Keys match exactly, as the engines' own parsers do (encoding/json
// would also accept "Model"), and the whole body must be valid JSON, so
// the router refuses what the engine would refuse rather than forward
// garbage. One validating pass (json.Valid) and one pass of the
// allocation-free scanner (scan.go) read everything; only the prompt's
// text and the model's name are copied out.
func Sniff(body []byte) (Request, error) { return SniffFor(Chat, body) }

// SniffFor is Sniff for a body sent to api: the prompt text is read from
// the fields that API names it by (design §7.5 tier 1) — messages or
// prompt for OpenAI's chat and completions, instructions and input for
// the Responses API, system and messages for Anthropic's Messages API —
// and laid out alike, "role\x00text\x00" per message, so one
// conversation keys the prefix tree alike whichever API carried it (the
// engine caches one conversation alike too, as every API renders it with
// one chat template). Embeddings and count_tokens are routed by load
// alone: no prompt, and count_tokens never streams.
func SniffFor(api API, body []byte) (Request, error) {
	if !json.Valid(body) {
		var v any
		err := json.Unmarshal(body, &v) // the reason, for the client
		if err == nil {
			err = errors.New("invalid JSON")
		}
		return Request{}, InvalidJSON(err)
	}
	i := skipWS(body, 0)
	if i >= len(body) || body[i] != '{' {
		return Request{}, InvalidJSON(errors.New("the body must be a JSON object"))
	}
	var model, stream, messages, prompt, input, instructions, system []byte
	eachField(body, i, func(key []byte, vs, ve int) bool {
		v := body[vs:ve]
		switch {
		case keyIs(key, "model"):
			model = v
		case keyIs(key, "stream"):
			stream = v
		case keyIs(key, "messages"):
			messages = v
		case keyIs(key, "prompt"):
			prompt = v
		case keyIs(key, "input"):
			input = v
		case keyIs(key, "instructions"):
			instructions = v
		case keyIs(key, "system"):
			system = v
		}
		return true
	})
	var out Request
	if model == nil {
		return Request{}, InvalidField("model", "model is required")
	}
	m, ok := stringValue(model)
	if !ok {
		return Request{}, InvalidField("model", "model must be a string")
	}
	if m == "" {
		return Request{}, InvalidField("model", "model must not be empty")
	}
	out.Model = m
	switch string(stream) {
	case "", "null", "false":
	case "true":
		out.Stream = true
	default:
		return Request{}, InvalidField("stream", "stream must be a boolean")
	}
	switch api {
	case Chat, Completions:
		if messages != nil {
			out.Prompt = chatText(messages)
		} else if prompt != nil {
			out.Prompt = promptText(prompt)
		}
	case Responses:
		out.Prompt = responsesText(instructions, input)
	case Messages:
		out.Prompt = messagesText(system, messages)
	case Embeddings, CountTokens:
		out.Stream = false
	}
	return out, nil
}

// chatText renders messages for the prefix tree. Content is a string or
// a list of parts, of which the text parts count; a message the router
// cannot read ends the text there, since what follows would not be a
// prefix. messages that are not a list of objects with string roles give "".
func chatText(raw []byte) string {
	if len(raw) == 0 || raw[0] != '[' {
		return ""
	}
	out := make([]byte, 0, min(len(raw), MaxPromptBytes+64))
	stop, bad := false, false
	ok := eachElement(raw, 0, func(ms, me int) bool {
		msg := raw[ms:me]
		if string(msg) == "null" {
			msg = []byte("{}") // decodes as an empty message: its missing content ends the text
		}
		if msg[0] != '{' {
			bad = true
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
		if role != nil && string(role) != "null" && role[0] != '"' {
			bad = true // encoding/json would refuse the whole list
			return false
		}
		if stop || len(out) >= MaxPromptBytes {
			return true // keep checking roles, as a full decode would
		}
		if role != nil {
			out, _ = appendStringValue(out, role)
		}
		out = append(out, 0)
		switch {
		case content == nil:
			stop = true
			return true
		case string(content) == "null":
		case content[0] == '"':
			out, _ = appendStringValue(out, content)
		case content[0] == '[':
			// A list the router cannot read adds nothing: check it all
			// before taking any of its text.
			if !eachPart(content, func(_, _ []byte) bool { return true }) {
				stop = true
				return true
			}
			eachPart(content, func(typ, text []byte) bool {
				if t, _ := stringValue(typ); t == "text" && text != nil {
					out, _ = appendStringValue(out, text)
				}
				return true
			})
		default:
			stop = true
			return true
		}
		out = append(out, 0)
		return true
	})
	if !ok || bad {
		return ""
	}
	return truncate(string(out))
}

// eachPart calls fn with each content part's type and text values (nil
// when absent); false when a part is neither an object nor null, or its
// type or text is not a string.
func eachPart(content []byte, fn func(typ, text []byte) bool) bool {
	good := true
	ok := eachElement(content, 0, func(ps, pe int) bool {
		part := content[ps:pe]
		if string(part) == "null" {
			return true
		}
		if part[0] != '{' {
			good = false
			return false
		}
		var typ, text []byte
		eachField(part, 0, func(key []byte, vs, ve int) bool {
			switch {
			case keyIs(key, "type"):
				typ = part[vs:ve]
			case keyIs(key, "text"):
				text = part[vs:ve]
			}
			return true
		})
		if !stringOrNull(typ) || !stringOrNull(text) {
			good = false
			return false
		}
		return fn(typ, text)
	})
	return ok && good
}

// stringOrNull reports whether a part's field decodes into a Go string:
// absent, null, or a string.
func stringOrNull(v []byte) bool {
	return v == nil || string(v) == "null" || v[0] == '"'
}

// promptText reads a completion prompt: a string, or a batch of which the
// first counts; token ids are keyed by their JSON spelling, which is as
// stable as the tokens.
func promptText(raw []byte) string {
	if s, ok := stringValue(raw); ok {
		return truncate(s)
	}
	if len(raw) == 0 || raw[0] != '[' {
		return ""
	}
	var first []byte
	eachElement(raw, 0, func(s, e int) bool {
		first = raw[s:e]
		return false
	})
	switch {
	case first == nil:
		return ""
	case first[0] == '"':
		s, _ := stringValue(first)
		return truncate(s)
	case first[0] == '[':
		return truncate(string(first)) // a batch of token lists
	default:
		return truncate(string(raw)) // one token list
	}
}

func truncate(s string) string {
	if len(s) > MaxPromptBytes {
		return s[:MaxPromptBytes]
	}
	return s
}
