package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/llmgw/llmgw/vllm"
)

// MaxTokens is the request's output bound: max_completion_tokens, else
// max_tokens (OpenAI's newer name wins, as vLLM's does). ok is false when
// neither is a positive integer: the engine's own bound then applies.
func MaxTokens(body []byte) (n int, ok bool) { return MaxTokensFor(Chat, body) }

// maxTokensFields name each API's output bound, the one that wins first.
var maxTokensFields = map[API][]string{
	Chat:        {"max_completion_tokens", "max_tokens"},
	Completions: {"max_completion_tokens", "max_tokens"},
	Responses:   {"max_output_tokens"},
	Messages:    {"max_tokens"},
}

// MaxTokensFor is MaxTokens for a body sent to api: the Responses API
// names its bound max_output_tokens, Anthropic's max_tokens (required
// there).
func MaxTokensFor(api API, body []byte) (n int, ok bool) {
	for _, name := range maxTokensFields[api] {
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
		// object is near the end, so decode from its key: the last
		// `"usage"` in the bytes (a string's quotes are escaped, so text
		// cannot hold it) and what follows, which is the rest of the
		// answer's object when the key is the answer's own. Only when that
		// is not JSON (a later nested "usage") is the whole tail decoded:
		// decoding the whole answer first cost ~3 µs a request metered or
		// traced (docs/benchmarks.md "Tracing cost").
		i := bytes.LastIndex(tail, []byte(`"usage"`))
		if i < 0 {
			return u, false
		}
		if json.Unmarshal(append([]byte("{"), tail[i:]...), &r) != nil || r.Usage == nil {
			r.Usage = nil
			if json.Unmarshal(tail, &r) != nil || r.Usage == nil {
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
