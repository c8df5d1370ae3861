package scheduler

import (
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/prefix"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func newSched(t testing.TB, seed uint64) (*Scheduler, *prometheus.Registry, *clock) {
	t.Helper()
	clk := &clock{t: time.Unix(1_000_000, 0)}
	cfg := DefaultConfig()
	cfg.Rand, cfg.Now = NewRand(seed), clk.Now
	reg := prometheus.NewRegistry()
	s, err := New(cfg, slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	return s, reg, clk
}

// c builds a candidate: id, waiting, running, in-flight.
func c(id string, waiting, running float64, inflight int64) Candidate {
	return Candidate{Key: Key{ID: id, UID: 1}, Waiting: waiting, Running: running, Inflight: inflight}
}

func ids(cs []Candidate) string {
	var out []string
	for _, x := range cs {
		out = append(out, x.Key.ID)
	}
	return strings.Join(out, ",")
}

func TestFilters(t *testing.T) {
	with := func(x Candidate, f func(*Candidate)) Candidate { f(&x); return x }
	open := func(x *Candidate) { x.Breaker = BreakerCoolingDown }
	due := func(x *Candidate) { x.Breaker = BreakerProbeDue }
	sat := func(x *Candidate) { x.Saturated = true }
	fullKV := func(x *Candidate) { x.KVUsage = 0.95 }
	holds := func(x *Candidate) { x.HasAdapter = true }
	tests := []struct {
		name    string
		f       Filter
		adapter string
		in      []Candidate
		want    string
	}{
		{"breaker: drops open", BreakerOpen(), "", []Candidate{with(c("a", 0, 0, 0), open), c("b", 0, 0, 0)}, "b"},
		{"breaker: keeps a due probe", BreakerOpen(), "", []Candidate{with(c("a", 0, 0, 0), due), c("b", 0, 0, 0)}, "a,b"},
		{"breaker: all open, none due", BreakerOpen(), "", []Candidate{with(c("a", 0, 0, 0), open)}, ""},
		{"breaker: all open, keeps the due", BreakerOpen(), "", []Candidate{with(c("a", 0, 0, 0), open), with(c("b", 0, 0, 0), due)}, "b"},
		{"pool: keeps headroom", PoolPriority(4, 0.9), "", []Candidate{c("a", 4, 0, 0), c("b", 3, 0, 0), with(c("c", 0, 0, 0), fullKV), with(c("d", 0, 0, 0), sat)}, "b"},
		{"pool: none qualify, keeps all", PoolPriority(4, 0.9), "", []Candidate{c("a", 9, 0, 0), with(c("b", 0, 0, 0), sat)}, "a,b"},
		{"adapter: base model untouched", AdapterAffinity(4, 0.9), "", []Candidate{c("a", 0, 0, 0), c("b", 0, 0, 0)}, "a,b"},
		{"adapter: holders with headroom", AdapterAffinity(4, 0.9), "lora", []Candidate{with(c("a", 9, 0, 0), holds), with(c("b", 0, 0, 0), holds), c("c", 0, 0, 0)}, "b"},
		{"adapter: busy holders over non-holders", AdapterAffinity(4, 0.9), "lora", []Candidate{with(c("a", 9, 0, 0), holds), c("c", 0, 0, 0)}, "a"},
		{"adapter: no holder, all", AdapterAffinity(4, 0.9), "lora", []Candidate{c("a", 0, 0, 0), c("b", 9, 0, 0)}, "a,b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.f.Filter(&Request{Adapter: tt.adapter}, tt.in, nil)
			if ids(got) != tt.want {
				t.Fatalf("kept %q, want %q", ids(got), tt.want)
			}
		})
	}
}

