package openai

import "testing"

// TestWithModel: `model` is replaced where it stands (the last one when it
// repeats, as the engines read it) or inserted; nothing else changes.
func TestWithModel(t *testing.T) {
	tests := []struct{ in, want string }{
		{`{"model":"chat","messages":[]}`, `{"model":"llama-8b","messages":[]}`},
		{`{ "messages": [], "model" : "chat" , "x":1}`, `{ "messages": [], "model" : "llama-8b" , "x":1}`},
		{`{"model":"a","model":"chat"}`, `{"model":"a","model":"llama-8b"}`},
		{`{"messages":[]}`, `{"model":"llama-8b","messages":[]}`},
	}
	for _, tt := range tests {
		got, err := WithModel([]byte(tt.in), "llama-8b")
		if err != nil || string(got) != tt.want {
			t.Errorf("WithModel(%s) = %s, %v; want %s", tt.in, got, err, tt.want)
		}
	}
	if _, err := WithModel([]byte(`[1]`), "x"); err == nil {
		t.Error("WithModel of an array: want an error")
	}
}
