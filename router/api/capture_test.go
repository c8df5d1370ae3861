package api

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/router/capture"
	"github.com/llmgw/llmgw/router/endpoint"
)

// captures is a Capturer keeping what it is handed.
type captures struct {
	mu   sync.Mutex
	recs []capture.Request
}

func (r *captures) Record(c capture.Request) {
	r.mu.Lock()
	r.recs = append(r.recs, c)
	r.mu.Unlock()
}

// TestCaptureRecordsEveryRequest: an answered request is recorded with its
// model, tenant-free key, session, lengths from the engine's usage, tier 1's
// chunk hashes (no tier 2 here), status, replica and first byte; a refused
// one with its status. Nothing of the prompt's text is handed over.
func TestCaptureRecordsEveryRequest(t *testing.T) {
	addr := engine(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","choices":[{"message":{"role":"assistant","content":"hi"}}],`+
			`"usage":{"prompt_tokens":40,"completion_tokens":5,"total_tokens":45,"prompt_tokens_details":{"cached_tokens":16}}}`)
	})
	rec := &captures{}
	srv := newRouter(t, &table{models: map[string][]*endpoint.Endpoint{"demo": {ep("demo-0", addr)}}}, func(c *Config) { c.Capture = rec })
	prompt := strings.Repeat("the quick brown fox jumps over the lazy dog ", 8) // 352 bytes: 5 whole chunks
	before := time.Now()
	resp := post(t, srv.URL+"/v1/chat/completions", `{"model":"demo","max_tokens":7,"messages":[{"role":"user","content":"`+prompt+`"}]}`,
		map[string]string{"X-Session-ID": "s-1"})
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	_, _ = io.ReadAll(resp.Body)
	if resp := post(t, srv.URL+"/v1/chat/completions", `{"model":"nope","messages":[]}`, nil); resp.StatusCode != 404 {
		t.Fatalf("unknown model: status %d", resp.StatusCode)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.recs) != 1 {
		t.Fatalf("%d records, want 1 (a request no model serves has no plan to record)", len(rec.recs))
	}
	c := rec.recs[0]
	if c.Model != "demo" || c.API != "chat" || c.Session != "s-1" || c.PromptTokens != 40 || c.OutputTokens != 5 || c.CachedTokens != 16 ||
		c.MaxTokens != 0 || c.Status != 200 || c.Replica != "demo-0" || c.Arrived.Before(before) {
		t.Fatalf("record %+v", c)
	}
	const chunk = 64 // tier 1's (router/prefix.DefaultChunk)
	if c.Unit != capture.UnitBytes || c.BlockSize != chunk || len(c.Hashes) != len(prompt)/chunk {
		t.Fatalf("blocks: unit %q size %d, %d hashes; want tier 1's %d chunks of %d bytes", c.Unit, c.BlockSize, len(c.Hashes),
			len(prompt)/chunk, chunk)
	}
}