func TestStatelessScorers(t *testing.T) {
	kvAt := func(x Candidate, u float64) Candidate { x.KVUsage = u; return x }
	w := func(x Candidate, wt float64) Candidate { x.Weight = wt; return x }
	stale := c("s", 0, 0, 0)
	stale.Saturated = true
	tests := []struct {
		name string
		sc   Scorer
		in   []Candidate
		want []float64
	}{
		{"queue", Queue(4), []Candidate{c("a", 0, 0, 0), c("b", 2, 0, 0), c("c", 9, 0, 0), stale}, []float64{1, 0.5, 0, 0}},
		{"kv", KV(0.8), []Candidate{kvAt(c("a", 0, 0, 0), 0), kvAt(c("b", 0, 0, 0), 0.4), kvAt(c("c", 0, 0, 0), 0.9), stale}, []float64{1, 0.5, 0, 0}},
		{"inflight", Inflight(8), []Candidate{c("a", 0, 0, 0), c("b", 0, 0, 4), c("c", 0, 0, 20)}, []float64{1, 0.5, 0}},
		{"weight", Weight(), []Candidate{w(c("a", 0, 0, 0), 2), w(c("b", 0, 0, 0), 1), w(c("c", 0, 0, 0), 0)}, []float64{1, 0.5, 0.5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := make([]float64, len(tt.in))
			tt.sc.Score(&Request{}, tt.in, out)
			if !slices.Equal(out, tt.want) {
				t.Fatalf("scores %v, want %v", out, tt.want)
			}
		})
	}
}

func TestImbalanced(t *testing.T) {
	tests := []struct {
		name  string
		loads []float64
		want  bool
	}{
		{"one replica", []float64{50}, false},
		{"equal", []float64{5, 5, 5}, false},
		{"ratio without gap", []float64{2, 0, 0}, false},
		{"gap without ratio", []float64{14, 10, 10}, false},
		{"lopsided", []float64{8, 1, 1, 2}, true},
		{"two hot", []float64{9, 9, 1, 1}, true},
		{"exactly 1.5 x mean is not over", []float64{6, 2, 4}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cs []Candidate
			for i, l := range tt.loads {
				cs = append(cs, c(fmt.Sprint(i), l, 0, 0))
			}
			if got := DefaultImbalance().Imbalanced(cs); got != tt.want {
				t.Fatalf("Imbalanced = %v, want %v", got, tt.want)
			}
			// Hot marks a candidate exactly when the guard fires, and
			// only the ones over both bounds.
			hot := DefaultImbalance().Hot(cs)
			if (hot != nil) != tt.want {
				t.Fatalf("Hot = %v with Imbalanced %v", hot, tt.want)
			}
			for i, h := range hot {
				if want := tt.loads[i] == slices.Max(tt.loads); h != want {
					t.Fatalf("Hot = %v: candidate %d (load %v) hot %v", hot, i, tt.loads[i], h)
				}
			}
		})
	}
}

func TestPrefixScorer(t *testing.T) {
	sys := strings.Repeat("You are a helpful assistant. ", 10)
	h := func(s string) []uint64 { return prefix.Hashes(nil, s, prefix.DefaultChunk, 0) }
	tests := []struct {
		name     string
		sent     [][2]string // prompt, replica
		prompt   string
		cands    []Candidate
		want     string // "rv": rendezvous on the first chunk
		decision string
	}{
		{"no prompt", nil, "short", []Candidate{c("a", 0, 0, 0), c("b", 0, 0, 0)}, "", DecisionNoPrompt},
		{"unseen: rendezvous", nil, sys + "q1", []Candidate{c("a", 0, 0, 0), c("b", 0, 0, 0), c("c", 0, 0, 0)}, "rv", DecisionMiss},
		{"hit", [][2]string{{sys + "q1", "b"}}, sys + "q2", []Candidate{c("a", 0, 0, 0), c("b", 0, 0, 0)}, "b", DecisionHit},
		{"hit on a replica no longer a candidate", [][2]string{{sys, "z"}}, sys, []Candidate{c("a", 0, 0, 0), c("b", 0, 0, 0)}, "rv", DecisionMiss},
		{"guard: lopsided load silences it", [][2]string{{sys, "b"}}, sys, []Candidate{c("a", 0, 0, 0), c("b", 9, 0, 0), c("c", 0, 0, 0)}, "", DecisionLoadOverride},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, reg, _ := newSched(t, 1)
			sc := s.Prefix()
			for _, x := range tt.sent {
				sc.(Observer).Observe(&Request{Prefix: h(x[0])}, &Candidate{Key: Key{ID: x[1], UID: 1}})
			}
			r := &Request{Prefix: h(tt.prompt)}
			out := make([]float64, len(tt.cands))
			sc.Score(r, tt.cands, out)
			want := tt.want
			if want == "rv" {
				want = tt.cands[Rendezvous(r.Prefix[0], tt.cands, nil)].Key.ID
			}
			got := ""
			for i, v := range out {
				if v == 1 {
					got = tt.cands[i].Key.ID
				}
			}
			if got != want {
				t.Fatalf("prefix replica %q, want %q", got, want)
			}
			if testkit.Metric(t, reg, "llmgw_prefix_decisions_total", testkit.Labels{"decision": tt.decision}) != 1 {
				t.Fatalf("decision %s not counted", tt.decision)
			}
		})
	}
}

