package api

import (
	"net/http"
	"slices"
	"time"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/capture"
	"github.com/llmgw/llmgw/router/director"
	"github.com/llmgw/llmgw/router/openai"
	"github.com/llmgw/llmgw/router/proxy"
)

// Capturer records a request for a replay (router/capture.Writer). Record
// must not block: it is called on the request path, once the answer ended.
type Capturer interface {
	Record(capture.Request)
}

// captured is what the capture keeps of a request, read from the plan
// before Done clears its answer's tail; the answer's outcome is added by
// capture. Never the text: the prompt's block hashes and lengths only.
func (h *Handler) captured(r *http.Request, api openai.API, key *llmgwv1.ApiKey, tgt director.Target, plan *director.Plan, bodyBytes int, start time.Time) *capture.Request {
	if plan == nil {
		return nil
	}
	c := &capture.Request{Arrived: start, Model: tgt.Name, Tenant: tenantOf(key), API: api.String(), Stream: plan.Stream,
		Session: h.session(r.Header), PromptBytes: bodyBytes}
	hashes, size, tokens := plan.Blocks()
	if len(hashes) > 0 {
		c.Hashes, c.BlockSize = slices.Clone(hashes), size
		c.Unit = capture.UnitBytes
		if tokens {
			c.Unit = capture.UnitTokens
			if chunks, size := plan.TextChunks(); len(chunks) > 0 {
				c.Chunks, c.ChunkSize = slices.Clone(chunks), size
			}
		}
	}
	if n, ok := plan.PromptTokens(); ok {
		c.PromptTokens = n // tier 2's count: no parse on the request path
	} else if u, ok := plan.Usage(); ok {
		// Tier 1 only: the prompt's length is the engine's usage, read
		// off the answer's end (the output's comes from Done).
		c.PromptTokens = u.PromptTokens
		if u.PromptTokensDetails != nil {
			c.CachedTokens = u.PromptTokensDetails.CachedTokens
		}
	}
	return c
}

// capture adds the answer's outcome to c — its output tokens from Done
// (out, when ok) — and hands it to the writer. The request's own
// max_tokens is read off the body only for an answer without usage (a
// failure), which a replay then asks for instead.
func (h *Handler) capture(c *capture.Request, api openai.API, body []byte, res proxy.Result, out int, ok bool) {
	c.Status = res.Code
	if ok {
		c.OutputTokens = out
	} else if n, ok := openai.MaxTokensFor(api, body); ok {
		c.MaxTokens = n
	}
	if res.Replica != nil {
		c.Replica = res.Replica.ReplicaID
	}
	if !res.FirstByte.IsZero() {
		c.TTFT = res.FirstByte.Sub(c.Arrived)
	}
	h.cfg.Capture.Record(*c)
}
