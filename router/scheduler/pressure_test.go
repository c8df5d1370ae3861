package scheduler

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// pressureSched is newSched with kp as the cache-pressure rule.
func pressureSched(t *testing.T, kp KVPressure) (*Scheduler, *prometheus.Registry, *clock) {
	t.Helper()
	clk := &clock{t: time.Unix(1_000_000, 0)}
	cfg := DefaultConfig()
	cfg.Rand, cfg.Now, cfg.KVPressure = NewRand(1), clk.Now, kp
	reg := prometheus.NewRegistry()
	s, err := New(cfg, slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	return s, reg, clk
}

// withEvictions is the default with the eviction part on.
var withEvictions = KVPressure{EvictionWeight: 1, SessionReserveTokens: 4096, SessionFill: 0.9}

// caps gives each of ids a cache of n blocks.
func caps(n int, ids ...string) map[string]int {
	m := map[string]int{}
	for _, id := range ids {
		m[id] = n
	}
	return m
}

// TestKVPressureEvictions: the eviction rule, for requests without a
// session. While no cache would evict, the longest match stays the choice
// (as without the rule); once the longest match's cache is full, the
// blocks the request adds there count twice (once computed, once evicted)
// and a replica that adds them without evicting wins when that is cheaper.
func TestKVPressureEvictions(t *testing.T) {
	four := func() []Candidate {
		return []Candidate{c("a", 0, 1, 1), c("b", 0, 1, 1), c("c", 0, 1, 1), c("d", 0, 1, 1)}
	}
	tests := []struct {
		name     string
		kp       KVPressure
		q        KVQuery
		in       []Candidate
		want     string
		decision string // the pressure counter's label that counted, "" none
	}{
		{"capacities unknown: the longest match", withEvictions,
			KVQuery{Total: 100, MinBlocks: 2, Matched: map[string]int{"a": 30}, Held: map[string]int{"a": 1024}},
			four(), "a", ""},
		{"one replica's capacity unknown: the longest match", withEvictions,
			KVQuery{Total: 100, MinBlocks: 2, Matched: map[string]int{"a": 30}, Held: map[string]int{"a": 1024},
				Capacity: caps(1024, "a", "b", "c")},
			four(), "a", ""},
		{"room everywhere: the longest match", withEvictions,
			KVQuery{Total: 100, MinBlocks: 2, Matched: map[string]int{"a": 30, "b": 20}, Held: map[string]int{"a": 500, "b": 100},
				Capacity: caps(1024, "a", "b", "c", "d")},
			four(), "a", PressureKept},
		{"full primary, a few blocks to add: still the primary (12 < 68)", withEvictions,
			KVQuery{Total: 68, MinBlocks: 2, Matched: map[string]int{"a": 62}, Held: map[string]int{"a": 1024},
				Capacity: caps(1024, "a", "b", "c", "d")},
			four(), "a", PressureKept},
		{"full primary, a holder one block short with room: the holder with room (6 < 5 + 5)", withEvictions,
			KVQuery{Total: 68, MinBlocks: 2, Matched: map[string]int{"a": 63, "c": 62}, Held: map[string]int{"a": 1024, "c": 300},
				Capacity: caps(1024, "a", "b", "c", "d")},
			four(), "c", PressureEvictions},
		{"full primary holding a third of the prompt: an empty replica (140 > 100)", withEvictions,
			KVQuery{Total: 100, MinBlocks: 2, Matched: map[string]int{"a": 30}, Held: map[string]int{"a": 1024, "b": 1024, "c": 1024},
				Capacity: caps(1024, "a", "b", "c", "d")},
			four(), "d", PressureEvictions},
		{"the same with eviction weight 0 (the default): the longest match", DefaultKVPressure(),
			KVQuery{Total: 100, MinBlocks: 2, Matched: map[string]int{"a": 30}, Held: map[string]int{"a": 1024, "b": 1024, "c": 1024},
				Capacity: caps(1024, "a", "b", "c", "d")},
			four(), "a", ""},
		{"partly full: only the overflow counts (70 + 20 < 100)", withEvictions,
			KVQuery{Total: 100, MinBlocks: 2, Matched: map[string]int{"a": 30}, Held: map[string]int{"a": 974, "b": 1024, "c": 1024},
				Capacity: caps(1024, "a", "b", "c", "d")},
			four(), "a", PressureKept},
		{"the replica with room is hot: not chosen", withEvictions,
			KVQuery{Total: 100, MinBlocks: 2, Matched: map[string]int{"a": 30}, Held: map[string]int{"a": 1024, "b": 1024, "c": 1024},
				Capacity: caps(1024, "a", "b", "c", "d")},
			func() []Candidate { cs := four(); cs[3].Inflight = 20; return cs }(), "a", PressureKept},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, reg, _ := pressureSched(t, tt.kp)
			q := tt.q
			q.BlockSize = 16
			r := &Request{KV: &q, Prefix: []uint64{42}}
			if got := ids(s.KVAffinity().Filter(r, tt.in, nil)); got != tt.want {
				t.Fatalf("kept %q, want %q", got, tt.want)
			}
			for _, d := range []string{PressureKept, PressureEvictions, PressureSessionPlaced, PressureSessionOverfull} {
				want := 0.0
				if d == tt.decision {
					want = 1
				}
				if got := testutil.ToFloat64(s.m.pressure.WithLabelValues(d)); got != want {
					t.Errorf("llmgw_router_kv_pressure_decisions_total{decision=%q} = %v, want %v", d, got, want)
				}
			}
			_ = reg
		})
	}
}

