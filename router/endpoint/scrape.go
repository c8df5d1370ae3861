package endpoint

import (
	"bytes"
	"io"

	"github.com/llmgw/llmgw/vllm"
)

// Reading is one reading of an engine's load, from the router's own scrape
// or from its agent's load snapshot (design §6, §7.2).
type Reading struct {
	Waiting float64
	Running float64
	// KVUsage is the share of KV-cache blocks in use, 0..1.
	KVUsage float64
}

// parseLoad reads a vLLM-compatible engine's /metrics for the router's own
// scrape, the fallback for nodes whose agent serves no load snapshots. The
// watch state does not carry an engine's kind to this point, so vLLM's names
// are tried first, then llama.cpp's. A body without either's gauges is an
// error: the replica is then unread (saturated), not idle.
func parseLoad(body io.Reader) (Reading, error) {
	text, err := io.ReadAll(io.LimitReader(body, vllm.MaxMetricsBytes))
	if err != nil {
		return Reading{}, err
	}
	l, err := vllm.ParseLoad(bytes.NewReader(text), vllm.VLLMLoadNames)
	if err != nil {
		if l2, err2 := vllm.ParseLoad(bytes.NewReader(text), vllm.LlamaCppLoadNames); err2 == nil {
			return Reading(l2), nil
		}
		return Reading{}, err
	}
	return Reading(l), nil
}
