package director

import (
	"context"
	"testing"

	"github.com/llmgw/llmgw/router/kvindex"
	"github.com/llmgw/llmgw/router/tokenize"
)

// tieredIndex is index with offload tiers: LookupTiers answers tiers and
// records the weights and speculation it was asked with.
type tieredIndex struct {
	index
	tiers   []kvindex.TierMatch
	weights []kvindex.Weights
}

func (x *tieredIndex) LookupTiers(_ []uint64, w kvindex.Weights, _ bool, dst []kvindex.TierMatch) []kvindex.TierMatch {
	x.weights = append(x.weights, w)
	return append(dst, x.tiers...)
}

// TestPrepareTier2Tiers: with offload credit on, tier 2 asks the tiered
// lookup with the configured weights; Matched stays the GPU's leading
// blocks and Credit carries every tier, for the routed incarnations of
// trusted replicas only. Without WithKVCredit the GPU lookup alone answers.
func TestPrepareTier2Tiers(t *testing.T) {
	toks := make([]int, 40)
	chat := `{"model":"base","messages":[{"role":"user","content":"hi"}]}`
	rep := func(id string) kvindex.Replica { return kvindex.Replica{ID: id, UID: 1, Incarnation: 1} }
	w := kvindex.Weights{CPU: 0.6, Storage: 0.1}
	for _, tc := range []struct {
		name        string
		credit      bool
		wantMatched map[string]int
		wantCredit  map[string]float64
	}{
		{"credit", true, map[string]int{"r0": 1}, map[string]float64{"r0": 1.6, "r1": 1.2}},
		{"gpu only without WithKVCredit", false, map[string]int{"r0": 2}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			idx := &tieredIndex{
				index: index{status: map[string]kvindex.Status{"r0": status("r0", false), "r1": status("r1", false)},
					matches: []kvindex.Match{{Replica: rep("r0"), Blocks: 2}}},
				tiers: []kvindex.TierMatch{
					{Replica: rep("r0"), Blocks: 2, GPU: 1, Credit: 1.6},
					{Replica: rep("r1"), Blocks: 2, Credit: 1.2},
					{Replica: kvindex.Replica{ID: "r0", UID: 1, Incarnation: 9}, Blocks: 2, GPU: 2, Credit: 2},
				},
			}
			tb := baseTable()
			tb.models[0].KvEvents = true
			tb.models[0].HashSeed = "0"
			opts := []Option{WithKV(idx, &tokenizer{toks: toks}, 1)}
			if tc.credit {
				opts = append(opts, WithKVCredit(w))
			}
			d := New(tb, &sched{}, noBreakers{}, nil, opts...)
			defer d.Close()
			tgt, _ := d.Resolve(context.Background(), "base", discard)
			pl, aerr := d.Prepare(context.Background(), tgt, Input{Kind: tokenize.Chat, Body: []byte(chat)})
			if aerr != nil {
				t.Fatal(aerr)
			}
			q := pl.req.KV
			if q == nil || q.Fallback != "" || !mapsEqual(q.Matched, tc.wantMatched) || !mapsEqual(q.Credit, tc.wantCredit) ||
				(tc.wantCredit == nil) != (q.Credit == nil) {
				t.Fatalf("KV = %+v, want Matched %v, Credit %v", q, tc.wantMatched, tc.wantCredit)
			}
			if tc.credit && (len(idx.weights) != 1 || idx.weights[0] != w) {
				t.Fatalf("asked with weights %v, want %v once", idx.weights, w)
			}
			if !tc.credit && len(idx.weights) != 0 {
				t.Fatalf("the tiered lookup was asked without WithKVCredit")
			}
			if c := q.Credited("r1"); tc.credit && c != 1.2 {
				t.Fatalf("Credited(r1) = %v", c)
			}
			if want := map[string]int{"r0": 2, "r1": 2}; tc.credit && !mapsEqual(q.Reusable, want) {
				t.Fatalf("Reusable = %v, want %v", q.Reusable, want)
			}
		})
	}
}
