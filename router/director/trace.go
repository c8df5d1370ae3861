package director

import "github.com/llmgw/llmgw/router/scheduler"

// Traced is what a request's trace shows of stage 3 (design §9
// "Tracing"): counts and reasons, never the prompt.
type Traced struct {
	// PrefixChunks is how many of tier 1's prefix hashes the prompt gave.
	PrefixChunks int
	// Tier2 is set when tier 2 was asked; Fallback then says why its index
	// could not answer ("": it did).
	Tier2    bool
	Fallback string
	// Tokens is the prompt's length in tokens, Blocks its blocks, and
	// BestMatch the most leading blocks one replica holds, when tier 2
	// answered.
	Tokens, Blocks, BestMatch int
}

// Traced reports what stage 3 worked out, for the request's trace.
func (p *Plan) Traced() Traced {
	t := Traced{PrefixChunks: len(p.req.Prefix)}
	if q := p.req.KV; q != nil {
		t.Tier2, t.Fallback, t.Tokens, t.Blocks = true, q.Fallback, q.Tokens, q.Total
		for _, n := range q.Matched {
			t.BestMatch = max(t.BestMatch, n)
		}
	}
	return t
}

// TraceWith makes each attempt's scheduling tell tr its steps (filters,
// scorers, picker); nil stops it.
func (p *Plan) TraceWith(tr scheduler.Tracer) { p.req.Trace = tr }
