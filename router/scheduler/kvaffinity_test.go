package scheduler

import (
	"testing"
	"time"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func TestKVAffinity(t *testing.T) {
	s, _, _ := newSched(t, 1)
	f := s.KVAffinity()
	four := func() []Candidate {
		return []Candidate{c("a", 0, 1, 1), c("b", 0, 1, 1), c("c", 0, 1, 1), c("d", 0, 1, 1)}
	}
	busy := func(cs []Candidate, id string, load int64) []Candidate {
		for i := range cs {
			if cs[i].Key.ID == id {
				cs[i].Inflight = load
			}
		}
		return cs
	}
	q := func(matched map[string]int) *KVQuery { return &KVQuery{Total: 60, MinBlocks: 2, Matched: matched} }
	key := uint64(42)
	// The rendezvous order of the four for key, so the cases say "the
	// higher-ranked holder" without hard-coding the hash.
	first := func(cs []Candidate, among ...string) string {
		best := ""
		for i := range cs {
			for _, id := range among {
				if cs[i].Key.ID == id && (best == "" || rank(key, &cs[i]) > rank(key, &cs[indexByID(cs, best)])) {
					best = id
				}
			}
		}
		return best
	}
	tests := []struct {
		name string
		kv   *KVQuery
		in   []Candidate
		want func(cs []Candidate) string
	}{
		{"no tier-2 answer: all", nil, four(), func([]Candidate) string { return "a,b,c,d" }},
		{"a fallback: all", &KVQuery{Fallback: KVTokenizeTimeout}, four(), func([]Candidate) string { return "a,b,c,d" }},
		{"a new prefix: all", q(map[string]int{"a": 1}), four(), func([]Candidate) string { return "a,b,c,d" }},
		{"one holder: it alone", q(map[string]int{"c": 60}), four(), func([]Candidate) string { return "c" }},
		{"the longest match wins over a copy that lost blocks", q(map[string]int{"b": 60, "d": 59}), four(),
			func([]Candidate) string { return "b" }},
		{"equal holders: the rendezvous choice", q(map[string]int{"a": 60, "b": 60, "c": 60}), four(),
			func(cs []Candidate) string { return first(cs, "a", "b", "c") }},
		{"a hot holder is passed over for the other", q(map[string]int{"a": 60, "b": 30}), busy(four(), "a", 20),
			func([]Candidate) string { return "b" }},
		{"the only holder hot: all, load decides", q(map[string]int{"a": 60}), busy(four(), "a", 20),
			func([]Candidate) string { return "a,b,c,d" }},
		{"busy but not past the KV guard: still the holder", q(map[string]int{"a": 60}), busy(four(), "a", 6),
			func([]Candidate) string { return "a" }},
		{"an untrusted candidate: all", &KVQuery{Total: 60, MinBlocks: 2, Matched: map[string]int{"a": 60}, Untrusted: map[string]bool{"d": true}},
			four(), func([]Candidate) string { return "a,b,c,d" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &Request{KV: tt.kv, Prefix: []uint64{key}}
			if got, want := ids(f.Filter(r, tt.in, nil)), tt.want(tt.in); got != want {
				t.Fatalf("kept %q, want %q", got, want)
			}
		})
	}
}

func indexByID(cs []Candidate, id string) int {
	for i := range cs {
		if cs[i].Key.ID == id {
			return i
		}
	}
	return -1
}

// TestKVAffinityRoutersAgree: two schedulers that never talked send a
// prefix held by several replicas to the same one, and move it only when
// it turns hot.
func TestKVAffinityRoutersAgree(t *testing.T) {
	s1, _, _ := newSched(t, 1)
	s2, _, _ := newSched(t, 2)
	on := true
	p1, _ := s1.Build("chat", &llmgwv1.ProfileOverrides{KvAffinity: &on})
	p2, _ := s2.Build("chat", &llmgwv1.ProfileOverrides{KvAffinity: &on})
	cands := []Candidate{c("a", 0, 2, 2), c("b", 0, 2, 2), c("c", 0, 2, 2), c("d", 0, 2, 2)}
	for n := range 50 {
		kv := &KVQuery{Total: 40, MinBlocks: 2, Matched: map[string]int{"a": 40, "b": 40, "d": 40}}
		r := &Request{KV: kv, Prefix: []uint64{uint64(n)}}
		i1, i2 := s1.Pick(p1, r, cands), s2.Pick(p2, r, cands)
		if i1 != i2 || cands[i1].Key.ID == "c" {
			t.Fatalf("prefix %d: routers chose %s and %s (c holds nothing)", n, cands[i1].Key.ID, cands[i2].Key.ID)
		}
	}
}

func TestKVAffinityOverride(t *testing.T) {
	off, on := false, true
	tests := []struct {
		profile string
		o       *llmgwv1.ProfileOverrides
		want    bool
	}{
		{"chat", nil, false},
		{"long-context", nil, false},
		{"chat", &llmgwv1.ProfileOverrides{KvAffinity: &on}, true},
		{"long-context", &llmgwv1.ProfileOverrides{KvAffinity: &on}, true},
		{"chat", &llmgwv1.ProfileOverrides{KvAffinity: &off}, false},
		{"batch", &llmgwv1.ProfileOverrides{KvAffinity: &on}, false},
		{"debug", nil, false},
	}
	for _, tt := range tests {
		s, _, _ := newSched(t, 1)
		p, err := s.Build(tt.profile, tt.o)
		if err != nil {
			t.Fatal(err)
		}
		has := false
		for _, f := range p.Filters {
			has = has || f.Name() == "kv-affinity"
		}
		if has != tt.want {
			t.Errorf("%s %v: kv-affinity filter %v, want %v", tt.profile, tt.o, has, tt.want)
		}
	}
}

// TestKVAffinityPlacesNewPrefixes: a prefix no replica holds goes among
// the replicas home to the fewest live prefixes, its own old home not
// counted, and homes expire after the window.
func TestKVAffinityPlacesNewPrefixes(t *testing.T) {
	s, _, clk := newSched(t, 1)
	f := s.KVAffinity()
	cands := func() []Candidate {
		return []Candidate{c("a", 0, 1, 1), c("b", 0, 1, 1), c("c", 0, 1, 1)}
	}
	hit := func(prefix uint64, on string) {
		t.Helper()
		r := &Request{KV: &KVQuery{Total: 10, MinBlocks: 2, Matched: map[string]int{on: 10}}, Prefix: []uint64{prefix}}
		if got := ids(f.Filter(r, cands(), nil)); got != on {
			t.Fatalf("hit of %d kept %q, want %q", prefix, got, on)
		}
	}
	miss := func(prefix uint64) string {
		r := &Request{KV: &KVQuery{Total: 10, MinBlocks: 2, Matched: map[string]int{}}, Prefix: []uint64{prefix}}
		return ids(f.Filter(r, cands(), nil))
	}
	if got := miss(9); got != "a,b,c" {
		t.Fatalf("no homes yet: kept %q", got)
	}
	hit(1, "a")
	hit(2, "a")
	hit(3, "b")
	if got := miss(9); got != "c" {
		t.Fatalf("homes a:2 b:1 c:0: a new prefix kept %q, want c", got)
	}
	hit(4, "c")
	if got := miss(9); got != "b,c" {
		t.Fatalf("homes a:2 b:1 c:1: kept %q, want b,c", got)
	}
	// Prefix 1 evicted from a and asked again: its own home does not count.
	if got := miss(1); got != "a,b,c" {
		t.Fatalf("re-placing prefix 1 (a:1 b:1 c:1 without it): kept %q", got)
	}
	clk.Advance(homesWindow + time.Second)
	hit(5, "a")
	if got := miss(9); got != "b,c" {
		t.Fatalf("after the window only prefix 5 on a counts: kept %q, want b,c", got)
	}
	s.Retain(func(k Key) bool { return k.ID != "a" })
	if got := miss(9); got != "a,b,c" {
		t.Fatalf("a retained away: kept %q", got)
	}
}
