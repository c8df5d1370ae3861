package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/llmgw/llmgw/vllm"
)

// sseWriter writes server-sent events, each flushed as it is written so
// the client sees every token when it is produced. A write that blocks
// longer than timeout — the client stopped reading and the socket's
// buffers are full — fails, and the request is aborted (clientGone): a
// stalled reader must not hold a sequence in the engine for ever.
type sseWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	started bool
}

func newSSEWriter(w http.ResponseWriter, timeout time.Duration) *sseWriter {
	return &sseWriter{w: w, rc: http.NewResponseController(w), timeout: timeout}
}

// start sends the stream's headers, once.
func (s *sseWriter) start() {
	if s.started {
		return
	}
	s.started = true
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	s.w.WriteHeader(http.StatusOK)
}

// write sends b and flushes it within the write timeout. After a failed
// write the deadline stays expired: net/http closes the broken connection
// once the handler returns, without waiting on the stalled reader again.
func (s *sseWriter) write(b []byte) error {
	s.start()
	if s.timeout > 0 {
		if err := s.rc.SetWriteDeadline(time.Now().Add(s.timeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return fmt.Errorf("set write deadline: %w", err)
		}
	}
	if _, err := s.w.Write(b); err != nil {
		return fmt.Errorf("write event: %w", err)
	}
	if err := s.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return fmt.Errorf("flush event: %w", err)
	}
	if s.timeout > 0 {
		_ = s.rc.SetWriteDeadline(time.Time{})
	}
	return nil
}

// data sends v as a "data:" event, as chat and completions streams are.
func (s *sseWriter) data(v any) error {
	var b bytes.Buffer
	b.WriteString("data: ")
	if err := newJSONEncoder(&b).Encode(v); err != nil {
		return fmt.Errorf("encode event: %w", err)
	}
	b.WriteString("\n") // Encode ended the line; a blank line ends the event
	return s.write(b.Bytes())
}

// event sends v as a named event, as Responses and Messages streams are.
func (s *sseWriter) event(name string, v any) error {
	var b bytes.Buffer
	b.WriteString("event: ")
	b.WriteString(name)
	b.WriteString("\ndata: ")
	if err := newJSONEncoder(&b).Encode(v); err != nil {
		return fmt.Errorf("encode event: %w", err)
	}
	b.WriteString("\n")
	return s.write(b.Bytes())
}

// openAIResponder answers chat completions and completions, streamed
// (vLLM's chunks, the usage chunk when asked, [DONE]) or not, from
// vllm/entrypoints/openai/chat_completion/serving.py and
// completion/serving.py.
type openAIResponder struct {
	w            http.ResponseWriter
	s            *Server
	g            *genRequest
	chat         bool
	sse          *sseWriter // nil: not streamed
	includeUsage bool
	lp           logprobsRequest
	// roleSent: the first chat chunk (role, empty content) is out;
	// callSent: the first piece of the tool call (id, name) is.
	roleSent, callSent bool
}

func (s *Server) newOpenAIResponder(w http.ResponseWriter, g *genRequest, chat, stream bool,
	opts *vllm.StreamOptions, lp logprobsRequest) *openAIResponder {
	o := &openAIResponder{w: w, s: s, g: g, chat: chat, lp: lp,
		includeUsage: opts != nil && opts.IncludeUsage}
	if stream {
		o.sse = newSSEWriter(w, s.cfg.StreamWriteTimeout)
	}
	return o
}

func (o *openAIResponder) begin() error { return nil }

// role sends vLLM's first chat chunk, the role with empty content.
func (o *openAIResponder) role() error {
	if o.roleSent || !o.chat {
		return nil
	}
	o.roleSent = true
	empty := ""
	return o.sse.data(vllm.ChatCompletionChunk{ID: o.g.id, Object: "chat.completion.chunk", Created: o.g.created,
		Model: o.g.model, Choices: []vllm.ChatChunkChoice{{Delta: vllm.ChatDelta{Role: "assistant", Content: &empty},
			Logprobs: nullJSON}}})
}

var nullJSON = json.RawMessage("null")

// logprobs is tokens [from, to)'s logprobs in the API's shape, or null.
func (o *openAIResponder) logprobs(from, to int) json.RawMessage {
	if !o.lp.on {
		return nullJSON
	}
	var v any
	if o.chat {
		v = o.g.out.chatLogprobs(from, to, o.lp.top)
	} else {
		v = o.g.out.completionLogprobs(from, to, o.lp.top)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nullJSON
	}
	return b
}