// TestKVPressureSessions: the session rule. A session new to this router
// goes to the longest match while the sessions planned there, and it, fit
// the cache; else to the cheapest replica where it fits; else where the
// most room is planned. A session the router knows keeps its replica
// however full, and so does an unknown one whose context only the primary
// holds (a move would recompute more than one session's reserve).
func TestKVPressureSessions(t *testing.T) {
	four := func() []Candidate {
		return []Candidate{c("a", 0, 1, 1), c("b", 0, 1, 1), c("c", 0, 1, 1), c("d", 0, 1, 1)}
	}
	key := func(id string) Key { return Key{ID: id, UID: 1} }
	// 1,024-block caches, 4,096-token reserve (256 blocks of 16 tokens),
	// 0.9 fill: 921.6 blocks of sessions planned a replica, three sessions.
	capsAll := caps(1024, "a", "b", "c", "d")
	newSession := func(matched map[string]int) KVQuery {
		return KVQuery{Total: 68, MinBlocks: 2, BlockSize: 16, Matched: matched, Held: map[string]int{}, Capacity: capsAll}
	}
	tests := []struct {
		name     string
		kp       KVPressure
		q        KVQuery
		planned  map[string]int // sessions already planned per replica (of 256 blocks each)
		known    string         // the replica this router remembers the session on
		want     string
		decision string // the one pressure decision counted; "" none (the rule did not run)
	}{
		{"room at the primary: the primary", DefaultKVPressure(),
			newSession(map[string]int{"a": 62}), map[string]int{"a": 2}, "", "a", PressureKept},
		{"the primary planned full: an empty replica", DefaultKVPressure(),
			newSession(map[string]int{"a": 62}), map[string]int{"a": 3}, "", "", PressureSessionPlaced},
		{"the primary planned full: a replica also holding the shared prefix beats an empty one", DefaultKVPressure(),
			newSession(map[string]int{"a": 63, "c": 62}), map[string]int{"a": 3, "c": 2}, "", "c", PressureSessionPlaced},
		{"between equal matches, the most room", DefaultKVPressure(),
			newSession(map[string]int{"a": 62}), map[string]int{"a": 3, "b": 2, "c": 1, "d": 2}, "", "c", PressureSessionPlaced},
		{"every replica planned full: the most room", DefaultKVPressure(),
			newSession(map[string]int{"a": 62}), map[string]int{"a": 5, "b": 4, "c": 4, "d": 3}, "", "d", PressureSessionOverfull},
		{"a session this router knows: its replica, however full", DefaultKVPressure(),
			newSession(map[string]int{"a": 62}), map[string]int{"a": 6}, "a", "a", ""},
		{"an unknown session whose context the primary holds: stays", DefaultKVPressure(),
			KVQuery{Total: 300, MinBlocks: 2, BlockSize: 16, Matched: map[string]int{"a": 295}, Held: map[string]int{}, Capacity: capsAll},
			map[string]int{"a": 5}, "", "a", PressureKept},
		{"a remembered replica gone: placed as new", DefaultKVPressure(),
			newSession(map[string]int{"a": 62}), map[string]int{"a": 3}, "e", "", PressureSessionPlaced},
		{"reserve 0: the primary", KVPressure{EvictionWeight: 1, SessionFill: 0.9},
			newSession(map[string]int{"a": 62}), map[string]int{"a": 6}, "", "a", PressureKept},
		{"fill 1: a fourth session fits", KVPressure{EvictionWeight: 1, SessionReserveTokens: 4096, SessionFill: 1},
			newSession(map[string]int{"a": 62}), map[string]int{"a": 3}, "", "a", PressureKept},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _, _ := pressureSched(t, tt.kp)
			n := 0
			for id, k := range tt.planned {
				for range k {
					n++
					s.footprints.set(uint64(1000+n), key(id), 256, 68)
				}
			}
			if tt.known != "" {
				s.sessions.Observe([]uint64{sessionHash("s")}, key(tt.known))
			}
			q := tt.q
			r := &Request{Session: "s", KV: &q, Prefix: []uint64{42}}
			got := ids(s.KVAffinity().Filter(r, four(), nil))
			want := tt.want
			if want == "" { // the rendezvous choice among the empty replicas
				best := -1
				cs := four()
				for i := range cs {
					if tt.planned[cs[i].Key.ID] == 0 && (best < 0 || rank(sessionHash("s"), &cs[i]) > rank(sessionHash("s"), &cs[best])) {
						best = i
					}
				}
				want = cs[best].Key.ID
			}
			if got != want {
				t.Fatalf("kept %q, want %q", got, want)
			}
			for _, d := range []string{PressureKept, PressureEvictions, PressureSessionPlaced, PressureSessionOverfull} {
				want := 0.0
				if d == tt.decision {
					want = 1
				}
				if v := testutil.ToFloat64(s.m.pressure.WithLabelValues(d)); v != want {
					t.Errorf("llmgw_router_kv_pressure_decisions_total{decision=%q} = %v, want %v", d, v, want)
				}
			}
		})
	}
}

