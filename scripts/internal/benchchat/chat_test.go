package benchchat

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// engine streams n content chunks, usage and [DONE] (or stops before
// [DONE] when the prompt says "cut"), or refuses when it says "refuse".
func engine(t *testing.T) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if got := r.Header.Get("X-Extra"); got != "yes" {
			t.Errorf("X-Extra = %q", got)
		}
		if strings.Contains(string(body), "refuse") {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.Header().Set("X-Llmgw-Priority", "batch")
		f := w.(http.Flusher)
		time.Sleep(5 * time.Millisecond) // a measurable TTFT
		for i := range 4 {
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
			f.Flush()
		}
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":4}}\n\n")
		if !strings.Contains(string(body), "cut") {
			fmt.Fprint(w, "data: [DONE]\n\n")
		}
	}))
}

func TestDo(t *testing.T) {
	srv := engine(t)
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	for _, tc := range []struct {
		name, prompt string
		cancelAfter  int
		code         int
		complete     bool
		out          int
		cancelled    bool
	}{
		{"whole stream", "hello", 0, 200, true, 4, false},
		{"no [DONE]", "cut", 0, 200, false, 4, false},
		{"cancelled", "hello", 2, 200, false, 0, true},
		{"refused", "refuse", 0, 429, false, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := Do(context.Background(), srv.Client(), Request{Addr: addr, Model: "m", Prompt: tc.prompt, MaxTokens: 4,
				Stream: true, CancelAfter: tc.cancelAfter, Header: http.Header{"X-Extra": {"yes"}}})
			if res.Code != tc.code || res.Complete != tc.complete || res.Out != tc.out || res.Cancelled != tc.cancelled || res.Err != nil {
				t.Fatalf("Do = %+v", res)
			}
			if res.Elapsed <= 0 || res.Elapsed < res.TTFT {
				t.Fatalf("elapsed %v, TTFT %v", res.Elapsed, res.TTFT)
			}
			if tc.code == 200 && (res.TTFT < 5*time.Millisecond || res.Header.Get("X-Llmgw-Priority") != "batch") {
				t.Fatalf("TTFT %v, header %v", res.TTFT, res.Header)
			}
			if tc.code == 429 && res.Header.Get("Retry-After") != "1" {
				t.Fatalf("header %v", res.Header)
			}
		})
	}
}