func TestLoadScorer(t *testing.T) {
	s, _, clk := newSched(t, 1)
	sc := s.Load(30)
	cands := []Candidate{c("a", 0, 0, 0), c("b", 0, 0, 0), c("c", 0, 0, 0)}
	out := make([]float64, 3)
	sc.Score(&Request{}, cands, out)
	if !slices.Equal(out, []float64{1, 1, 1}) {
		t.Fatalf("nothing sent: %v", out)
	}
	for range 4 {
		sc.(Observer).Observe(&Request{}, &cands[0])
	}
	sc.(Observer).Observe(&Request{}, &cands[1])
	sc.(Observer).Observe(&Request{}, &cands[1])
	clear(out)
	sc.Score(&Request{}, cands, out)
	if !slices.Equal(out, []float64{0, 0.5, 1}) {
		t.Fatalf("after sends: %v", out)
	}
	clk.Advance(31 * time.Second)
	clear(out)
	sc.Score(&Request{}, cands, out)
	if !slices.Equal(out, []float64{1, 1, 1}) {
		t.Fatalf("after the window: %v", out)
	}
}

// seq is a Rand returning fixed draws, for pickers' table tests.
type seq struct {
	ints   []int
	floats []float64
}

func (s *seq) IntN(n int) int {
	v := s.ints[0] % n
	s.ints = s.ints[1:]
	return v
}
func (s *seq) Float64() float64 { v := s.floats[0]; s.floats = s.floats[1:]; return v }

func TestPickers(t *testing.T) {
	three := make([]Candidate, 3)
	tests := []struct {
		name   string
		p      func(Rand) Picker
		scores []float64
		rnd    *seq
		want   int
	}{
		{"max: highest", MaxScore, []float64{0.2, 0.9, 0.5}, &seq{}, 1},
		{"max: tie drawn (keep later)", MaxScore, []float64{0.9, 0.9, 0.5}, &seq{ints: []int{0}}, 1},
		{"max: tie drawn (keep first)", MaxScore, []float64{0.9, 0.9, 0.5}, &seq{ints: []int{1}}, 0},
		// weights e^-7, 1, e^-4: a tiny first draw takes 0, a last one from
		// the rest takes 2, which beats 0.
		{"p2c: better of the pair", P2C, []float64{0.2, 0.9, 0.5}, &seq{floats: []float64{0.00005, 0.995}}, 2},
		{"p2c: the favourite is drawn first", P2C, []float64{0.2, 0.9, 0.5}, &seq{floats: []float64{0.5, 0.01}}, 1},
		{"p2c: tie drawn", P2C, []float64{0.5, 0.5, 0.5}, &seq{floats: []float64{0, 0}, ints: []int{1}}, 1},
		{"softmax: low draw, first", func(r Rand) Picker { return Softmax(0.2, r) }, []float64{0.2, 0.9, 0.5}, &seq{floats: []float64{0}}, 0},
		{"softmax: high draw, last", func(r Rand) Picker { return Softmax(0.2, r) }, []float64{0.2, 0.9, 0.5}, &seq{floats: []float64{0.999}}, 2},
		{"softmax: mid draw, the favourite", func(r Rand) Picker { return Softmax(0.2, r) }, []float64{0.2, 0.9, 0.5}, &seq{floats: []float64{0.5}}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.p(tt.rnd).Pick(&Request{}, three, tt.scores); got != tt.want {
				t.Fatalf("Pick = %d, want %d", got, tt.want)
			}
		})
	}
	rr := RoundRobin()
	var got []int
	for range 4 {
		got = append(got, rr.Pick(&Request{}, three, nil))
	}
	if !slices.Equal(got, []int{0, 1, 2, 0}) {
		t.Fatalf("round robin %v", got)
	}
}

