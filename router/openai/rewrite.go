package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// The router forwards a request's bytes as the client sent them (design
// §7.1), with three exceptions that edit single top-level fields in place:
// a stream gets stream_options.include_usage so the engine reports
// cached_tokens, a llama.cpp adapter request names the base model and
// the adapter in `lora`, and an engine that schedules by priority is told
// the request's class in `priority`. Everything else — key order, spacing, fields the
// router does not know — reaches the engine untouched.

// span is where a top-level field's value lies in a JSON object; start
// is -1 for a field the object does not have.
type span struct{ start, end int }

// topLevel finds the spans of the named top-level fields of an object
// (the last one wins when a key repeats, as encoding/json and the
// engines' parsers do), how many fields it has, and the offset of its
// opening brace. The body has passed Sniff (valid JSON); nothing is
// allocated beyond the returned spans.
func topLevel(body []byte, names ...string) (spans []span, fields, open int, err error) {
	open = skipWS(body, 0)
	if open >= len(body) || body[open] != '{' {
		return nil, 0, 0, errors.New("not a JSON object")
	}
	spans = make([]span, len(names))
	for i := range spans {
		spans[i].start = -1
	}
	if !eachField(body, open, func(key []byte, vs, ve int) bool {
		fields++
		for i, n := range names {
			if keyIs(key, n) {
				spans[i] = span{vs, ve}
			}
		}
		return true
	}) {
		return nil, 0, 0, errors.New("malformed JSON object")
	}
	return spans, fields, open, nil
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

// setting is one top-level field set by setFields: its name and JSON value.
type setting struct{ name, value string }

// setFields sets top-level fields to the given JSON values: a present
// field's value is replaced where it stands, a missing one is inserted
// right after the opening brace, in the order given. The result is built
// in one allocation; body is not modified.
func setFields(body []byte, set ...setting) ([]byte, error) {
	names := make([]string, len(set))
	for i, f := range set {
		names[i] = f.name
	}
	spans, fields, open, err := topLevel(body, names...)
	if err != nil {
		return nil, fmt.Errorf("rewrite body: %w", err)
	}
	size := len(body)
	inserted := 0
	for i, f := range set {
		if sp := spans[i]; sp.start >= 0 {
			size += len(f.value) - (sp.end - sp.start)
		} else {
			size += len(f.name) + 3 + len(f.value) + 1 // "name":value,
			inserted++
		}
	}
	out := make([]byte, 0, size)
	out = append(out, body[:open+1]...)
	for i, f := range set {
		if spans[i].start >= 0 {
			continue
		}
		out = strconv.AppendQuote(out, f.name)
		out = append(out, ':')
		out = append(out, f.value...)
		inserted--
		if inserted > 0 || fields > 0 {
			out = append(out, ',')
		}
	}
	// The rest of the body, with each present field's value replaced in
	// the order the values appear.
	pos := open + 1
	for {
		next := -1
		for i, sp := range spans {
			if sp.start >= pos && (next < 0 || sp.start < spans[next].start) {
				next = i
			}
		}
		if next < 0 {
			break
		}
		out = append(out, body[pos:spans[next].start]...)
		out = append(out, set[next].value...)
		pos = spans[next].end
	}
	return append(out, body[pos:]...), nil
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
	sp, ok := field(body, "stream_options")
	if !ok || string(body[sp.start:sp.end]) == "null" {
		if _, _, _, err := topLevel(body); err != nil {
			return nil, fmt.Errorf("rewrite body: %w", err)
		}
		return setFields(body, setting{"stream_options", `{"include_usage":true}`})
	}
	opts, err := setFields(body[sp.start:sp.end], setting{"include_usage", "true"})
	if err != nil {
		return nil, InvalidField("stream_options", "stream_options must be an object")
	}
	return setFields(body, setting{"stream_options", string(opts)})
}

// WithPriority returns body with vLLM's `priority` field set to p (design
// §7.8): for an engine that schedules by priority, the request's class,
// 0 the highest. Whatever the client put there is replaced: a client must
// not move itself ahead of its class inside the engine.
func WithPriority(body []byte, p int) ([]byte, error) {
	return setFields(body, setting{"priority", strconv.Itoa(p)})
}

// ForLlamaCpp returns body addressed to llama.cpp's server: `model` the
// base model, the adapter as `lora` by its index in the model's list, the
// order the agent passes --lora in (llama.cpp zeroes the scale of every
// adapter a request does not list).
func ForLlamaCpp(body []byte, base string, index int) ([]byte, error) {
	m, _ := json.Marshal(base)
	return setFields(body, setting{"model", string(m)}, setting{"lora", `[{"id":` + strconv.Itoa(index) + `,"scale":1}]`})
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
	buf := p
	if len(s.pending) > 0 {
		s.pending = append(s.pending, p...)
		buf = s.pending
	}
	// Runs of kept events are written as they stand in buf: nothing is
	// copied but a partial event at the end.
	kept, i := 0, 0
	for {
		end, next := eventEnd(buf[i:])
		if end < 0 {
			break
		}
		if isUsageChunk(buf[i : i+end]) {
			if err := s.write(buf[kept:i]); err != nil {
				return 0, err
			}
			kept = i + next
		}
		i += next
	}
	if err := s.write(buf[kept:i]); err != nil {
		return 0, err
	}
	s.pending = append(s.pending[:0], buf[i:]...)
	return len(p), nil
}

func (s *UsageStripper) write(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	_, err := s.dst.Write(b)
	return err
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
