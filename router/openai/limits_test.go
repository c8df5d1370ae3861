package openai

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/vllm"
)

// answer is a non-streamed chat answer of n words with usage where vLLM
// puts it, after the choices.
func answer(n int) string {
	return `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		strings.Repeat("word ", n) + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46,"prompt_tokens_details":{"cached_tokens":8}},"kv_transfer_params":null}`
}

// TestUsageOf: the answer's own usage, from a whole answer, one whose
// start was lost, one with usage before other keys or a nested "usage"
// after it, and a stream's last usage chunk; none where there is none.
func TestUsageOf(t *testing.T) {
	whole := answer(20)
	for _, tc := range []struct {
		name   string
		stream bool
		tail   string
		want   int // prompt tokens; 0: none
	}{
		{"whole answer", false, whole, 12},
		{"start lost", false, whole[len(whole)-150:], 12},
		{"usage last", false, `{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1}}`, 5},
		{"a nested usage after the answer's own", false, `{"usage":{"prompt_tokens":7,"completion_tokens":1},"ext":{"usage":{"prompt_tokens":99}}}`, 7},
		{"the word in the text only", false, `{"choices":[{"message":{"content":"say \"usage\" twice"}}]}`, 0},
		{"no usage", false, `{"choices":[]}`, 0},
		{"stream", true, "data: {\"choices\":[]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n", 3},
		{"stream cut", true, "data: {\"choices\":[]}\n\n", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, ok := UsageOf(tc.stream, []byte(tc.tail))
			if ok != (tc.want != 0) || u.PromptTokens != tc.want {
				t.Fatalf("UsageOf = %+v, %v; want prompt_tokens %d", u, ok, tc.want)
			}
			if tc.name == "whole answer" && (u.CompletionTokens != 34 || u.PromptTokensDetails == nil || u.PromptTokensDetails.CachedTokens != 8) {
				t.Fatalf("UsageOf = %+v, want completion 34, cached 8", u)
			}
		})
	}
}

// BenchmarkUsageOf: reading a non-streamed answer's usage from its key,
// beside decoding the whole answer (what UsageOf did first before).
func BenchmarkUsageOf(b *testing.B) {
	tail := []byte(answer(200))
	b.Run("from-key", func(b *testing.B) {
		for b.Loop() {
			if _, ok := UsageOf(false, tail); !ok {
				b.Fatal("no usage")
			}
		}
	})
	b.Run("whole-answer", func(b *testing.B) {
		for b.Loop() {
			var r struct {
				Usage *vllm.Usage `json:"usage"`
			}
			if json.Unmarshal(tail, &r) != nil || r.Usage == nil {
				b.Fatal("no usage")
			}
		}
	})
}
