package openai

import (
	"bytes"
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
	f.Add([]byte(`{"model":"m","system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"text","text":"x"}]}]}]}`))
	f.Add([]byte(`{"model":"m","instructions":"s","input":[{"role":"user","content":[{"type":"input_text","text":"x"}]},{"type":"function_call_output","output":"y"}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, api := range []API{Chat, Completions, Embeddings, Responses, Messages, CountTokens} {
			got, err := SniffFor(api, body)
			if err != nil {
				if e := (*Error)(nil); !errors.As(err, &e) {
					t.Fatalf("error %T is not an API error", err)
				}
				continue
			}
			if got.Model == "" || !json.Valid(body) || len(got.Prompt) > MaxPromptBytes {
				t.Fatalf("%s accepted %q as %+v", api, body, got)
			}
		}
	})
}

// sniffReference is Sniff as it was built on encoding/json (a map of raw
// messages, then a decode per field): the allocation-free scanner must
// read every body the same way.
func sniffReference(body []byte) (Request, bool) {
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil || fields == nil {
		return Request{}, false
	}
	var out Request
	raw, ok := fields["model"]
	if !ok || json.Unmarshal(raw, &out.Model) != nil || out.Model == "" {
		return Request{}, false
	}
	if raw, ok := fields["stream"]; ok && string(raw) != "null" {
		if json.Unmarshal(raw, &out.Stream) != nil {
			return Request{}, false
		}
	}
	if raw, ok := fields["messages"]; ok {
		out.Prompt = chatTextReference(raw)
	} else if raw, ok := fields["prompt"]; ok {
		out.Prompt = promptTextReference(raw)
	}
	return out, true
}

func chatTextReference(raw json.RawMessage) string {
	var msgs []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(raw, &msgs) != nil {
		return ""
	}
	var b strings.Builder
	for _, m := range msgs {
		if b.Len() >= MaxPromptBytes {
			break
		}
		b.WriteString(m.Role)
		b.WriteByte(0)
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			b.WriteString(s)
		} else {
			var parts []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			}
			if json.Unmarshal(m.Content, &parts) != nil {
				break
			}
			for _, p := range parts {
				if p.Type == "text" {
					b.WriteString(p.Text)
				}
			}
		}
		b.WriteByte(0)
	}
	return truncate(b.String())
}

func promptTextReference(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return truncate(s)
	}
	var batch []json.RawMessage
	if json.Unmarshal(raw, &batch) == nil && len(batch) > 0 {
		if json.Unmarshal(batch[0], &s) == nil {
			return truncate(s)
		}
		if len(batch[0]) > 0 && batch[0][0] == '[' {
			return truncate(string(batch[0]))
		}
		return truncate(string(raw))
	}
	return ""
}

// FuzzSniffMatchesReference: the scanner reads what encoding/json read,
// on every body but those whose nested keys differ from the names only in
// case (encoding/json folds case there; the scanner, as the engines,
// does not).
func FuzzSniffMatchesReference(f *testing.F) {
	for _, s := range []string{
		`{"model":"demo","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"d\u00e9mo","messages":[{"role":"system","content":"a\nb"},{"role":"user","content":[{"type":"text","text":"x"},null,{"type":"image_url"}]}]}`,
		`{"model":"m","messages":[null,{"role":"user","content":"b"}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x"},{"type":1}]},{"role":"user","content":"b"}]}`,
		`{"model":"m","prompt":[[1,2],[3]]}`, `{"model":"m","prompt":[1,2,3]}`, `{"model":"m","prompt":["a","b"]}`, `{"model":"m","prompt":[]}`,
		`{"model":"m","stream":null,"prompt":null}`, `{"model":"m","messages":[{"role":5}]}`, `{ "model" : "m" , "messages" : [ ] }`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		lower := bytes.ToLower(body)
		for _, k := range []string{`"role"`, `"content"`, `"type"`, `"text"`, `"model"`, `"stream"`, `"messages"`, `"prompt"`, `\`} {
			if bytes.Count(lower, []byte(k)) != bytes.Count(body, []byte(k)) || (k == `\` && bytes.Contains(body, []byte(`\u`))) {
				return
			}
		}
		want, ok := sniffReference(body)
		got, err := Sniff(body)
		if ok != (err == nil) {
			t.Fatalf("%q: reference ok %v, Sniff err %v", body, ok, err)
		}
		if ok && got != want {
			t.Fatalf("%q:\n got %+v\nwant %+v", body, got, want)
		}
	})
}
