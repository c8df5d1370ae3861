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
