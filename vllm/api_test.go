package vllm

import (
	"encoding/json"
	"errors"
	"testing"
)

func TestDecodeTokenizeRequest(t *testing.T) {
	tests := []struct {
		name        string
		body        string
		wantErr     bool
		chat        bool
		special     bool
		genPrompt   bool
		wantMsgText string
	}{
		{name: "prompt defaults", body: `{"prompt":"hi"}`, special: true},
		{name: "prompt no special", body: `{"prompt":"hi","add_special_tokens":false}`},
		{name: "chat defaults", body: `{"messages":[{"role":"user","content":"hi"}]}`, chat: true, genPrompt: true, wantMsgText: "hi"},
		{name: "chat parts", body: `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"},{"type":"text","text":"b"}]}],"add_generation_prompt":false}`, chat: true, wantMsgText: "a\nb"},
		{name: "unknown fields ignored", body: `{"prompt":"x","foo":1}`, special: true},
		{name: "both forms", body: `{"prompt":"x","messages":[]}`, wantErr: true},
		{name: "neither", body: `{}`, wantErr: true},
		{name: "continue and generation", body: `{"messages":[{"role":"user","content":"x"}],"continue_final_message":true}`, wantErr: true},
		{name: "bad json", body: `{"prompt":`, wantErr: true},
		{name: "wrong type", body: `{"prompt":3}`, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := DecodeTokenizeRequest([]byte(tc.body))
			if tc.wantErr {
				if !errors.Is(err, ErrBadRequest) {
					t.Fatalf("err = %v, want ErrBadRequest", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.IsChat() != tc.chat || r.AddSpecialTokens != tc.special {
				t.Errorf("chat=%v special=%v, want %v %v", r.IsChat(), r.AddSpecialTokens, tc.chat, tc.special)
			}
			if tc.chat {
				if r.AddGenerationPrompt != tc.genPrompt {
					t.Errorf("add_generation_prompt = %v", r.AddGenerationPrompt)
				}
				if txt, err := r.Messages[0].Text(); err != nil || txt != tc.wantMsgText {
					t.Errorf("text = %q, %v; want %q", txt, err, tc.wantMsgText)
				}
			}
		})
	}
}

func TestModelNotFoundBody(t *testing.T) {
	b, err := json.Marshal(ModelNotFound("x"))
	if err != nil {
		t.Fatal(err)
	}
	want := "{\"error\":{\"message\":\"The model `x` does not exist.\",\"type\":\"NotFoundError\",\"param\":\"model\",\"code\":404}}"
	if string(b) != want {
		t.Errorf("got %s\nwant %s", b, want)
	}
}

func TestCompletionPrompts(t *testing.T) {
	tests := []struct {
		prompt  string
		n       int
		text    bool
		wantErr bool
	}{
		{`"hello"`, 1, true, false},
		{`[1,2,3]`, 1, false, false},
		{`["a","b"]`, 2, true, false},
		{`[[1],[2,3]]`, 2, false, false},
		{`null`, 0, false, true},
		{`{}`, 0, false, true},
		{`[]`, 0, false, true},
	}
	for _, tc := range tests {
		r := CompletionRequest{Prompt: json.RawMessage(tc.prompt)}
		got, err := r.Prompts()
		if (err != nil) != tc.wantErr {
			t.Fatalf("%s: err = %v", tc.prompt, err)
		}
		if len(got) != tc.n || (tc.n > 0 && got[0].IsText != tc.text) {
			t.Errorf("%s: got %+v", tc.prompt, got)
		}
	}
}

func FuzzDecodeTokenizeRequest(f *testing.F) {
	for _, s := range []string{
		`{"prompt":"hi"}`, `{"messages":[{"role":"user","content":"hi"}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}`, `{}`, `[`, `null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeTokenizeRequest(b)
		if err != nil {
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("error not marked bad request: %v", err)
			}
			return
		}
		if r.IsChat() == (r.Prompt != nil) {
			t.Fatalf("request is neither or both forms: %+v", r)
		}
		for _, m := range r.Messages {
			_, _ = m.Text()
		}
	})
}

func FuzzCompletionPrompts(f *testing.F) {
	for _, s := range []string{`"x"`, `[1,2]`, `["a"]`, `[[1]]`, `null`, `{}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r := CompletionRequest{Prompt: b}
		ps, err := r.Prompts()
		if err == nil && len(ps) == 0 {
			t.Fatal("no error and no prompts")
		}
	})
}
