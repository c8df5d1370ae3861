package openai

import "testing"

// TestCompletionTokens: the output tokens are read from a non-streamed
// answer's end and from a stream's usage chunk (the last of several
// "usage" keys); an answer without them, or with a value that is not a
// number, reads as none.
func TestCompletionTokens(t *testing.T) {
	tests := []struct {
		name   string
		tail   string
		want   int
		wantOK bool
	}{
		{"answer", `{"choices":[],"usage":{"prompt_tokens":5,"total_tokens":8,"completion_tokens":3}}`, 3, true},
		{"spaces", `"usage": {"completion_tokens" :  41 }`, 41, true},
		{"stream", "data: {\"usage\":null}\n\ndata: {\"usage\":{\"completion_tokens\":12}}\n\ndata: [DONE]\n\n", 12, true},
		{"the last of two", `{"completion_tokens":1} {"completion_tokens":250}`, 250, true},
		{"embedding", `{"data":[],"usage":{"prompt_tokens":5,"total_tokens":5}}`, 0, false},
		{"null", `{"completion_tokens":null}`, 0, false},
		{"no colon", `"completion_tokens"`, 0, false},
		{"empty", ``, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := CompletionTokens([]byte(tt.tail))
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("CompletionTokens(%q) = %d, %v; want %d, %v", tt.tail, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}
