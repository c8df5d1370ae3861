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
		}
	}
	if n, ok := plan.PromptTokens(); ok {
		c.PromptTokens = n
	}
	if u, ok := plan.Usage(); ok {
		c.PromptTokens, c.OutputTokens = u.PromptTokens, u.CompletionTokens
		if u.PromptTokensDetails != nil {
			c.CachedTokens = u.PromptTokensDetails.CachedTokens
		}
	}
	if n, ok := openai.MaxTokensFor(api, plan.Body); ok {
		c.MaxTokens = n
	}
	return c
}

// capture adds the answer's outcome to c and hands it to the writer.
func (h *Handler) capture(c *capture.Request, res proxy.Result) {
	c.Status = res.Code
	if res.Replica != nil {
		c.Replica = res.Replica.ReplicaID
	}
	if !res.FirstByte.IsZero() {
		c.TTFT = res.FirstByte.Sub(c.Arrived)
	}
	h.cfg.Capture.Record(*c)
}