// TestBurstSpreads sends 100 requests at once (no completions between
// them) over equal idle replicas: the router's own in-flight count and the
// random tie-breaks must spread them, in every profile.
func TestBurstSpreads(t *testing.T) {
	for _, name := range Profiles {
		t.Run(name, func(t *testing.T) {
			s, _, _ := newSched(t, 7)
			p, err := s.Build(name, nil)
			if err != nil {
				t.Fatal(err)
			}
			cands := make([]Candidate, 4)
			for i := range cands {
				cands[i] = c(fmt.Sprint("r", i), 0, 0, 0)
			}
			for range 100 {
				i := s.Pick(p, &Request{}, cands)
				s.Observe(p, &Request{}, cands[i])
				cands[i].Inflight++ // the endpoint's Acquire
			}
			lo, hi := int64(math.MaxInt64), int64(0)
			for _, x := range cands {
				lo, hi = min(lo, x.Inflight), max(hi, x.Inflight)
			}
			if hi > 35 || lo < 15 {
				t.Fatalf("burst of 100 over 4 replicas landed %v", cands)
			}
		})
	}
}

// TestRoutersAgree: two schedulers that never talked, with different
// randomness, place unseen sessions and prefixes on the same replica.
func TestRoutersAgree(t *testing.T) {
	a, _, _ := newSched(t, 1)
	b, _, _ := newSched(t, 2)
	cands := make([]Candidate, 8)
	for i := range cands {
		cands[i] = Candidate{Key: Key{ID: fmt.Sprint("demo-", i), UID: uint64(100 + i)}}
	}
	pa, _ := a.Build("chat", &llmgwv1.ProfileOverrides{Picker: "max-score"})
	pb, _ := b.Build("chat", &llmgwv1.ProfileOverrides{Picker: "max-score"})
	spread := map[int]bool{}
	for i := range 50 {
		r := &Request{Session: fmt.Sprint("session-", i)}
		ia, ib := a.Pick(pa, r, cands), b.Pick(pb, r, cands)
		if ia != ib {
			t.Fatalf("session %d: router a chose %d, b chose %d", i, ia, ib)
		}
		spread[ia] = true
		r = &Request{Prefix: prefix.Hashes(nil, fmt.Sprintf("%080d", i), 64, 0)}
		if ia, ib := a.Pick(pa, r, cands), b.Pick(pb, r, cands); ia != ib {
			t.Fatalf("prefix %d: router a chose %d, b chose %d", i, ia, ib)
		}
	}
	if len(spread) < 6 {
		t.Fatalf("50 sessions used only %d of 8 replicas", len(spread))
	}
}

// TestChatFollowsSession: with the default chat profile (P2C), a session
// sticks to its replica while load allows.
func TestChatFollowsSession(t *testing.T) {
	s, _, _ := newSched(t, 3)
	p, _ := s.Build("chat", nil)
	cands := make([]Candidate, 4)
	for i := range cands {
		cands[i] = c(fmt.Sprint("r", i), 1, 1, 0)
	}
	r := &Request{Session: "s"}
	first := s.Pick(p, r, cands)
	s.Observe(p, r, cands[first])
	same := 0
	for range 100 {
		if s.Pick(p, r, cands) == first {
			same++
		}
	}
	if same < 90 {
		t.Fatalf("session stayed on its replica %d of 100 times", same)
	}
}

