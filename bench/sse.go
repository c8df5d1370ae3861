package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// Usage is the usage object of a stream's last chunk. PromptTokensDetails is
// absent unless the engine runs with --enable-prompt-tokens-details, in which
// case the run's cache-hit share is zero rather than unknown.
type Usage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details"`
}

// PromptTokensDetails is the cache's part of a prompt.
type PromptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// CachedTokens is how many prompt tokens the prefix cache supplied.
func (u *Usage) CachedTokens() int {
	if u == nil || u.PromptTokensDetails == nil {
		return 0
	}
	return u.PromptTokensDetails.CachedTokens
}

// streamEvent is what one SSE data payload tells the benchmark.
type streamEvent struct {
	done    bool   // `data: [DONE]`
	text    string // generated text in this chunk, possibly empty
	token   bool   // the chunk carried generated output
	usage   *Usage
	errText string // an error object sent mid-stream
}

// wireChunk is the part of a chat or completion chunk the benchmark reads.
type wireChunk struct {
	Choices []struct {
		Delta *struct {
			Content          *string `json:"content"`
			ReasoningContent *string `json:"reasoning_content"`
		} `json:"delta"`
		Text *string `json:"text"`
	} `json:"choices"`
	Usage *Usage `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

var errBadChunk = errors.New("undecodable stream chunk")

// parseEvent decodes one SSE data payload. A chunk counts as a token when it
// carries non-empty content (chat), reasoning content or text (completions):
// vLLM sends one such chunk per decode step, which is what inter-token latency
// measures. vLLM's first chunk (role, content "") and the usage-only last
// chunk are not tokens, so TTFT is the first generated text.
func parseEvent(data []byte) (streamEvent, error) {
	data = bytes.TrimSpace(data)
	if string(data) == "[DONE]" {
		return streamEvent{done: true}, nil
	}
	var c wireChunk
	if err := json.Unmarshal(data, &c); err != nil {
		return streamEvent{}, fmt.Errorf("%w: %w", errBadChunk, err)
	}
	ev := streamEvent{usage: c.Usage}
	if c.Error != nil {
		ev.errText = c.Error.Message
		if ev.errText == "" {
			ev.errText = "error without a message"
		}
	}
	var b strings.Builder
	for _, ch := range c.Choices {
		if ch.Delta != nil {
			if ch.Delta.Content != nil && *ch.Delta.Content != "" {
				ev.token = true
				b.WriteString(*ch.Delta.Content)
			}
			if ch.Delta.ReasoningContent != nil && *ch.Delta.ReasoningContent != "" {
				ev.token = true
			}
		}
		if ch.Text != nil && *ch.Text != "" {
			ev.token = true
			b.WriteString(*ch.Text)
		}
	}
	ev.text = b.String()
	return ev, nil
}

// maxLine bounds one SSE line, so a peer that never sends a newline costs a
// bounded buffer and an error rather than all of memory.
const maxLine = 4 << 20

// maxAnswer bounds the answer text kept for a multi-turn history.
const maxAnswer = 256 << 10

// streamResult is what reading one response stream measured.
type streamResult struct {
	ttft   time.Duration // from the request's start to the first token; 0 if none came
	itl    []time.Duration
	last   time.Duration // from the start to the end of the stream
	answer string
	usage  *Usage
	done   bool // [DONE] arrived
	tokens int  // token chunks seen
}

// Stream failures, told apart in the report's errors_by_kind.
var (
	errStreamError = errors.New("error in stream")
	errTruncated   = errors.New("stream ended before [DONE]")
)

// readStream reads an SSE body to its end, timing each event by now() as it
// completes. It returns what it measured even on error, so a broken stream
// still reports its TTFT.
func readStream(body io.Reader, start time.Time, now func() time.Time) (streamResult, error) {
	return readStreamWith(body, parseEvent, start, now)
}

// readStreamWith is readStream with the API's event decoder.
func readStreamWith(body io.Reader, parse func([]byte) (streamEvent, error), start time.Time, now func() time.Time) (streamResult, error) {
	var res streamResult
	var answer strings.Builder
	var prev time.Time
	br := bufio.NewReaderSize(body, 64<<10)
	var data []byte
	haveData := false
	finish := func() error {
		if !haveData {
			return nil
		}
		ev, err := parse(data)
		data, haveData = data[:0], false
		if err != nil {
			return err
		}
		t := now()
		if ev.token {
			if res.tokens == 0 {
				res.ttft = t.Sub(start)
			} else {
				res.itl = append(res.itl, t.Sub(prev))
			}
			prev = t
			res.tokens++
			if answer.Len() < maxAnswer {
				answer.WriteString(ev.text[:min(len(ev.text), maxAnswer-answer.Len())])
			}
		}
		if ev.usage != nil {
			res.usage = ev.usage
		}
		if ev.errText != "" {
			return fmt.Errorf("%w: %s", errStreamError, ev.errText)
		}
		if ev.done {
			res.done = true
		}
		return nil
	}
	var rerr error
	for !res.done {
		line, err := readLine(br)
		if err != nil {
			if errors.Is(err, io.EOF) {
				// An event not followed by a blank line still counts.
				if ferr := finish(); ferr != nil {
					rerr = ferr
				}
			} else {
				rerr = err
			}
			break
		}
		switch {
		case len(line) == 0:
			if err := finish(); err != nil {
				rerr = err
			}
		case line[0] == ':': // a comment, a keep-alive
		case bytes.HasPrefix(line, []byte("data:")):
			v := bytes.TrimPrefix(line[len("data:"):], []byte(" "))
			if haveData {
				data = append(data, '\n')
			}
			data = append(data, v...)
			haveData = true
		default: // event:, id:, retry: carry nothing the benchmark needs
		}
		if rerr != nil {
			break
		}
	}
	res.answer = answer.String()
	res.last = now().Sub(start)
	if rerr == nil && !res.done {
		rerr = errTruncated
	}
	return res, rerr
}

// readLine returns one line without its CR/LF, io.EOF at the end, and an
// error past maxLine.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		line = append(line, frag...)
		if len(line) > maxLine {
			return nil, fmt.Errorf("read stream: line longer than %d bytes", maxLine)
		}
		if err == nil {
			break
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if errors.Is(err, io.EOF) && len(line) > 0 {
			break
		}
		return nil, err
	}
	return bytes.TrimRight(line, "\r\n"), nil
}
