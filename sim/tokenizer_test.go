package sim

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/llmgw/llmgw/vllm"
)

func TestTokenizerPieces(t *testing.T) {
	tests := []struct {
		text   string
		pieces []string
	}{
		{"Hello world", []string{"Hello", " world"}},
		{"Hello, world!", []string{"Hello", ",", " world", "!"}},
		{"a  b", []string{"a", "  ", "b"}},
		{"line\n\nnext", []string{"line", "\n\n", "next"}},
		{"<|begin_of_text|>hi<|eot_id|>", []string{"<|begin_of_text|>", "hi", "<|eot_id|>"}},
		{"<not special>", []string{"<", "not", " special", ">"}},
		{"supercalifragilisticexpialidocious", []string{"supercalifragili", "sticexpialidocio", "us"}},
		{"naïve café", []string{"naïve", " café"}},
		{"", nil},
	}
	for _, tc := range tests {
		t.Run(tc.text, func(t *testing.T) {
			tok := NewTokenizer()
			ids := tok.Encode(tc.text)
			if len(ids) != len(tc.pieces) {
				t.Fatalf("%d tokens, want %d (%q)", len(ids), len(tc.pieces), tc.pieces)
			}
			// Deterministic across instances, and decodable.
			if again := NewTokenizer().Encode(tc.text); !slices.Equal(ids, again) {
				t.Errorf("second tokenizer gave %v, first %v", again, ids)
			}
			if got := tok.Decode(ids); got != tc.text {
				t.Errorf("Decode = %q, want %q", got, tc.text)
			}
			for i, p := range tc.pieces {
				if got := tok.Decode(ids[i : i+1]); got != p {
					t.Errorf("piece %d = %q, want %q", i, got, p)
				}
			}
		})
	}
}

func TestTokenizerSpecialIDs(t *testing.T) {
	ids := NewTokenizer().Encode("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>")
	want := []int{TokenBeginOfText, TokenStartHeader, -1, TokenEndHeader, -1, -1, TokenEOT}
	for i, w := range want {
		if w >= 0 && ids[i] != w {
			t.Errorf("token %d = %d, want %d", i, ids[i], w)
		}
		if w < 0 && (ids[i] < vocabBase || ids[i] >= vocabSize) {
			t.Errorf("token %d = %d, outside the ordinary vocabulary", i, ids[i])
		}
	}
}

func TestTokenStrs(t *testing.T) {
	tok := NewTokenizer()
	got := tok.TokenStrs(tok.Encode("a b\n"))
	if want := []string{"a", "Ġb", "Ċ"}; !slices.Equal(got, want) {
		t.Errorf("TokenStrs = %q, want %q", got, want)
	}
}

func msg(role, content string) vllm.ChatMessage {
	c, _ := json.Marshal(content)
	return vllm.ChatMessage{Role: role, Content: c}
}

func TestRenderChat(t *testing.T) {
	sys, user := msg("system", "Be brief."), msg("user", "Hi")
	tests := []struct {
		name    string
		p       ChatPrompt
		want    string
		wantErr bool
	}{
		{"generation prompt", ChatPrompt{Messages: []vllm.ChatMessage{sys, user}, AddGenerationPrompt: true},
			"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>" +
				"<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>" +
				"<|start_header_id|>assistant<|end_header_id|>\n\n", false},
		{"no generation prompt", ChatPrompt{Messages: []vllm.ChatMessage{user}},
			"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>", false},
		{"continue final message", ChatPrompt{Messages: []vllm.ChatMessage{user, msg("assistant", "Hel")}, ContinueFinalMessage: true},
			"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>" +
				"<|start_header_id|>assistant<|end_header_id|>\n\nHel", false},
		{"tools canonical", ChatPrompt{Messages: []vllm.ChatMessage{user},
			Tools: json.RawMessage(`[{"type":"function","function":{"name":"f","strict":true}}]`)},
			"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n" +
				`Tools: [{"function":{"description":null,"name":"f","parameters":null},"type":"function"}]` + "\n<|eot_id|>" +
				"<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>", false},
		{"other tools as given", ChatPrompt{Messages: []vllm.ChatMessage{user},
			Tools: json.RawMessage(`[{"type":"custom","name":"g"}]`)},
			"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n" +
				`Tools: [{"name":"g","type":"custom"}]` + "\n<|eot_id|>" +
				"<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>", false},
		{"missing role", ChatPrompt{Messages: []vllm.ChatMessage{{Content: json.RawMessage(`"x"`)}}}, "", true},
		{"bad content", ChatPrompt{Messages: []vllm.ChatMessage{{Role: "user", Content: json.RawMessage(`3`)}}}, "", true},
		{"bad tools", ChatPrompt{Messages: []vllm.ChatMessage{user}, Tools: json.RawMessage(`{`)}, "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := RenderChat(tc.p)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v", err)
			}
			if got != tc.want {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestRenderChatKwargsChangeTokens(t *testing.T) {
	base := ChatPrompt{Messages: []vllm.ChatMessage{msg("user", "Hi")}, AddGenerationPrompt: true}
	a, _ := RenderChat(base)
	base.TemplateKwargs = json.RawMessage(`{"enable_thinking":false}`)
	b, _ := RenderChat(base)
	if a == b {
		t.Error("chat_template_kwargs did not change the rendered prompt")
	}
}
