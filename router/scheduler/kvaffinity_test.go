package scheduler

import (
	"slices"
	"strings"
	"testing"
	"time"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func TestKVAffinity(t *testing.T) {
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
		{"a new prefix: the rendezvous choice, no homes yet", q(map[string]int{"a": 1}), four(),
			func(cs []Candidate) string { return first(cs, "a", "b", "c", "d") }},
		{"one holder: it alone", q(map[string]int{"c": 60}), four(), func([]Candidate) string { return "c" }},
		{"the longest match wins over a copy that lost blocks", q(map[string]int{"b": 60, "d": 59}), four(),
			func([]Candidate) string { return "b" }},
		{"equal holders: the rendezvous choice", q(map[string]int{"a": 60, "b": 60, "c": 60}), four(),
			func(cs []Candidate) string { return first(cs, "a", "b", "c") }},
		{"a hot holder is passed over for the other", q(map[string]int{"a": 60, "b": 30}), busy(four(), "a", 20),
			func([]Candidate) string { return "b" }},
		{"the only holder hot: placed as new among the others", q(map[string]int{"a": 60}), busy(four(), "a", 20),
			func(cs []Candidate) string { return first(cs, "b", "c", "d") }},
		{"busy but not past the KV guard: still the holder", q(map[string]int{"a": 60}), busy(four(), "a", 6),
			func([]Candidate) string { return "a" }},
		{"an untrusted candidate: all", &KVQuery{Total: 60, MinBlocks: 2, Matched: map[string]int{"a": 60}, Untrusted: map[string]bool{"d": true}},
			four(), func([]Candidate) string { return "a,b,c,d" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _, _ := newSched(t, 1) // no homes from another case
			r := &Request{KV: tt.kv, Prefix: []uint64{key}}
			if got, want := ids(s.KVAffinity().Filter(r, tt.in, nil)), tt.want(tt.in); got != want {
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
		{"chat", nil, true},
		{"long-context", nil, true},
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

// TestKVAffinityPlacesNewPrefixes: a prefix no replica holds goes to the
// replica home to the fewest live prefixes (rendezvous breaking ties) and
// is recorded there at once, so the rest of its burst follows it before
// the index knows; a hot home is left for the next; homes expire after
// the window and go with their replica.
func TestKVAffinityPlacesNewPrefixes(t *testing.T) {
	s, _, clk := newSched(t, 1)
	f := s.KVAffinity()
	cands := func(hot ...string) []Candidate {
		cs := []Candidate{c("a", 0, 1, 1), c("b", 0, 1, 1), c("c", 0, 1, 1)}
		for i := range cs {
			for _, h := range hot {
				if cs[i].Key.ID == h {
					cs[i].Inflight = 20
				}
			}
		}
		return cs
	}
	// rv is rendezvous hashing's choice for prefix among ids.
	rv := func(prefix uint64, ids ...string) string {
		cs := cands()
		i := Rendezvous(prefix, cs, func(c *Candidate) bool { return slices.Contains(ids, c.Key.ID) })
		return cs[i].Key.ID
	}
	hit := func(prefix uint64, on string) {
		t.Helper()
		r := &Request{KV: &KVQuery{Total: 10, MinBlocks: 2, Matched: map[string]int{on: 10}}, Prefix: []uint64{prefix}}
		if got := ids(f.Filter(r, cands(), nil)); got != on {
			t.Fatalf("hit of %d kept %q, want %q", prefix, got, on)
		}
	}
	miss := func(prefix uint64, hot ...string) string {
		r := &Request{KV: &KVQuery{Total: 10, MinBlocks: 2, Matched: map[string]int{}}, Prefix: []uint64{prefix}}
		return ids(f.Filter(r, cands(hot...), nil))
	}
	home := rv(9, "a", "b", "c")
	if got := miss(9); got != home {
		t.Fatalf("no homes yet: kept %q, want the rendezvous choice %q", got, home)
	}
	others := slices.DeleteFunc([]string{"a", "b", "c"}, func(id string) bool { return id == home })
	hit(1, home)
	hit(2, home)
	if got := miss(9); got != home {
		t.Fatalf("prefix 9 again before the index knows it: kept %q, want its home %q", got, home)
	}
	second := rv(10, others...)
	if got := miss(10); got != second {
		t.Fatalf("homes %s:3: a new prefix kept %q, want %q (the rendezvous choice of the others)", home, got, second)
	}
	third := slices.DeleteFunc(others, func(id string) bool { return id == second })[0]
	if got := miss(11); got != third {
		t.Fatalf("homes %s:3 %s:1: kept %q, want %q", home, second, got, third)
	}
	if got := miss(9, home); got == home || got == "" || strings.Contains(got, ",") {
		t.Fatalf("prefix 9 with its home hot: kept %q, want one other replica", got)
	}
	clk.Advance(homesWindow + time.Second)
	if got, want := miss(20), rv(20, "a", "b", "c"); got != want {
		t.Fatalf("after the window no home counts: kept %q, want %q", got, want)
	}
	gone := rv(20, "a", "b", "c")
	s.Retain(func(k Key) bool { return k.ID != gone })
	if k, ok := s.homes.get(20); ok {
		t.Fatalf("prefix 20's home %s retained away, still recorded as %v", gone, k)
	}
}

// TestKVAffinityBeforeHeadroom: in the default chat profile a tier-2 hit
// goes to its primary even when the headroom filter would have dropped it
// (4 waiting, its KV blocks 95 % in use) but the KV guard does not call it
// hot; with affinity off the headroom filter keeps it out, as before.
func TestKVAffinityBeforeHeadroom(t *testing.T) {
	off := false
	for _, tt := range []struct {
		name string
		o    *llmgwv1.ProfileOverrides
		want func(cands []Candidate, i int) bool
	}{
		{"default: the primary", nil, func(cands []Candidate, i int) bool { return cands[i].Key.ID == "a" }},
		{"affinity off: one with headroom", &llmgwv1.ProfileOverrides{KvAffinity: &off},
			func(cands []Candidate, i int) bool { return cands[i].Key.ID != "a" }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, _, _ := newSched(t, 1)
			p, err := s.Build("chat", tt.o)
			if err != nil {
				t.Fatal(err)
			}
			for n := range 20 {
				cands := []Candidate{c("a", 4, 2, 2), c("b", 0, 1, 1), c("c", 0, 1, 1), c("d", 0, 1, 1)}
				cands[0].KVUsage = 0.95
				r := &Request{KV: &KVQuery{Total: 40, MinBlocks: 2, Matched: map[string]int{"a": 40}}, Prefix: []uint64{uint64(n + 1)}}
				if i := s.Pick(p, r, cands); i < 0 || !tt.want(cands, i) {
					t.Fatalf("request %d: picked %d of %s", n, i, ids(cands))
				}
			}
		})
	}
}

// TestKVAffinityOffloadTieKeepsHome: holders that tie at the best credit
// holding none of the prompt on the GPU (each has it in its CPU tier only:
// every replica that ever computed a prefix keeps it there, written
// through) leave the prefix on its live home when that is one of them, as
// a prefix no cool replica holds stays on its home (place); only without a
// home among them does rendezvous choose. Rendezvous there would move each
// group, as its GPU copy goes, to its hash's choice among all the
// replicas that ever held it — piling groups by hash where place spread
// them. A tie of GPU holders is still rendezvous's, so routers that never
// talked agree.
func TestKVAffinityOffloadTieKeepsHome(t *testing.T) {
	const key = uint64(42)
	four := []Candidate{c("a", 0, 1, 1), c("b", 0, 1, 1), c("c", 0, 1, 1), c("d", 0, 1, 1)}
	// rv is the rendezvous choice for key among a and b, other the one it
	// does not choose: the home under test.
	rv, other := "a", "b"
	if rank(key, &four[1]) > rank(key, &four[0]) {
		rv, other = "b", "a"
	}
	cpuOnly := func() *KVQuery {
		return &KVQuery{Total: 60, MinBlocks: 2, Matched: map[string]int{},
			Credit: map[string]float64{"a": 48, "b": 48}, Reusable: map[string]int{"a": 60, "b": 60}}
	}
	tests := []struct {
		name string
		kv   *KVQuery
		home string // "" for none
		// others are the homes of other prefixes, by replica: the live
		// prefixes each replica is home to.
		others map[string]int
		want   string
	}{
		{"CPU-only tie, home among them: the home", cpuOnly(), other, nil, other},
		{"CPU-only tie, home among them: the home, however many it is home to", cpuOnly(), other, map[string]int{other: 3}, other},
		{"CPU-only tie, no home: rendezvous", cpuOnly(), "", nil, rv},
		{"CPU-only tie, home elsewhere: rendezvous", cpuOnly(), "c", nil, rv},
		// A prefix idle past the homes window comes back to the holder
		// home to fewer live prefixes, as place spreads a new one, not to
		// rendezvous's choice, which may be home to the prefix that came
		// back with it.
		{"CPU-only tie, no home: the holder home to fewer prefixes", cpuOnly(), "", map[string]int{rv: 1}, other},
		{"CPU-only tie, home elsewhere: the holder home to fewer prefixes", cpuOnly(), "c", map[string]int{rv: 2, other: 1}, other},
		{"CPU-only tie, holders home to as many: rendezvous", cpuOnly(), "", map[string]int{"a": 1, "b": 1, "c": 3}, rv},
		{"GPU tie: rendezvous, whatever this router's home",
			&KVQuery{Total: 60, MinBlocks: 2, Matched: map[string]int{"a": 60, "b": 60},
				Credit: map[string]float64{"a": 60, "b": 60}}, other, nil, rv},
		{"GPU tie: rendezvous, whatever the homes' counts",
			&KVQuery{Total: 60, MinBlocks: 2, Matched: map[string]int{"a": 60, "b": 60},
				Credit: map[string]float64{"a": 60, "b": 60}}, "", map[string]int{rv: 3}, rv},
		{"a GPU part beats the home's CPU-only copy",
			&KVQuery{Total: 60, MinBlocks: 2, Matched: map[string]int{rv: 1},
				Credit: map[string]float64{rv: 48.2, other: 48}}, other, nil, rv},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _, _ := newSched(t, 1)
			if tt.home != "" {
				s.homes.set(key, Key{ID: tt.home, UID: 1})
			}
			k := key
			for id, n := range tt.others {
				for range n {
					k++
					s.homes.set(k, Key{ID: id, UID: 1})
				}
			}
			r := &Request{KV: tt.kv, Prefix: []uint64{key}}
			if got := ids(s.KVAffinity().Filter(r, slices.Clone(four), nil)); got != tt.want {
				t.Fatalf("kept %q, want %q", got, tt.want)
			}
		})
	}
}