// token sends token i; the last carries the finish reason, as vLLM's
// does. A tool call streams its arguments: the first piece with the call's
// id, type and name, the later ones with more arguments; tokens of the
// syntax around the arguments send nothing (vLLM's parser holds them back)
// unless logprobs are asked for.
func (o *openAIResponder) token(i int) error {
	if o.sse == nil {
		return nil
	}
	if err := o.role(); err != nil {
		return err
	}
	out := o.g.out
	last := i == len(out.ids)-1
	var finish *string
	var stop json.RawMessage
	if last {
		f := out.finishReason()
		finish, stop = &f, nullJSON
	}
	if !o.chat {
		return o.sse.data(vllm.Completion{ID: o.g.id, Object: "text_completion", Created: o.g.created, Model: o.g.model,
			Choices: []vllm.CompletionChoice{{Text: out.pieces[i], Logprobs: o.logprobs(i, i+1), FinishReason: finish, StopReason: stop}}})
	}
	var delta vllm.ChatDelta
	if out.call == nil {
		delta.Content = &out.pieces[i]
	} else if args := out.argsDelta(i); args != "" {
		call := vllm.DeltaToolCall{Function: vllm.DeltaFunctionCall{Arguments: args}}
		if !o.callSent {
			o.callSent = true
			call.ID, call.Type, call.Function.Name = out.call.id, "function", out.call.name
		}
		delta.ToolCalls = []vllm.DeltaToolCall{call}
	} else if !last && !o.lp.on {
		return nil
	}
	return o.sse.data(vllm.ChatCompletionChunk{ID: o.g.id, Object: "chat.completion.chunk", Created: o.g.created,
		Model: o.g.model, Choices: []vllm.ChatChunkChoice{{Delta: delta, Logprobs: o.logprobs(i, i+1),
			FinishReason: finish, StopReason: stop}}})
}

func (o *openAIResponder) end(n int, finish string, u usage) error {
	if o.sse != nil {
		return o.endStream(finish, u)
	}
	out := o.g.out
	text := ""
	for _, p := range out.pieces[:n] {
		text += p
	}
	reason := finish
	if finish != vllm.FinishedAbort {
		reason = out.finishReason()
	}
	if !o.chat {
		writeJSON(o.w, http.StatusOK, vllm.Completion{ID: o.g.id, Object: "text_completion", Created: o.g.created,
			Model: o.g.model, Usage: o.s.usage(u), Choices: []vllm.CompletionChoice{{Text: text,
				Logprobs: o.logprobs(0, n), FinishReason: &reason, StopReason: nullJSON}}})
		return nil
	}
	msg := chatMessage{Role: "assistant", Content: &text, ToolCalls: []vllm.ToolCall{}}
	if out.call != nil && finish != vllm.FinishedAbort {
		// vLLM's content beside a call: "" for a named or required choice,
		// null from an auto-tool parser.
		empty := ""
		msg.Content = &empty
		if out.mode == toolAuto {
			msg.Content = nil
		}
		msg.ToolCalls = []vllm.ToolCall{{ID: out.call.id, Type: "function",
			Function: vllm.FunctionCall{Name: out.call.name, Arguments: out.call.args}}}
	}
	writeJSON(o.w, http.StatusOK, chatCompletion{ID: o.g.id, Object: "chat.completion", Created: o.g.created,
		Model: o.g.model, Usage: o.s.usage(u), Choices: []chatChoice{{Message: msg,
			Logprobs: o.logprobs(0, n), FinishReason: &reason, StopReason: nullJSON}}})
	return nil
}

// endStream ends a stream: an aborted one with a chunk carrying
// finish_reason "abort" (vLLM's), then the usage chunk when asked and
// [DONE].
func (o *openAIResponder) endStream(finish string, u usage) error {
	if finish == vllm.FinishedAbort {
		if err := o.role(); err != nil {
			return err
		}
		empty := ""
		var err error
		if o.chat {
			err = o.sse.data(vllm.ChatCompletionChunk{ID: o.g.id, Object: "chat.completion.chunk", Created: o.g.created,
				Model: o.g.model, Choices: []vllm.ChatChunkChoice{{Delta: vllm.ChatDelta{Content: &empty},
					Logprobs: nullJSON, FinishReason: &finish, StopReason: nullJSON}}})
		} else {
			err = o.sse.data(vllm.Completion{ID: o.g.id, Object: "text_completion", Created: o.g.created, Model: o.g.model,
				Choices: []vllm.CompletionChoice{{Text: empty, Logprobs: nullJSON, FinishReason: &finish, StopReason: nullJSON}}})
		}
		if err != nil {
			return err
		}
	}
	if o.includeUsage {
		var err error
		if o.chat {
			err = o.sse.data(vllm.ChatCompletionChunk{ID: o.g.id, Object: "chat.completion.chunk", Created: o.g.created,
				Model: o.g.model, Choices: []vllm.ChatChunkChoice{}, Usage: o.s.usage(u)})
		} else {
			err = o.sse.data(vllm.Completion{ID: o.g.id, Object: "text_completion", Created: o.g.created, Model: o.g.model,
				Choices: []vllm.CompletionChoice{}, Usage: o.s.usage(u)})
		}
		if err != nil {
			return err
		}
	}
	return o.sse.write([]byte("data: [DONE]\n\n"))
}

// chatCompletion is a non-streamed chat answer as the simulator writes it:
// vllm.ChatCompletion's shape with a message whose content may be null
// (beside an auto-parsed tool call) and typed tool calls.
type chatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   *vllm.Usage  `json:"usage"`
}

type chatChoice struct {
	Index        int             `json:"index"`
	Message      chatMessage     `json:"message"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
	StopReason   json.RawMessage `json:"stop_reason"`
}

type chatMessage struct {
	Role      string          `json:"role"`
	Content   *string         `json:"content"`
	ToolCalls []vllm.ToolCall `json:"tool_calls"`
}
