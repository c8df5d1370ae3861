package openai

import (
	"bytes"
	"io"
)

// EventCounter follows a stream's server-sent events as the bytes pass,
// for two questions the router asks of every stream it forwards:
//
//   - how many tokens a stream the client cancelled had been sent (its
//     usage never came): the events that carry generated text, one per
//     token as vLLM streams them — every data line of OpenAI's chat and
//     completions streams, the *.delta events of the Responses API,
//     content_block_delta of Anthropic's Messages API (Events);
//   - whether the stream's last event was the API's end — data: [DONE],
//     response.completed (failed, incomplete), message_stop, or an error
//     event — so an answer whose client closed right after it, as SDKs
//     do before the engine ends its chunked body, counts as delivered
//     (Ended).
//
// It forwards every write to Next (when set) and keeps no more of a line
// than its first bytes, so it allocates nothing.
type EventCounter struct {
	Next io.Writer
	// API is the stream's API; the zero value is Chat.
	API API
	// Events counted so far.
	Events int

	line [64]byte // the current line's first bytes
	n    int      // the current line's length so far
	// The current event: its name, whether it is the API's last, and
	// whether it has begun (a field line seen).
	name     [64]byte
	nameLen  int
	terminal bool
	begun    bool
	ended    bool
}

var (
	dataPrefix  = []byte("data:")
	eventPrefix = []byte("event:")
	doneData    = []byte("[DONE]")
)

func (c *EventCounter) Write(p []byte) (int, error) {
	for _, b := range p {
		if b == '\n' {
			c.endLine()
			continue
		}
		if c.n < len(c.line) {
			c.line[c.n] = b
		}
		c.n++
		// A data line counts as soon as it is one, as a cut stream's last
		// partial chunk did reach the client.
		if c.n == len(dataPrefix) && !c.API.namedEvents() && bytes.Equal(c.line[:c.n], dataPrefix) {
			c.Events++
		}
	}
	if c.Next != nil {
		return c.Next.Write(p)
	}
	return len(p), nil
}

// Ended reports whether the last complete event was the stream's end and
// nothing but blank lines followed it.
func (c *EventCounter) Ended() bool { return c.ended && c.n == 0 }

// endLine ends the current line.
func (c *EventCounter) endLine() {
	full := c.n <= len(c.line) // the whole line is in line
	line := c.line[:min(c.n, len(c.line))]
	if full && len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	c.n = 0
	if len(line) == 0 && full {
		// A blank line ends the event.
		if c.begun {
			c.ended = c.terminal
		}
		c.begun, c.terminal, c.nameLen = false, false, 0
		return
	}
	c.begun, c.ended = true, false
	switch {
	case bytes.HasPrefix(line, eventPrefix):
		v := bytes.TrimSpace(line[len(eventPrefix):])
		if !full {
			v = nil // a name longer than any the router looks for
		}
		c.nameLen = copy(c.name[:], v)
		if c.API.namedEvents() {
			// An event counts once its name reached the client, as a data
			// line of chat's does once it began.
			c.terminal = c.API.lastEvent(c.name[:c.nameLen])
			if c.API.tokenEvent(c.name[:c.nameLen]) {
				c.Events++
			}
		}
	case bytes.HasPrefix(line, dataPrefix):
		if full && !c.API.namedEvents() && bytes.Equal(bytes.TrimSpace(line[len(dataPrefix):]), doneData) {
			c.terminal = true
		}
	}
}

// namedEvents reports whether the API names its events (event: lines),
// as the Responses and Messages APIs do; OpenAI's chat and completions
// streams are data lines alone.
func (a API) namedEvents() bool { return a == Responses || a == Messages }

// tokenEvent reports whether an event of the API carries generated
// tokens: the Responses API's deltas (output text, reasoning, function
// call arguments), Anthropic's content_block_delta.
func (a API) tokenEvent(name []byte) bool {
	switch a {
	case Responses:
		return bytes.HasPrefix(name, []byte("response.")) && bytes.HasSuffix(name, []byte(".delta"))
	case Messages:
		return string(name) == "content_block_delta"
	}
	return false
}

// lastEvent reports whether an event of the API is its stream's last:
// after it the engine sends nothing more (vLLM: the Responses API's final
// response event; Anthropic's message_stop; an error event of either).
func (a API) lastEvent(name []byte) bool {
	switch a {
	case Responses:
		switch string(name) {
		case "response.completed", "response.failed", "response.incomplete", "error":
			return true
		}
	case Messages:
		switch string(name) {
		case "message_stop", "error":
			return true
		}
	}
	return false
}
