package scheduler

import (
	"fmt"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/router/prefix"
)

// TestPrefixScorerKV: tier 2's scoring (design §7.5 step 5) — shares of
// leading blocks, the guard first, MinBlocks, untrusted replicas by the
// tree, and each fallback counted and handed to tier 1.
func TestPrefixScorerKV(t *testing.T) {
	sys := strings.Repeat("You are a helpful assistant. ", 10)
	h := func(s string) []uint64 { return prefix.Hashes(nil, s, prefix.DefaultChunk, 0) }
	three := []Candidate{c("a", 0, 0, 0), c("b", 0, 0, 0), c("c", 0, 0, 0)}
	tests := []struct {
		name       string
		sent       [][2]string // tier 1's memory: prompt, replica
		q          *KVQuery
		cands      []Candidate
		want       []float64 // nil: only the decisions are checked
		kvDecision string
		tier1      string // the tier-1 decision counted, or ""
	}{
		{"shares of leading blocks", nil,
			&KVQuery{Matched: map[string]int{"a": 2, "b": 8}, Total: 8}, three,
			[]float64{0.25, 1, 0}, KVHit, ""},
		{"matches under MinBlocks are a miss, placed by tier 1", [][2]string{{sys, "c"}},
			&KVQuery{Matched: map[string]int{"a": 1, "b": 2}, Total: 8, MinBlocks: 3}, three,
			[]float64{0, 0, 1}, KVMiss, DecisionHit},
		{"MinBlocks reached", nil,
			&KVQuery{Matched: map[string]int{"a": 3}, Total: 6, MinBlocks: 3}, three,
			[]float64{0.5, 0, 0}, KVHit, ""},
		{"the guard comes first", nil,
			&KVQuery{Matched: map[string]int{"b": 8}, Total: 8},
			[]Candidate{c("a", 0, 0, 0), c("b", 9, 0, 0), c("c", 0, 0, 0)},
			[]float64{0, 0, 0}, KVLoadOverride, ""},
		{"matched past total is capped", nil,
			&KVQuery{Matched: map[string]int{"a": 9}, Total: 4}, three,
			[]float64{1, 0, 0}, KVHit, ""},
		{"untrusted replicas are scored by the tree", [][2]string{{sys, "c"}},
			&KVQuery{Matched: map[string]int{"a": 4, "c": 8}, Total: 8, Untrusted: map[string]bool{"c": true}}, three,
			[]float64{0.5, 0, 1}, KVUntrusted, ""},
		{"untrusted and no trusted match", nil,
			&KVQuery{Matched: map[string]int{}, Total: 8, Untrusted: map[string]bool{"c": true}}, three,
			[]float64{0, 0, 0}, KVUntrusted, ""},
		{"no data falls back to tier 1", [][2]string{{sys, "b"}},
			&KVQuery{Fallback: KVNoData}, three, []float64{0, 1, 0}, KVNoData, DecisionHit},
		{"tokenize timeout falls back to tier 1", nil,
			&KVQuery{Fallback: KVTokenizeTimeout}, three, nil, KVTokenizeTimeout, DecisionMiss},
		{"an empty answer falls back to tier 1", nil,
			&KVQuery{Total: 0}, three, nil, "", DecisionMiss},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, reg, _ := newSched(t, 1)
			sc := s.Prefix()
			for _, x := range tt.sent {
				sc.(Observer).Observe(&Request{Prefix: h(x[0])}, &Candidate{Key: Key{ID: x[1], UID: 1}})
			}
			r := &Request{Prefix: h(sys), KV: tt.q}
			out := make([]float64, len(tt.cands))
			sc.Score(r, tt.cands, out)
			if tt.want != nil && fmt.Sprint(out) != fmt.Sprint(tt.want) {
				t.Errorf("scores = %v, want %v", out, tt.want)
			}
			if tt.kvDecision != "" && counter(t, reg, "llmgw_kv_decisions_total", tt.kvDecision) != 1 {
				t.Errorf("kv decision %s not counted", tt.kvDecision)
			}
			if tt.tier1 != "" && counter(t, reg, "llmgw_prefix_decisions_total", tt.tier1) != 1 {
				t.Errorf("tier-1 decision %s not counted", tt.tier1)
			}
			if tt.tier1 == "" {
				for _, d := range []string{DecisionHit, DecisionMiss, DecisionLoadOverride, DecisionNoPrompt} {
					if counter(t, reg, "llmgw_prefix_decisions_total", d) != 0 {
						t.Errorf("tier 1 decided (%s) although the index answered", d)
					}
				}
			}
		})
	}
}