// TestKVPressureSessionBurst is issue 31's bench in miniature: eight
// sessions start at once on 1,024-block replicas; the first finds nothing
// held (a new prefix), the rest match only the shared system prompt,
// which one replica holds. Without the rule the seven go there (and
// their growing contexts then evict one another); with it no replica is
// planned more than three, each recorded at once, before any is
// accepted — the first too. Footprints expire after the window.
func TestKVPressureSessionBurst(t *testing.T) {
	for _, tt := range []struct {
		name    string
		kp      KVPressure
		wantMax int
	}{
		{"rule on", DefaultKVPressure(), 3},
		{"rule off: the seven after the first on a (the first too, when homes chose a)", KVPressure{SessionFill: 0.9}, 7},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, _, clk := pressureSched(t, tt.kp)
			per := map[string]int{}
			for i := range 8 {
				q := &KVQuery{Total: 68, MinBlocks: 2, BlockSize: 16, Matched: map[string]int{"a": 62},
					Held: map[string]int{"a": 62}, Capacity: caps(1024, "a", "b", "c", "d")}
				if i == 0 { // the first finds nothing held: a new prefix, placed by homes
					q.Matched, q.Held = map[string]int{}, map[string]int{}
				}
				r := &Request{Session: fmt.Sprint("bench-", i), KV: q, Prefix: []uint64{42}}
				kept := s.KVAffinity().Filter(r, []Candidate{c("a", 0, 0, 0), c("b", 0, 0, 0), c("c", 0, 0, 0), c("d", 0, 0, 0)}, nil)
				per[kept[0].Key.ID]++
			}
			top := 0
			for _, n := range per {
				top = max(top, n)
			}
			if top != tt.wantMax && !(tt.kp.SessionReserveTokens == 0 && top == 8 && per["a"] == 8) {
				t.Fatalf("sessions per replica %v: the most on one %d, want %d", per, top, tt.wantMax)
			}
			clk.t = clk.t.Add(footprintWindow + time.Second)
			if p := s.footprints.planned(0, nil); len(p) != 0 && tt.kp.SessionReserveTokens > 0 {
				t.Fatalf("footprints past the window: %v", p)
			}
		})
	}
}

// TestKVPressureObserveAndRetain: Observe records a session's footprint
// (its prompt or the reserve, the larger) where it went; Retain drops the
// footprints of replicas that are gone.
func TestKVPressureObserveAndRetain(t *testing.T) {
	s, _, _ := pressureSched(t, DefaultKVPressure())
	p, err := s.Build("chat", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		session string
		total   int
		on      string
	}{{"s1", 68, "a"}, {"s2", 400, "a"}, {"s3", 10, "b"}, {"", 500, "b"}} {
		r := &Request{Session: tt.session, KV: &KVQuery{Total: tt.total, BlockSize: 16}}
		s.Observe(p, r, c(tt.on, 0, 0, 0))
	}
	got := s.footprints.planned(0, nil)
	if got[Key{ID: "a", UID: 1}] != 256+400 || got[Key{ID: "b", UID: 1}] != 256 {
		t.Fatalf("planned %v, want a 656 (256 + 400), b 256 (no session: none)", got)
	}
	s.Retain(func(k Key) bool { return k.ID != "a" })
	if got := s.footprints.planned(0, nil); len(got) != 1 || got[Key{ID: "b", UID: 1}] != 256 {
		t.Fatalf("after Retain planned %v, want only b 256", got)
	}
}

