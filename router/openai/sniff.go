package openai

import (
	"encoding/json"
	"errors"
	"strings"
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

// Sniff reads model, stream and the prompt's text from a JSON request body. Keys match
// exactly, as the engines' own parsers do (encoding/json would also accept
// "Model"), and the whole body must be valid JSON, so the router refuses
// what the engine would refuse rather than forward garbage.
func Sniff(body []byte) (Request, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return Request{}, InvalidJSON(err)
	}
	if fields == nil {
		return Request{}, InvalidJSON(errors.New("the body must be a JSON object"))
	}
	var out Request
	raw, ok := fields["model"]
	if !ok {
		return Request{}, InvalidField("model", "model is required")
	}
	if err := json.Unmarshal(raw, &out.Model); err != nil {
		return Request{}, InvalidField("model", "model must be a string")
	}
	if out.Model == "" {
		return Request{}, InvalidField("model", "model must not be empty")
	}
	if raw, ok := fields["stream"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &out.Stream); err != nil {
			return Request{}, InvalidField("stream", "stream must be a boolean")
		}
	}
	if raw, ok := fields["messages"]; ok {
		out.Prompt = chatText(raw)
	} else if raw, ok := fields["prompt"]; ok {
		out.Prompt = promptText(raw)
	}
	return out, nil
}

// chatText renders messages for the prefix tree. Content is a string or
// a list of parts, of which the text parts count; a message the router
// cannot read ends the text there, since what follows would not be a prefix.
func chatText(raw json.RawMessage) string {
	var msgs []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(raw, &msgs) != nil {
		return ""
	}
	var b strings.Builder
	for _, m := range msgs {
		if b.Len() >= MaxPromptBytes {
			break
		}
		b.WriteString(m.Role)
		b.WriteByte(0)
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			b.WriteString(s)
		} else {
			var parts []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			}
			if json.Unmarshal(m.Content, &parts) != nil {
				break
			}
			for _, p := range parts {
				if p.Type == "text" {
					b.WriteString(p.Text)
				}
			}
		}
		b.WriteByte(0)
	}
	return truncate(b.String())
}

// promptText reads a completion prompt: a string, or a batch of which the
// first counts; token ids are keyed by their JSON spelling, which is as
// stable as the tokens.
func promptText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return truncate(s)
	}
	var batch []json.RawMessage
	if json.Unmarshal(raw, &batch) == nil && len(batch) > 0 {
		if json.Unmarshal(batch[0], &s) == nil {
			return truncate(s)
		}
		if len(batch[0]) > 0 && batch[0][0] == '[' {
			return truncate(string(batch[0])) // a batch of token lists
		}
		return truncate(string(raw)) // one token list
	}
	return ""
}

func truncate(s string) string {
	if len(s) > MaxPromptBytes {
		return s[:MaxPromptBytes]
	}
	return s
}
