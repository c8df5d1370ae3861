package scheduler

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/internal/testkit"
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
		{"the guard comes first: only a hot replica holds it", nil,
			&KVQuery{Matched: map[string]int{"b": 8}, Total: 8},
			[]Candidate{c("a", 0, 0, 0), c("b", 9, 0, 0), c("c", 0, 0, 0)},
			[]float64{0, 0, 0}, KVLoadOverride, ""},
		{"the guard spares a cool holder, the hot one scores nothing", nil,
			&KVQuery{Matched: map[string]int{"a": 4, "b": 8}, Total: 8},
			[]Candidate{c("a", 0, 0, 0), c("b", 9, 0, 0), c("c", 0, 0, 0)},
			[]float64{0.5, 0, 0}, KVHit, ""},
		{"a cool holder under MinBlocks does not count", nil,
			&KVQuery{Matched: map[string]int{"a": 1, "b": 8}, Total: 8, MinBlocks: 2},
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
		{"offload credit: a CPU-held prefix outscores a shorter GPU one", nil,
			&KVQuery{Matched: map[string]int{"a": 2}, Credit: map[string]float64{"a": 2, "b": 6.4}, Total: 8}, three,
			[]float64{0.25, 0.8, 0}, KVHit, ""},
		{"offload credit under MinBlocks is a miss", [][2]string{{sys, "c"}},
			&KVQuery{Matched: map[string]int{}, Credit: map[string]float64{"a": 2.4}, Total: 8, MinBlocks: 3}, three,
			[]float64{0, 0, 1}, KVMiss, DecisionHit},
		{"offload credit reaching MinBlocks, rounding aside", nil,
			&KVQuery{Matched: map[string]int{}, Credit: map[string]float64{"a": 0.8 + 0.8 + 0.8 + 0.8 + 0.8 - 1}, Total: 6, MinBlocks: 3}, three,
			nil, KVHit, ""},
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
			if tt.kvDecision != "" && testkit.Metric(t, reg, "llmgw_kv_decisions_total", testkit.Labels{"decision": tt.kvDecision}) != 1 {
				t.Errorf("kv decision %s not counted", tt.kvDecision)
			}
			if tt.tier1 != "" && testkit.Metric(t, reg, "llmgw_prefix_decisions_total", testkit.Labels{"decision": tt.tier1}) != 1 {
				t.Errorf("tier-1 decision %s not counted", tt.tier1)
			}
			if tt.tier1 == "" {
				for _, d := range []string{DecisionHit, DecisionMiss, DecisionLoadOverride, DecisionNoPrompt} {
					if testkit.Metric(t, reg, "llmgw_prefix_decisions_total", testkit.Labels{"decision": d}) != 0 {
						t.Errorf("tier 1 decided (%s) although the index answered", d)
					}
				}
			}
		})
	}
}