// TestFootprintsPlanned: the room planned per replica. Fresh footprints
// (the index may not show their blocks yet) count in full; older ones at
// most what the replica's cache holds plus their expected growth, so a
// reset cache stops reserving room for the conversations it lost, while
// live ones whose contexts the cache holds keep theirs.
func TestFootprintsPlanned(t *testing.T) {
	a, b := Key{ID: "a", UID: 1}, Key{ID: "b", UID: 1}
	tests := []struct {
		name string
		// sessions on a: planned, prompt blocks each
		n, planned, prompt int
		age                time.Duration
		held               map[string]int
		want               int
	}{
		{"fresh, cache empty: in full", 3, 256, 68, time.Second, map[string]int{"a": 0}, 768},
		{"old, the cache holds their prompts: in full", 3, 256, 100, 10 * time.Second, map[string]int{"a": 362}, 768},
		{"old, the cache was reset: their growth only", 3, 256, 100, 10 * time.Second, map[string]int{"a": 0}, 468},
		{"old, finished sessions longer than the reserve, cache reset: nothing", 8, 262, 262, 10 * time.Second, map[string]int{"a": 0}, 0},
		{"old, partly evicted: what is held plus growth", 3, 256, 100, 10 * time.Second, map[string]int{"a": 100}, 568},
		{"old, the index says nothing of the replica: in full", 3, 256, 100, 10 * time.Second, nil, 768},
		{"past the window: gone", 3, 256, 100, footprintWindow + time.Second, map[string]int{"a": 1000}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := &clock{t: time.Unix(1_000_000, 0)}
			f := newFootprints(clk.Now)
			for i := range tt.n {
				f.set(uint64(i+1), a, tt.planned, tt.prompt)
			}
			f.set(99, b, 300, 300) // another replica's, and the session asking, left out
			clk.t = clk.t.Add(tt.age)
			got := f.planned(99, tt.held)
			if got[a] != tt.want {
				t.Fatalf("planned on a %d, want %d (all %v)", got[a], tt.want, got)
			}
			if got[b] != 0 {
				t.Fatalf("planned on b %d, want 0: the asking session is left out", got[b])
			}
		})
	}
}

// TestKVPressureKeepsCachedSessions: the eviction rule does not move a
// session this router knows while its replica still holds the session's
// last prompt, even where the arithmetic would (a short context whose
// shared prefix another replica holds with room); once part of it was
// evicted, the rule applies.
func TestKVPressureKeepsCachedSessions(t *testing.T) {
	tests := []struct {
		name       string
		lastPrompt int // blocks of the session's last prompt, sent to a
		matched    int // leading blocks a holds of the new prompt
		want       string
	}{
		{"its last prompt held: stays", 69, 68, "a"},
		{"its last prompt held to the block: stays", 68, 68, "a"},
		{"its tail evicted: moves where it evicts nothing", 90, 68, "c"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _, _ := pressureSched(t, withEvictions)
			a := Key{ID: "a", UID: 1}
			h := sessionHash("s")
			s.sessions.Observe([]uint64{h}, a)
			s.footprints.set(h, a, 256, tt.lastPrompt)
			// a is full: its 8 new blocks cost 16; c holds the shared 62
			// with room: 14.
			q := &KVQuery{Total: 76, MinBlocks: 2, BlockSize: 16, Matched: map[string]int{"a": tt.matched, "c": 62},
				Held: map[string]int{"a": 1024, "b": 1024, "c": 200, "d": 1024}, Capacity: caps(1024, "a", "b", "c", "d")}
			r := &Request{Session: "s", KV: q, Prefix: []uint64{42}}
			in := []Candidate{c("a", 0, 1, 1), c("b", 0, 1, 1), c("c", 0, 1, 1), c("d", 0, 1, 1)}
			if got := ids(s.KVAffinity().Filter(r, in, nil)); got != tt.want {
				t.Fatalf("kept %q, want %q", got, tt.want)
			}
		})
	}
}
