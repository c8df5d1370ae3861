package api

import (
	"net/http"
	"time"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/capture"
	"github.com/llmgw/llmgw/router/director"
	"github.com/llmgw/llmgw/router/openai"
)

// Capturer is the traffic capture (capture.Recorder, design §9.2): Record
// never blocks.
type Capturer interface {
	Record(capture.Request)
}

// capture records a request that reached stage 3 (a plan): what a replay
// needs of it, and no text — the body's length, the prompt's hashes, the
// answer's length and status. code is the status the client got.
func (h *Handler) capture(r *http.Request, api openai.API, start time.Time, body []byte, key *llmgwv1.ApiKey,
	plan *director.Plan, code, output int,
) {
	if plan == nil {
		return
	}
	prefix, blocks, bs := plan.Captured()
	tokens, _ := plan.PromptTokens()
	maxTokens, _ := openai.MaxTokensFor(api, body)
	h.cfg.Capture.Record(capture.Request{Arrival: start, API: api.String(), Model: plan.Base, Tenant: tenantOf(key),
		Session: h.session(r.Header), PromptBytes: len(body), PromptTokens: tokens, Prefix: prefix, Blocks: blocks,
		BlockSize: bs, MaxTokens: maxTokens, OutputTokens: output, Stream: plan.Stream, Status: code})
}
