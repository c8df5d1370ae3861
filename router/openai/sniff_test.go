package openai

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestSniffPrompt(t *testing.T) {
	long := strings.Repeat("x", MaxPromptBytes+10)
	tests := []struct {
		name, body, want string
	}{
		{"chat strings", `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`, "system\x00be brief\x00user\x00hi\x00"},
		{"chat parts", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{}},{"type":"text","text":"b"}]}]}`, "user\x00ab\x00"},
		{"unreadable content ends the prefix", `{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":7},{"role":"user","content":"b"}]}`, "user\x00a\x00user\x00"},
		{"messages not a list", `{"model":"m","messages":"hi"}`, ""},
		{"prompt string", `{"model":"m","prompt":"once upon"}`, "once upon"},
		{"prompt batch", `{"model":"m","prompt":["first","second"]}`, "first"},
		{"prompt tokens", `{"model":"m","prompt":[1,2,3]}`, "[1,2,3]"},
		{"prompt token batch", `{"model":"m","prompt":[[1,2],[3]]}`, "[1,2]"},
		{"bounded", `{"model":"m","prompt":"` + long + `"}`, long[:MaxPromptBytes]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Sniff([]byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if got.Prompt != tt.want {
				t.Fatalf("prompt %q, want %q", got.Prompt, tt.want)
			}
		})
	}
}

func FuzzSniff(f *testing.F) {
	for _, s := range []string{
		`{"model":"demo","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"demo","stream":null}`, `{"Model":"demo"}`, `{"model":1}`, `[]`, `null`, ``, `{"model":"a","model":"b"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := Sniff(body)
		if err != nil {
			if e := (*Error)(nil); !errors.As(err, &e) {
				t.Fatalf("error %T is not an API error", err)
			}
			return
		}
		if got.Model == "" || !json.Valid(body) || len(got.Prompt) > MaxPromptBytes {
			t.Fatalf("accepted %q as %+v", body, got)
		}
	})
}
