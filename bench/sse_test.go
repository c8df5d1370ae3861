package bench

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

// tickClock advances a fixed step on every reading, so stream timings are
// exact without a wall clock.
type tickClock struct {
	t    time.Time
	step time.Duration
}

func (c *tickClock) now() time.Time {
	c.t = c.t.Add(c.step)
	return c.t
}

func TestReadStream(t *testing.T) {
	const usage = `data: {"choices":[],"usage":{"prompt_tokens":50,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":32}}}` + "\n\n"
	role := `data: {"choices":[{"delta":{"role":"assistant","content":""}}]}` + "\n\n"
	tok := func(s string) string { return `data: {"choices":[{"delta":{"content":"` + s + `"}}]}` + "\n\n" }
	tests := []struct {
		name              string
		body              string
		wantErr           error
		tokens            int
		answer            string
		prompt, cached    int
		ttftTicks, itlLen int
	}{
		{"chat with usage", role + tok("a") + tok("b") + tok("c") + usage + "data: [DONE]\n\n", nil, 3, "abc", 50, 32, 2, 2},
		{"completions text", `data: {"choices":[{"text":"x"}]}` + "\n\n" + `data: {"choices":[{"text":"y"}]}` + "\n\ndata: [DONE]\n\n", nil, 2, "xy", 0, 0, 1, 1},
		{"CRLF, comments and other fields", ": keep-alive\r\nevent: message\r\n" + strings.ReplaceAll(tok("a"), "\n", "\r\n") + "data: [DONE]\r\n\r\n", nil, 1, "a", 0, 0, 1, 0},
		{"no usage details", tok("a") + `data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":1,"prompt_tokens_details":null}}` + "\n\ndata: [DONE]\n\n", nil, 1, "a", 9, 0, 1, 0},
		{"DONE without trailing blank line", tok("a") + "data: [DONE]", nil, 1, "a", 0, 0, 1, 0},
		{"truncated", role + tok("a"), errTruncated, 1, "a", 0, 0, 2, 0},
		{"error mid-stream", tok("a") + `data: {"error":{"message":"engine died","type":"internal"}}` + "\n\n", errStreamError, 1, "a", 0, 0, 1, 0},
		{"garbage chunk", tok("a") + "data: {not json\n\n", errBadChunk, 1, "a", 0, 0, 1, 0},
		{"empty body", "", errTruncated, 0, "", 0, 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := &tickClock{t: time.Unix(0, 0), step: time.Millisecond}
			start := clock.t
			res, err := readStream(strings.NewReader(tt.body), start, clock.now)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if res.tokens != tt.tokens || res.answer != tt.answer || len(res.itl) != tt.itlLen {
				t.Fatalf("tokens %d answer %q itl %d, want %d %q %d", res.tokens, res.answer, len(res.itl), tt.tokens, tt.answer, tt.itlLen)
			}
			if got := res.ttft / time.Millisecond; int(got) != tt.ttftTicks {
				t.Fatalf("ttft %d ticks, want %d (one per event read)", got, tt.ttftTicks)
			}
			var prompt, cached int
			if res.usage != nil {
				prompt, cached = res.usage.PromptTokens, res.usage.CachedTokens()
			}
			if prompt != tt.prompt || cached != tt.cached {
				t.Fatalf("usage %d/%d, want %d/%d", prompt, cached, tt.prompt, tt.cached)
			}
		})
	}
}

func TestReadStreamRefusesAnEndlessLine(t *testing.T) {
	body := "data: " + strings.Repeat("x", maxLine+10)
	_, err := readStream(strings.NewReader(body), time.Unix(0, 0), time.Now)
	if err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Fatalf("err = %v, want a line-length error", err)
	}
}

func FuzzReadStream(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("data: {\"choices\":[{\"text\":\"a\"}]}\r\n\r\ndata: [DONE]"))
	f.Add([]byte(": ping\n\nevent: x\ndata: {\"error\":{\"message\":\"boom\"}}\n\n"))
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\ndata: {\"more\":1}\n\n"))
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens\":-1,\"prompt_tokens_details\":{}}}\n\n"))
	f.Add([]byte("\x00\xff data:"))
	f.Fuzz(func(t *testing.T, body []byte) {
		clock := &tickClock{t: time.Unix(0, 0), step: time.Millisecond}
		res, err := readStream(bytes.NewReader(body), clock.t, clock.now)
		if res.tokens > 0 && len(res.itl) != res.tokens-1 {
			t.Fatalf("%d tokens but %d gaps", res.tokens, len(res.itl))
		}
		if res.ttft < 0 || res.last < res.ttft {
			t.Fatalf("ttft %s last %s", res.ttft, res.last)
		}
		if err == nil && !res.done {
			t.Fatal("no error though [DONE] never came")
		}
		if len(res.answer) > maxAnswer {
			t.Fatalf("answer of %d bytes past the bound", len(res.answer))
		}
		_ = res.usage.CachedTokens() // nil-safe
	})
}

func FuzzParseEvent(f *testing.F) {
	for _, s := range []string{
		"[DONE]", ` [DONE] `, `{}`, `{"choices":null}`,
		`{"choices":[{"delta":{"content":"x","reasoning_content":"y"},"text":"z"}],"usage":{"prompt_tokens":1}}`,
		`{"error":{}}`, `[1,2]`, `"s"`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ev, err := parseEvent(data)
		if err != nil {
			if !errors.Is(err, errBadChunk) {
				t.Fatalf("error %v is not errBadChunk", err)
			}
			return
		}
		if ev.text != "" && !ev.token {
			t.Fatal("text without a token")
		}
	})
}
