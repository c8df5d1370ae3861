package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
)

// The router forwards a request's bytes as the client sent them (design
// §7.1), with two exceptions that edit single top-level fields in place:
// a stream gets stream_options.include_usage so the engine reports
// cached_tokens, and a llama.cpp adapter request names the base model and
// the adapter in `lora`. Everything else — key order, spacing, fields the
// router does not know — reaches the engine untouched.

// span is where a top-level field's value lies in a JSON object.
type span struct{ start, end int }

// topLevel returns the spans of an object's top-level values by key (the
// last one wins, as encoding/json and the engines' parsers do) and the
// offset of its opening brace. The body has passed Sniff (valid JSON).
func topLevel(body []byte) (map[string]span, int, error) {
	open := skipWS(body, 0)
	if open >= len(body) || body[open] != '{' {
		return nil, 0, errors.New("not a JSON object")
	}
	out := map[string]span{}
	var bad bool
	ok := eachField(body, open, func(key []byte, vs, ve int) bool {
		k, good := stringValue(append(append([]byte{'"'}, key...), '"'))
		if !good {
			bad = true
			return false
		}
		out[k] = span{vs, ve}
		return true
	})
	if !ok || bad {
		return nil, 0, errors.New("malformed JSON object")
	}
	return out, open, nil
}

// field returns the span of the top-level field name (the last, when it
// repeats) without allocating; ok is false when absent or the body is not
// an object.
func field(body []byte, name string) (sp span, ok bool) {
	open := skipWS(body, 0)
	if open >= len(body) || body[open] != '{' {
		return span{}, false
	}
	eachField(body, open, func(key []byte, vs, ve int) bool {
		if keyIs(key, name) {
			sp, ok = span{vs, ve}, true
		}
		return true
	})
	return sp, ok
}

// edit is one replacement of body[start:end] by text (an insertion when
// start == end).
type edit struct {
	start, end int
	text       string
}

// setFields sets top-level fields to the given JSON values: a present
// field's value is replaced where it stands, a missing one is inserted
// right after the opening brace.
func setFields(body []byte, fields map[string]string, order []string) ([]byte, error) {
	spans, open, err := topLevel(body)
	if err != nil {
		return nil, fmt.Errorf("rewrite body: %w", err)
	}
	var edits []edit
	insert := ""
	for _, k := range order {
		v := fields[k]
		if sp, ok := spans[k]; ok {
			edits = append(edits, edit{sp.start, sp.end, v})
			continue
		}
		kq, _ := json.Marshal(k)
		insert += string(kq) + ":" + v + ","
	}
	if insert != "" {
		if len(spans) == 0 {
			insert = insert[:len(insert)-1] // {} has no field to put a comma before
		}
		edits = append(edits, edit{open + 1, open + 1, insert})
	}
	slices.SortFunc(edits, func(a, b edit) int { return b.start - a.start })
	out := slices.Clone(body)
	for _, e := range edits {
		out = slices.Concat(out[:e.start], []byte(e.text), out[e.end:])
	}
	return out, nil
}

// WantsUsage reports whether a request already asks for usage on its
// stream: stream_options.include_usage is true.
func WantsUsage(body []byte) bool {
	sp, ok := field(body, "stream_options")
	if !ok {
		return false
	}
	opts := body[sp.start:sp.end]
	want := false
	if !eachField(opts, 0, func(key []byte, vs, ve int) bool {
		if keyIs(key, "include_usage") {
			want = string(opts[vs:ve]) == "true"
		}
		return true
	}) {
		return false
	}
	return want
}

