package api

import (
	"io"
	"net/http"
	"sync"
	"testing"

	"github.com/llmgw/llmgw/router/capture"
	"github.com/llmgw/llmgw/router/endpoint"
)

type captured struct {
	mu   sync.Mutex
	reqs []capture.Request
}

func (c *captured) Record(r capture.Request) {
	c.mu.Lock()
	c.reqs = append(c.reqs, r)
	c.mu.Unlock()
}

// TestCapture: every request that reached a plan is handed to the capture
// with its shape — API, model, session, lengths, prefix hashes, output
// tokens, status — and one refused before (an unknown model) is not.
func TestCapture(t *testing.T) {
	eng := &tracedEngine{}
	c := &captured{}
	srv := newRouter(t, &table{models: map[string][]*endpoint.Endpoint{"demo": {ep("demo-0", engine(t, eng.serve))}}},
		func(cfg *Config) { cfg.Capture = c })
	prompt := `You are a helpful assistant that answers in one word, whatever the question is, and never more than that. ` +
		`Question: what colour is the sky?`
	body := `{"model":"demo","max_tokens":7,"messages":[{"role":"user","content":"` + prompt + `"}]}`
	resp := post(t, srv.URL+"/v1/chat/completions", body, map[string]string{"X-Session-Id": "s-1"})
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	resp = post(t, srv.URL+"/v1/chat/completions", `{"model":"nope","messages":[]}`, nil)
	_, _ = io.Copy(io.Discard, resp.Body)
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.reqs) != 1 {
		t.Fatalf("%d records, want 1 (the unknown model's request has none)", len(c.reqs))
	}
	r := c.reqs[0]
	if r.API != "chat" || r.Model != "demo" || r.Session != "s-1" || r.PromptBytes != len(body) || r.MaxTokens != 7 ||
		r.OutputTokens != 3 || r.Status != http.StatusOK || r.Arrival.IsZero() || len(r.Prefix) != len(prompt)/64 {
		t.Fatalf("record %+v", r)
	}
}