func TestProfiles(t *testing.T) {
	type ws = map[string]float64
	tests := []struct {
		name    string
		profile string
		o       *llmgwv1.ProfileOverrides
		weights ws
		picker  string
		err     string
	}{
		{"default is chat", "", nil, ws{"session": 3, "queue": 1, "kv": 1, "inflight": 1, "weight": 0.5, "prefix": 2}, "p2c", ""},
		{"chat", "chat", nil, ws{"session": 3, "queue": 1, "kv": 1, "inflight": 1, "weight": 0.5, "prefix": 2}, "p2c", ""},
		{"batch", "batch", nil, ws{"queue": 3, "kv": 1, "load": 1, "inflight": 1, "weight": 1}, "max-score", ""},
		{"long-context", "long-context", nil, ws{"kv": 3, "session": 2, "queue": 1, "inflight": 1, "prefix": 3}, "softmax", ""},
		{"debug", "debug", nil, ws{}, "round-robin", ""},
		{"override a weight, add a scorer, change the picker", "chat",
			&llmgwv1.ProfileOverrides{Weights: ws{"session": 5, "load": 2}, Picker: "max-score"},
			ws{"session": 5, "queue": 1, "kv": 1, "inflight": 1, "weight": 0.5, "prefix": 2, "load": 2}, "max-score", ""},
		{"unknown profile", "fast", nil, nil, "", "profile:"},
		{"unknown scorer", "chat", &llmgwv1.ProfileOverrides{Weights: ws{"latency": 1}}, nil, "", "profile_overrides.weights.latency:"},
		{"negative weight", "chat", &llmgwv1.ProfileOverrides{Weights: ws{"queue": -1}}, nil, "", "profile_overrides.weights.queue:"},
		{"NaN weight", "chat", &llmgwv1.ProfileOverrides{Weights: ws{"kv": math.NaN()}}, nil, "", "profile_overrides.weights.kv:"},
		{"unknown picker", "chat", &llmgwv1.ProfileOverrides{Picker: "best"}, nil, "", "profile_overrides.picker:"},
		{"kv ceiling", "chat", &llmgwv1.ProfileOverrides{KvCeiling: 1.5}, nil, "", "profile_overrides.kv_ceiling:"},
		{"session factor below 1", "chat", &llmgwv1.ProfileOverrides{SessionLoadFactor: 0.5}, nil, "", "profile_overrides.session_load_factor:"},
		{"negative target", "chat", &llmgwv1.ProfileOverrides{TargetWaiting: -2}, nil, "", "profile_overrides.target_waiting:"},
		{"unknown kv score", "chat", &llmgwv1.ProfileOverrides{KvScore: "cheap"}, nil, "", "profile_overrides.kv_score:"},
		{"negative queue weight", "chat", &llmgwv1.ProfileOverrides{KvQueueWeight: -1}, nil, "", "profile_overrides.kv_queue_weight:"},
		{"infinite queue weight", "chat", &llmgwv1.ProfileOverrides{KvQueueWeight: math.Inf(1)}, nil, "", "profile_overrides.kv_queue_weight:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _, _ := newSched(t, 1)
			p, err := s.Build(tt.profile, tt.o)
			if tt.err != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tt.err) {
					t.Fatalf("err = %v, want one naming %s", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := ws{}
			for _, w := range p.Scorers {
				got[w.Scorer.Name()] = w.Weight
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.weights) || p.Picker.Name() != tt.picker {
				t.Fatalf("weights %v picker %s, want %v %s", got, p.Picker.Name(), tt.weights, tt.picker)
			}
		})
	}
}