// TestPrefixScorerCost: tier 2's cost score (profile_overrides.kv_score:
// cost) — the prompt's prefill still to compute on each replica plus the
// prefill queued there, as 1 − cost / the highest cost — beside the share
// score of the same answers.
func TestPrefixScorerCost(t *testing.T) {
	sys := strings.Repeat("You are a helpful assistant. ", 10)
	h := func(s string) []uint64 { return prefix.Hashes(nil, s, prefix.DefaultChunk, 0) }
	three := []Candidate{c("a", 0, 0, 0), c("b", 0, 0, 0), c("c", 0, 0, 0)}
	// 8 blocks of 16: 128 tokens.
	q := func(matched map[string]int, queued map[string]float64) *KVQuery {
		return &KVQuery{Matched: matched, Total: 8, BlockSize: 16, Tokens: 128, Queued: queued}
	}
	tests := []struct {
		name        string
		sent        [][2]string
		q           *KVQuery
		cands       []Candidate
		queueWeight float64
		cost, share []float64
		kvDecision  string
	}{
		{"prefill still to compute, nothing queued", nil,
			q(map[string]int{"a": 8, "b": 4}, nil), three, 1,
			[]float64{1, 0.5, 0}, []float64{1, 0.5, 0}, KVHit},
		{"a partial last block is prefill too", nil,
			&KVQuery{Matched: map[string]int{"a": 8}, Total: 8, BlockSize: 16, Tokens: 136}, three, 1,
			[]float64{1 - 8.0/136, 0, 0}, []float64{1, 0, 0}, KVHit},
		{"prefill queued by this router outweighs a hit", nil,
			q(map[string]int{"a": 8}, map[string]float64{"a": 256}), three, 1,
			[]float64{0, 0.5, 0.5}, []float64{1, 0, 0}, KVHit},
		{"the agents' waiting requests count, at the mean own prefill", nil,
			q(map[string]int{"a": 8}, nil), []Candidate{c("a", 3, 0, 0), c("b", 0, 0, 0), c("c", 0, 0, 0)}, 1,
			[]float64{0, 0.5, 0.5}, []float64{1, 0, 0}, KVHit},
		{"the record and the load are not counted twice", nil,
			q(map[string]int{"a": 8}, map[string]float64{"a": 256}), []Candidate{c("a", 1, 0, 0), c("b", 0, 0, 0), c("c", 0, 0, 0)}, 1,
			[]float64{0, 0.5, 0.5}, []float64{1, 0, 0}, KVHit},
		{"a stale load reading's queue is not believed", nil,
			q(map[string]int{"a": 8}, nil), []Candidate{{Key: Key{ID: "a", UID: 1}, Waiting: 3, Saturated: true}, c("b", 0, 0, 0), c("c", 0, 0, 0)}, 1,
			[]float64{1, 0, 0}, []float64{1, 0, 0}, KVHit},
		{"the queue weight scales the queue", nil,
			q(map[string]int{"a": 8}, map[string]float64{"a": 128}), three, 0.5,
			[]float64{0.5, 0, 0}, []float64{1, 0, 0}, KVHit},
		{"offload credit lowers the prefill", nil,
			&KVQuery{Matched: map[string]int{"a": 4}, Credit: map[string]float64{"a": 4, "b": 6}, Total: 8, BlockSize: 16, Tokens: 128}, three, 1,
			[]float64{0.5, 0.75, 0}, []float64{0.5, 0.75, 0}, KVHit},
		{"alike replicas score alike", nil,
			q(map[string]int{"a": 8, "b": 8, "c": 8}, nil), three, 1,
			[]float64{1, 1, 1}, []float64{1, 1, 1}, KVHit},
		{"under MinBlocks it is a miss either way, placed by tier 1", [][2]string{{sys, "c"}},
			&KVQuery{Matched: map[string]int{"a": 1}, Total: 8, BlockSize: 16, Tokens: 128, MinBlocks: 2}, three, 1,
			[]float64{0, 0, 1}, []float64{0, 0, 1}, KVMiss},
		{"the guard still comes first", nil,
			q(map[string]int{"b": 8}, nil), []Candidate{c("a", 0, 0, 0), c("b", 9, 0, 0), c("c", 0, 0, 0)}, 1,
			[]float64{0, 0, 0}, []float64{0, 0, 0}, KVLoadOverride},
		{"the guard zeroes the hot replica's cost score too", nil,
			q(map[string]int{"a": 8, "b": 8}, nil), []Candidate{c("a", 0, 0, 0), c("b", 9, 0, 0), c("c", 0, 0, 0)}, 1,
			[]float64{1, 0, 2.0 / 3}, []float64{1, 0, 0}, KVHit}, // c: its prefill, under the hot b's queue
		{"untrusted replicas are scored by the tree, the rest by cost", [][2]string{{sys, "c"}},
			&KVQuery{Matched: map[string]int{"a": 4, "b": 8}, Total: 8, BlockSize: 16, Tokens: 128, Untrusted: map[string]bool{"c": true}}, three, 1,
			[]float64{0, 1, 1}, []float64{0.5, 1, 1}, KVUntrusted},
	}
	for _, tt := range tests {
		for _, kind := range []string{KVScoreCost, KVScoreShare} {
			t.Run(tt.name+"/"+kind, func(t *testing.T) {
				s, reg, _ := newSched(t, 1)
				p := DefaultParams()
				p.KVScore, p.KVQueueWeight = kind, tt.queueWeight
				sc := s.prefixWith(p)
				for _, x := range tt.sent {
					sc.(Observer).Observe(&Request{Prefix: h(x[0])}, &Candidate{Key: Key{ID: x[1], UID: 1}})
				}
				out := make([]float64, len(tt.cands))
				sc.Score(&Request{Prefix: h(sys), KV: tt.q}, tt.cands, out)
				want := tt.cost
				if kind == KVScoreShare {
					want = tt.share
				}
				for i := range want {
					if math.Abs(out[i]-want[i]) > 1e-9 {
						t.Fatalf("scores = %v, want %v", out, want)
					}
				}
				if testkit.Metric(t, reg, "llmgw_kv_decisions_total", testkit.Labels{"decision": tt.kvDecision}) != 1 {
					t.Errorf("kv decision %s not counted", tt.kvDecision)
				}
			})
		}
	}
}