// WithUsage returns body asking for usage on the stream (design §7.1),
// keeping the client's other stream options byte for byte: only
// include_usage is set (replaced where it stands, or inserted first).
func WithUsage(body []byte) ([]byte, error) {
	spans, _, err := topLevel(body)
	if err != nil {
		return nil, fmt.Errorf("rewrite body: %w", err)
	}
	sp, ok := spans["stream_options"]
	if !ok || string(body[sp.start:sp.end]) == "null" {
		return setFields(body, map[string]string{"stream_options": `{"include_usage":true}`}, []string{"stream_options"})
	}
	opts := body[sp.start:sp.end]
	inner, _, err := topLevel(opts)
	if err != nil {
		return nil, InvalidField("stream_options", "stream_options must be an object")
	}
	var v []byte
	if u, ok := inner["include_usage"]; ok {
		v = slices.Concat(opts[:u.start], []byte("true"), opts[u.end:])
	} else {
		v, _ = setFields(opts, map[string]string{"include_usage": "true"}, []string{"include_usage"})
	}
	return setFields(body, map[string]string{"stream_options": string(v)}, []string{"stream_options"})
}

// ForLlamaCpp returns body addressed to llama.cpp's server: `model` the
// base model, the adapter as `lora` by its index in the model's list, the
// order the agent passes --lora in (llama.cpp zeroes the scale of every
// adapter a request does not list).
func ForLlamaCpp(body []byte, base string, index int) ([]byte, error) {
	m, _ := json.Marshal(base)
	return setFields(body, map[string]string{
		"model": string(m),
		"lora":  `[{"id":` + strconv.Itoa(index) + `,"scale":1}]`,
	}, []string{"model", "lora"})
}

// UsageStripper passes an SSE stream through event by event, dropping the
// usage-only chunk (empty choices, a usage object) the router asked for
// and the client did not (design §7.1). Each complete event is written as
// soon as its blank line arrives, so streaming stays incremental; only a
// partial event waits for the rest of itself.
type UsageStripper struct {
	dst     io.Writer
	pending []byte
}

// NewUsageStripper returns a stripper writing to dst; call Flush once the
// stream has ended.
func NewUsageStripper(dst io.Writer) *UsageStripper { return &UsageStripper{dst: dst} }

func (s *UsageStripper) Write(p []byte) (int, error) {
	s.pending = append(s.pending, p...)
	var out []byte
	for {
		end, next := eventEnd(s.pending)
		if end < 0 {
			break
		}
		ev := s.pending[:next]
		if !isUsageChunk(s.pending[:end]) {
			out = append(out, ev...)
		}
		s.pending = s.pending[next:]
	}
	if len(out) > 0 {
		if _, err := s.dst.Write(out); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// Flush writes a trailing partial event as it is: the engine ended the
// stream without its blank line.
func (s *UsageStripper) Flush() error {
	if len(s.pending) == 0 {
		return nil
	}
	p := s.pending
	s.pending = nil
	if isUsageChunk(p) {
		return nil
	}
	_, err := s.dst.Write(p)
	return err
}

// eventEnd finds the first event's end in b: end is where its blank line
// starts, next where the following event starts; -1 when incomplete.
func eventEnd(b []byte) (end, next int) {
	for i := 0; i < len(b); i++ {
		if b[i] != '\n' {
			continue
		}
		j := i + 1
		if j < len(b) && b[j] == '\r' {
			j++
		}
		if j < len(b) && b[j] == '\n' {
			return i, j + 1
		}
	}
	return -1, -1
}

// isUsageChunk reports whether an SSE event is the final usage chunk: a
// data line whose JSON has no choices and a non-null usage.
func isUsageChunk(ev []byte) bool {
	if !bytes.Contains(ev, []byte(`"usage"`)) {
		return false
	}
	for _, line := range bytes.Split(ev, []byte("\n")) {
		data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r"), []byte("data:"))
		if !ok {
			continue
		}
		var c struct {
			Choices []json.RawMessage `json:"choices"`
			Usage   json.RawMessage   `json:"usage"`
		}
		if json.Unmarshal(bytes.TrimSpace(data), &c) == nil && len(c.Choices) == 0 &&
			len(c.Usage) > 0 && string(c.Usage) != "null" {
			return true
		}
	}
	return false
}