// TestProfileTier2Settings: kv_score and speculation reach the profile
// (the director reads Speculation, the Prefix scorer the score).
func TestProfileTier2Settings(t *testing.T) {
	off, on := false, true
	tests := []struct {
		name     string
		profile  string
		o        *llmgwv1.ProfileOverrides
		score    string
		spec     bool
		costUsed bool
	}{
		{"defaults", "chat", nil, DefaultKVScore, true, DefaultKVScore == KVScoreCost},
		{"cost", "chat", &llmgwv1.ProfileOverrides{KvScore: "cost"}, KVScoreCost, true, true},
		{"share, speculation off", "long-context", &llmgwv1.ProfileOverrides{KvScore: "share", Speculation: &off}, KVScoreShare, false, false},
		{"speculation on explicitly", "chat", &llmgwv1.ProfileOverrides{Speculation: &on}, DefaultKVScore, true, DefaultKVScore == KVScoreCost},
		{"a prefix scorer brought into batch takes the score", "batch",
			&llmgwv1.ProfileOverrides{KvScore: "cost", Weights: map[string]float64{"prefix": 1}}, KVScoreCost, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _, _ := newSched(t, 1)
			p, err := s.Build(tt.profile, tt.o)
			if err != nil {
				t.Fatal(err)
			}
			if p.KVScore != tt.score || p.Speculation != tt.spec {
				t.Fatalf("KVScore %q Speculation %v, want %q %v", p.KVScore, p.Speculation, tt.score, tt.spec)
			}
			for _, w := range p.Scorers {
				if ps, ok := w.Scorer.(*prefixScorer); ok && ps.cost != tt.costUsed {
					t.Fatalf("prefix scorer cost = %v, want %v", ps.cost, tt.costUsed)
				}
			}
		})
	}
}

func TestProfileForFallsBack(t *testing.T) {
	s, reg, _ := newSched(t, 1)
	m := &llmgwv1.Model{Name: "demo", Profile: "batch", ProfileOverrides: &llmgwv1.ProfileOverrides{Weights: map[string]float64{"nope": 1}}}
	p := s.ProfileFor(m)
	if p.Name != DefaultProfile || s.ProfileFor(m) != p {
		t.Fatalf("profile %s, want the cached default", p.Name)
	}
	if testkit.Metric(t, reg, "llmgw_router_profile_errors_total", testkit.Labels{"model": "demo"}) != 1 {
		t.Fatal("refused profile not counted")
	}
}

type badScorer struct{}

func (badScorer) Name() string { return "bad" }
func (badScorer) Score(_ *Request, _ []Candidate, out []float64) {
	out[0], out[1] = math.NaN(), 7
}

func TestScoresClampedAndCounted(t *testing.T) {
	s, reg, _ := newSched(t, 1)
	p := &Profile{Scorers: []WeightedScorer{{badScorer{}, 1}}, Picker: MaxScore(NewRand(1))}
	if got := s.Pick(p, &Request{}, []Candidate{c("a", 0, 0, 0), c("b", 0, 0, 0)}); got != 1 {
		t.Fatalf("Pick = %d, want the clamped 1", got)
	}
	if testkit.Metric(t, reg, "llmgw_router_scheduler_scores_clamped_total", testkit.Labels{"scorer": "bad"}) != 2 {
		t.Fatal("clamps not counted")
	}
}

