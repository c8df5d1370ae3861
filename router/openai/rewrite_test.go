package openai

import (
	"bytes"
	"encoding/json"
	"testing"
)

func TestRewrites(t *testing.T) {
	tests := []struct {
		name, in, want string
		do             func([]byte) ([]byte, error)
		wantErr        bool
	}{
		{"usage inserted first, rest byte for byte", `{"model":"m", "stream" :true}`, `{"stream_options":{"include_usage":true},"model":"m", "stream" :true}`, WithUsage, false},
		{"usage merged into present options", `{"stream_options": {"continuous_usage_stats":true} ,"model":"m"}`, `{"stream_options": {"include_usage":true,"continuous_usage_stats":true} ,"model":"m"}`, WithUsage, false},
		{"usage false set true where it stands", `{"stream_options":{"include_usage" : false, "x":1}}`, `{"stream_options":{"include_usage" : true, "x":1}}`, WithUsage, false},
		{"null options", `{"stream_options":null}`, `{"stream_options":{"include_usage":true}}`, WithUsage, false},
		{"options not an object", `{"stream_options":[1]}`, ``, WithUsage, true},
		{"empty object", `{}`, `{"stream_options":{"include_usage":true}}`, WithUsage, false},
		{"llama.cpp", ` {"model":"sql","lora":[{"id":9,"scale":0.5}]}`, ` {"model":"base","lora":[{"id":2,"scale":1}]}`,
			func(b []byte) ([]byte, error) { return ForLlamaCpp(b, "base", 2) }, false},
		{"llama.cpp inserts lora", `{"model":"sql"}`, `{"lora":[{"id":0,"scale":1}],"model":"base"}`,
			func(b []byte) ([]byte, error) { return ForLlamaCpp(b, "base", 0) }, false},
		{"not an object", `[1]`, ``, WithUsage, true},
		{"priority inserted", `{"model":"m"}`, `{"priority":2,"model":"m"}`, func(b []byte) ([]byte, error) { return WithPriority(b, 2) }, false},
		{"a client's priority replaced", `{"priority":-100,"model":"m"}`, `{"priority":0,"model":"m"}`,
			func(b []byte) ([]byte, error) { return WithPriority(b, 0) }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.do([]byte(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err %v, wantErr %v", err, tt.wantErr)
			}
			if err == nil && string(got) != tt.want {
				t.Fatalf("\n got %s\nwant %s", got, tt.want)
			}
			if err == nil && !json.Valid(got) {
				t.Fatalf("invalid JSON: %s", got)
			}
		})
	}
}

func TestUsageStripper(t *testing.T) {
	usage := `data: {"id":"x","choices":[],"usage":{"prompt_tokens":1}}`
	tests := []struct{ name, in, want string }{
		{"drops the usage chunk", "data: {\"choices\":[{}]}\n\n" + usage + "\n\ndata: [DONE]\n\n", "data: {\"choices\":[{}]}\n\ndata: [DONE]\n\n"},
		{"keeps usage beside choices", "data: {\"choices\":[{}],\"usage\":{\"a\":1}}\n\n", "data: {\"choices\":[{}],\"usage\":{\"a\":1}}\n\n"},
		{"keeps null usage", "data: {\"choices\":[],\"usage\":null}\n\n", "data: {\"choices\":[],\"usage\":null}\n\n"},
		{"CRLF framing", "data: {\"choices\":[{}]}\r\n\r\n" + usage + "\r\n\r\n", "data: {\"choices\":[{}]}\r\n\r\n"},
		{"unterminated tail passes", "data: {\"choices\":[{}]}\n\ndata: par", "data: {\"choices\":[{}]}\n\ndata: par"},
		{"an error body passes", `{"error":{"message":"x"}}`, `{"error":{"message":"x"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := stripAll([]byte(tt.in), 1); got != tt.want {
				t.Fatalf("\n got %q\nwant %q", got, tt.want)
			}
		})
	}
}

// stripAll feeds in through a UsageStripper in pieces of size n.
func stripAll(in []byte, n int) string {
	var out bytes.Buffer
	s := &UsageStripper{dst: &out}
	for len(in) > 0 {
		k := min(n, len(in))
		s.Write(in[:k])
		in = in[k:]
	}
	s.Flush()
	return out.String()
}

// FuzzUsageStripper: however the engine's stream is cut into reads, the
// client gets the same bytes, and never more than the engine sent.
func FuzzUsageStripper(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{}]}\n\ndata: {\"choices\":[],\"usage\":{}}\n\ndata: [DONE]\n\n"), uint8(3))
	f.Add([]byte("data: x\r\n\r\n\n\n\r\n"), uint8(1))
	f.Fuzz(func(t *testing.T, in []byte, n uint8) {
		whole := stripAll(in, len(in)+1)
		if got := stripAll(in, int(n)+1); got != whole {
			t.Fatalf("chunked %q != whole %q", got, whole)
		}
		if len(whole) > len(in) {
			t.Fatalf("output longer than input")
		}
	})
}

// FuzzWithUsage: a rewritten body is valid JSON asking for usage, or the
// body is refused with an error.
func FuzzWithUsage(f *testing.F) {
	f.Add([]byte(`{"model":"m","stream":true}`))
	f.Add([]byte(`{"stream_options":{"include_usage":false},"stream_options":{}}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		if _, err := Sniff(in); err != nil {
			return // the handler refuses it before any rewrite
		}
		out, err := WithUsage(in)
		if err != nil {
			return
		}
		if !json.Valid(out) || !WantsUsage(out) {
			t.Fatalf("rewrite of %q gave %q", in, out)
		}
	})
}