// TestSpeculativeHits: a decision counts as a speculative hit when its best
// match needed pending blocks — not when a replica tied with it holds them
// all confirmed, and not on a miss.
func TestSpeculativeHits(t *testing.T) {
	tests := []struct {
		name string
		q    *KVQuery
		want float64
	}{
		{"best match partly pending", &KVQuery{Matched: map[string]int{"a": 8, "b": 2}, Pending: map[string]int{"a": 3}, Total: 8}, 1},
		{"only a lesser match pending", &KVQuery{Matched: map[string]int{"a": 8, "b": 2}, Pending: map[string]int{"b": 2}, Total: 8}, 0},
		{"tied with a confirmed match", &KVQuery{Matched: map[string]int{"a": 8, "b": 8}, Pending: map[string]int{"a": 3}, Total: 8}, 0},
		{"a miss is no hit", &KVQuery{Matched: map[string]int{"a": 1}, Pending: map[string]int{"a": 1}, Total: 8, MinBlocks: 2}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, reg, _ := newSched(t, 1)
			out := make([]float64, 3)
			s.Prefix().Score(&Request{KV: tt.q}, []Candidate{c("a", 0, 0, 0), c("b", 0, 0, 0), c("c", 0, 0, 0)}, out)
			if got := testkit.Metric(t, reg, "llmgw_kv_speculative_hits_total", nil); got != tt.want {
				t.Errorf("speculative hits = %v, want %v", got, tt.want)
			}
		})
	}
}

// BenchmarkPrefixScoreKV: one tier-2 scoring over 16 candidates, the share
// score (today's) against the cost score in the same run.
func BenchmarkPrefixScoreKV(b *testing.B) {
	cands := make([]Candidate, 16)
	q := &KVQuery{Matched: map[string]int{}, Pending: map[string]int{}, Queued: map[string]float64{}, Total: 80, BlockSize: 16, Tokens: 1290}
	for i := range cands {
		id := "r" + strconv.Itoa(i)
		cands[i] = Candidate{Key: Key{ID: id, UID: 1}, Waiting: float64(i % 3), Running: 4, Inflight: 4}
		q.Matched[id] = (i * 7) % 81
		q.Queued[id] = float64(i * 100)
		if i%4 == 0 {
			q.Pending[id] = 3
		}
	}
	for _, kind := range []string{KVScoreShare, KVScoreCost} {
		b.Run(kind, func(b *testing.B) {
			s, _, _ := newSched(b, 1)
			p := DefaultParams()
			p.KVScore = kind
			sc := s.prefixWith(p)
			r := &Request{KV: q}
			out := make([]float64, len(cands))
			b.ResetTimer()
			for range b.N {
				clear(out)
				sc.Score(r, cands, out)
			}
		})
	}
}