func TestPickNoneAndRetain(t *testing.T) {
	s, _, _ := newSched(t, 1)
	p, _ := s.Build("chat", nil)
	shut := c("a", 0, 0, 0)
	shut.Breaker = BreakerCoolingDown
	if got := s.Pick(p, &Request{}, []Candidate{shut}); got != -1 {
		t.Fatalf("Pick over open breakers = %d, want -1", got)
	}
	if got := s.Pick(p, &Request{}, nil); got != -1 {
		t.Fatalf("Pick over nothing = %d", got)
	}
	r := &Request{Session: "s", Prefix: prefix.Hashes(nil, strings.Repeat("x", 128), 64, 0)}
	s.Observe(p, r, c("a", 0, 0, 0))
	s.Retain(func(k Key) bool { return k.ID != "a" })
	if s.tree.Len() != 0 || s.sessions.Len() != 0 {
		t.Fatalf("Retain left %d prefixes, %d sessions", s.tree.Len(), s.sessions.Len())
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"default", func(*Config) {}, ""},
		{"sessions", func(c *Config) { c.Sessions = 0 }, "scheduler_sessions:"},
		{"tree", func(c *Config) { c.TreeEntries = -1 }, "scheduler_tree_entries:"},
		{"ratio", func(c *Config) { c.Imbalance.Ratio = 0.5 }, "scheduler_imbalance_ratio:"},
		{"gap", func(c *Config) { c.Imbalance.MinGap = math.NaN() }, "scheduler_imbalance_min_gap:"},
		{"kv ratio", func(c *Config) { c.KVImbalance.Ratio = 0 }, "scheduler_kv_imbalance_ratio:"},
		{"kv gap", func(c *Config) { c.KVImbalance.MinGap = math.Inf(1) }, "scheduler_kv_imbalance_min_gap:"},
		{"eviction weight", func(c *Config) { c.KVPressure.EvictionWeight = math.NaN() }, "scheduler_kv_eviction_weight:"},
		{"eviction weight negative", func(c *Config) { c.KVPressure.EvictionWeight = -1 }, "scheduler_kv_eviction_weight:"},
		{"session reserve", func(c *Config) { c.KVPressure.SessionReserveTokens = -1 }, "scheduler_kv_session_reserve_tokens:"},
		{"session fill zero", func(c *Config) { c.KVPressure.SessionFill = 0 }, "scheduler_kv_session_fill:"},
		{"session fill over one", func(c *Config) { c.KVPressure.SessionFill = 1.5 }, "scheduler_kv_session_fill:"},
		{"pressure off", func(c *Config) { c.KVPressure.EvictionWeight, c.KVPressure.SessionReserveTokens = 0, 0 }, ""},
		{"every problem at once", func(c *Config) {
			c.Sessions, c.TreeEntries, c.Imbalance = 0, 0, Imbalance{Ratio: math.Inf(1), MinGap: -1}
		}, "scheduler_sessions: must be at least 1, got 0\nscheduler_tree_entries: must be at least 1, got 0\n" +
			"scheduler_imbalance_ratio: must be a finite number >= 1, got +Inf\nscheduler_imbalance_min_gap: must be a finite number >= 0, got -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tt.mutate(&cfg)
			err := cfg.Validate()
			if (err == nil) != (tt.want == "") || (err != nil && !strings.HasPrefix(err.Error(), tt.want)) {
				t.Fatalf("Validate = %v, want prefix %q", err, tt.want)
			}
		})
	}
}

// BenchmarkPick is one scheduling decision of the chat profile, with a
// session and a remembered prefix, over n replicas with varied load.
func BenchmarkPick(b *testing.B) {
	for _, n := range []int{16, 256, 1024} {
		b.Run(fmt.Sprint("replicas=", n), func(b *testing.B) {
			s, _, _ := newSched(b, 1)
			p, _ := s.Build("chat", nil)
			cands := make([]Candidate, n)
			for i := range cands {
				cands[i] = Candidate{Key: Key{ID: fmt.Sprint("demo-", i), UID: uint64(i + 1)},
					Waiting: float64(i % 5), Running: float64(i % 7), KVUsage: float64(i%10) / 10, Inflight: int64(i % 3), Weight: 1}
			}
			r := &Request{Session: "bench", Prefix: prefix.Hashes(nil, strings.Repeat("You are a helpful assistant. ", 40), 64, 128)}
			s.Observe(p, r, cands[n/2])
			b.ReportAllocs()
			for b.Loop() {
				if s.Pick(p, r, cands) < 0 {
					b.Fatal("no pick")
				}
			}
		})
	}
}
