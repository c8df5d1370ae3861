package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/llmgw/llmgw/vllm"
)

// MaxTokens is the request's output bound: max_completion_tokens, else
// max_tokens (OpenAI's newer name wins, as vLLM's does). ok is false when
// neither is a positive integer: the engine's own bound then applies.
func MaxTokens(body []byte) (n int, ok bool) {
	for _, name := range []string{"max_completion_tokens", "max_tokens"} {
		sp, found := field(body, name)
		if !found {
			continue
		}
		v, err := strconv.Atoi(string(bytes.TrimSpace(body[sp.start:sp.end])))
		if err == nil && v > 0 {
			return v, true
		}
	}
	return 0, false
}

// UsageOf finds the usage block in an answer's end (tail): the whole JSON
// of a non-streamed answer, or the last usage chunk of a stream. ok is
// false when there is none (a stream cut before its end).
func UsageOf(stream bool, tail []byte) (u vllm.Usage, ok bool) {
	var r struct {
		Usage *vllm.Usage `json:"usage"`
	}
	if !stream {
		// A non-streamed answer's tail may have lost its start; the usage
		// object is near the end, so decode from its key.
		i := bytes.LastIndex(tail, []byte(`"usage"`))
		if i < 0 {
			return u, false
		}
		if json.Unmarshal(tail, &r) != nil || r.Usage == nil {
			if json.Unmarshal(append([]byte("{"), tail[i:]...), &r) != nil || r.Usage == nil {
				return u, false
			}
		}
		return *r.Usage, true
	}
	lines := bytes.Split(tail, []byte("\n"))
	for i := len(lines) - 1; i >= 0; i-- {
		data, found := bytes.CutPrefix(bytes.TrimSpace(lines[i]), []byte("data:"))
		if !found || !bytes.Contains(data, []byte(`"usage"`)) {
			continue
		}
		if json.Unmarshal(bytes.TrimSpace(data), &r) == nil && r.Usage != nil {
			return *r.Usage, true
		}
	}
	return u, false
}

// EventCounter counts a stream's server-sent events (lines starting
// "data:") as the bytes pass, for a stream the client cancelled: the
// events it was sent are the tokens generated so far, one per chunk as
// vLLM streams them. It forwards every write to Next (when set).
type EventCounter struct {
	Next io.Writer
	// Events counted so far.
	Events int
	// matched is how much of "data:" the current line has matched; -1
	// once the line can no longer start with it.
	matched int
}

var dataPrefix = []byte("data:")

func (c *EventCounter) Write(p []byte) (int, error) {
	for _, b := range p {
		switch {
		case b == '\n':
			c.matched = 0
		case c.matched >= 0 && c.matched < len(dataPrefix):
			if b == dataPrefix[c.matched] {
				c.matched++
				if c.matched == len(dataPrefix) {
					c.Events++
				}
			} else {
				c.matched = -1
			}
		}
	}
	if c.Next != nil {
		return c.Next.Write(p)
	}
	return len(p), nil
}

// RateLimited is the 429 for a request past one of its tenant's limits
// (design §7.7), in OpenAI's shape: type "requests" or "tokens", code
// rate_limit_exceeded, the message naming the limit, and Retry-After.
func RateLimited(typ, message string, retryAfter int) *Error {
	return &Error{Status: http.StatusTooManyRequests, Type: typ, Code: "rate_limit_exceeded", Message: message, RetryAfter: retryAfter}
}

// QuotaExhausted is the 429 for a request past its tenant's daily or
// monthly token budget: OpenAI's insufficient_quota.
func QuotaExhausted(budget string, limit uint64, retryAfter int) *Error {
	return &Error{Status: http.StatusTooManyRequests, Type: "insufficient_quota", Code: "insufficient_quota",
		Message: fmt.Sprintf("the tenant's %s budget of %d tokens is spent; it renews at the period's end (UTC)", budget, limit), RetryAfter: retryAfter}
}
