package openai

import (
	"bytes"
	"encoding/json"

	"github.com/llmgw/llmgw/vllm"
)

// CacheSalt is the request's cache_salt, or "": vLLM mixes it into the
// first block's hash, so tier 2 must too (design §7.5 step 4).
func CacheSalt(body []byte) string {
	sp, ok := field(body, "cache_salt")
	if !ok {
		return ""
	}
	salt, _ := stringValue(body[sp.start:sp.end])
	return salt
}

// CachedTokens finds usage.prompt_tokens_details.cached_tokens in a
// response body's end: the whole JSON of a non-streamed answer, or the last
// SSE events of a stream (the usage chunk is the last before [DONE]).
func CachedTokens(stream bool, tail []byte) (int, bool) {
	var r struct {
		Usage *vllm.Usage `json:"usage"`
	}
	if !stream {
		if json.Unmarshal(tail, &r) != nil || r.Usage == nil || r.Usage.PromptTokensDetails == nil {
			return 0, false
		}
		return r.Usage.PromptTokensDetails.CachedTokens, true
	}
	lines := bytes.Split(tail, []byte("\n"))
	for i := len(lines) - 1; i >= 0; i-- {
		l := bytes.TrimSpace(lines[i])
		data, ok := bytes.CutPrefix(l, []byte("data:"))
		if !ok || !bytes.Contains(data, []byte(`"usage"`)) {
			continue
		}
		if json.Unmarshal(bytes.TrimSpace(data), &r) == nil && r.Usage != nil && r.Usage.PromptTokensDetails != nil {
			return r.Usage.PromptTokensDetails.CachedTokens, true
		}
	}
	return 0, false
}

// CompletionTokens finds usage.completion_tokens in a response body's end
// (the end of a non-streamed answer's JSON, or a stream's last events, where
// the usage chunk is). It scans bytes rather than decoding, because it runs
// on every answer and needs only the end: the last "completion_tokens" key
// and the integer after it. False when there is none (an embedding, or an
// answer cut before its usage).
func CompletionTokens(tail []byte) (int, bool) {
	i := bytes.LastIndex(tail, []byte(`"completion_tokens"`))
	if i < 0 {
		return 0, false
	}
	rest := bytes.TrimLeft(tail[i+len(`"completion_tokens"`):], " \t\r\n")
	rest, ok := bytes.CutPrefix(rest, []byte(":"))
	if !ok {
		return 0, false
	}
	rest = bytes.TrimLeft(rest, " \t\r\n")
	n, digits := 0, 0
	for _, c := range rest {
		if c < '0' || c > '9' || digits == 9 {
			break
		}
		n, digits = n*10+int(c-'0'), digits+1
	}
	return n, digits > 0
}

