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