// UsageFor finds the usage block of an answer of api in its end (tail)
// and returns it in OpenAI's terms (prompt, cached and completion tokens),
// whichever API's names it came in:
//
//   - chat and completions: usage.prompt_tokens,
//     prompt_tokens_details.cached_tokens, completion_tokens (UsageOf);
//   - the Responses API: usage.input_tokens,
//     input_tokens_details.cached_tokens, output_tokens, in the response
//     object (a stream's response.completed event);
//   - Anthropic's Messages API: usage.input_tokens, output_tokens and
//     cache_read_input_tokens, cache_creation_input_tokens, in the message
//     (a stream's message_delta event). Anthropic's input_tokens counts
//     only what was not read from or written to the cache, so the prompt
//     is their sum: vLLM reported the whole prompt as input_tokens and no
//     cache fields until vLLM PR #40912, and since then the uncached part
//     and cache_read_input_tokens, which sum to the same prompt.
//
// The cached figure is set (PromptTokensDetails) only when the answer
// said it. ok is false when the tail holds no usage: a stream cut before
// its end, or an answer whose usage fell out of the tail.
func UsageFor(api API, stream bool, tail []byte) (vllm.Usage, bool) {
	switch api {
	case Responses, Messages:
	default:
		return UsageOf(stream, tail)
	}
	u, ok := lastUsage(api, stream, tail)
	if !ok {
		return vllm.Usage{}, false
	}
	var out vllm.Usage
	switch api {
	case Responses:
		if u.InputTokens == nil || u.OutputTokens == nil {
			return vllm.Usage{}, false
		}
		out.PromptTokens, out.CompletionTokens = *u.InputTokens, *u.OutputTokens
		if d := u.InputTokensDetails; d != nil && d.CachedTokens != nil {
			out.PromptTokensDetails = &vllm.PromptTokensDetails{CachedTokens: *d.CachedTokens}
		}
	case Messages:
		if u.InputTokens == nil || u.OutputTokens == nil {
			return vllm.Usage{}, false
		}
		out.PromptTokens, out.CompletionTokens = *u.InputTokens, *u.OutputTokens
		if u.CacheCreation != nil {
			out.PromptTokens += *u.CacheCreation
		}
		if u.CacheRead != nil {
			out.PromptTokens += *u.CacheRead
			out.PromptTokensDetails = &vllm.PromptTokensDetails{CachedTokens: *u.CacheRead}
		}
	}
	out.TotalTokens = out.PromptTokens + out.CompletionTokens
	return out, true
}

// CachedTokensFor is CachedTokens for an answer of api.
func CachedTokensFor(api API, stream bool, tail []byte) (int, bool) {
	switch api {
	case Responses, Messages:
		u, ok := UsageFor(api, stream, tail)
		if !ok || u.PromptTokensDetails == nil {
			return 0, false
		}
		return u.PromptTokensDetails.CachedTokens, true
	}
	return CachedTokens(stream, tail)
}

// CompletionTokensFor is CompletionTokens for an answer of api.
func CompletionTokensFor(api API, stream bool, tail []byte) (int, bool) {
	switch api {
	case Responses, Messages:
		u, ok := UsageFor(api, stream, tail)
		return u.CompletionTokens, ok
	}
	return CompletionTokens(tail)
}

// usageFields are the usage fields of the Responses and Messages APIs;
// a pointer is nil when the field is absent.
type usageFields struct {
	InputTokens        *int `json:"input_tokens"`
	OutputTokens       *int `json:"output_tokens"`
	InputTokensDetails *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	CacheRead     *int `json:"cache_read_input_tokens"`
	CacheCreation *int `json:"cache_creation_input_tokens"`
}

var usageKey = []byte(`"usage"`)

// lastUsage decodes the last "usage" object in tail. It decodes from the
// key on, not the whole event, because the Responses API's final event
// carries the whole response — output and tools — and only its end is in
// the tail; the usage object follows the tools there (vLLM's
// ResponsesResponse), so the last "usage" key is the response's own, a
// tool's schema property named "usage" coming before it. A key whose
// value is not an object (null: the usage of the stream's first events)
// is passed over. In a Messages stream only message_delta's usage is the
// answer's: message_start's says no output yet.
func lastUsage(api API, stream bool, tail []byte) (usageFields, bool) {
	end := len(tail)
	for {
		i := bytes.LastIndex(tail[:end], usageKey)
		if i < 0 {
			return usageFields{}, false
		}
		end = i
		rest := bytes.TrimLeft(tail[i+len(usageKey):], " \t\r\n")
		rest, ok := bytes.CutPrefix(rest, []byte(":"))
		if !ok {
			continue
		}
		rest = bytes.TrimLeft(rest, " \t\r\n")
		if len(rest) == 0 || rest[0] != '{' {
			continue
		}
		if api == Messages && stream {
			line := tail[bytes.LastIndexByte(tail[:i], '\n')+1 : i]
			if !bytes.Contains(line, []byte(`"message_delta"`)) {
				continue
			}
		}
		var u usageFields
		if json.NewDecoder(bytes.NewReader(rest)).Decode(&u) != nil {
			continue
		}
		return u, true
	}
}
