package bench

import (
	"math"
	"reflect"
	"strings"
	"testing"
)

func mustWorkload(t *testing.T, c WorkloadConfig) Workload {
	t.Helper()
	w, err := NewWorkload(c)
	if err != nil {
		t.Fatalf("NewWorkload(%+v): %v", c, err)
	}
	return w
}

// drain runs conversation n to its end, replying with a fixed answer per turn.
func drain(w Workload, n int) []Request {
	conv := w.Conversation(n)
	var out []Request
	for turn := 0; ; turn++ {
		req, ok := conv.Next()
		if !ok {
			return out
		}
		out = append(out, req)
		conv.Reply("answer "+strings.Repeat("x", turn), true)
	}
}

func TestWorkloadsAreDeterministicForASeed(t *testing.T) {
	for _, name := range WorkloadNames() {
		t.Run(name, func(t *testing.T) {
			if name == Replay {
				t.Skip("a replay's prompts are its capture's, whatever the seed (TestReplayPromptsShareWhatTheCaptureShared)")
			}
			cfg := WorkloadConfig{Name: name, Model: "m", Seed: 7, Adapters: []string{"a", "b", "c"}, PromptWords: 30, SystemWords: 40}
			a, b := mustWorkload(t, cfg), mustWorkload(t, cfg)
			cfg.Seed = 8
			other := mustWorkload(t, cfg)
			differs := false
			for n := range 20 {
				ra, rb := drain(a, n), drain(b, n)
				if !reflect.DeepEqual(ra, rb) {
					t.Fatalf("conversation %d differs between two workloads of one seed", n)
				}
				if len(ra) == 0 {
					t.Fatalf("conversation %d has no requests", n)
				}
				if !reflect.DeepEqual(ra, drain(other, n)) {
					differs = true
				}
			}
			if !differs {
				t.Fatal("another seed gave the same requests")
			}
		})
	}
}

func TestMultiTurnHistoryGrowsWithTheRealAnswers(t *testing.T) {
	w := mustWorkload(t, WorkloadConfig{Name: MultiTurn, Model: "m", Seed: 1, Turns: 4, Sessions: 3})
	if w.Live() != 3 {
		t.Fatalf("Live() = %d, want the 3 sessions", w.Live())
	}
	conv := w.Conversation(2)
	var prev Request
	for turn := range 4 {
		req, ok := conv.Next()
		if !ok {
			t.Fatalf("turn %d: conversation ended early", turn)
		}
		if req.SessionID == "" || (turn > 0 && req.SessionID != prev.SessionID) {
			t.Fatalf("turn %d: session id %q, previous %q", turn, req.SessionID, prev.SessionID)
		}
		// system + (user, assistant) per earlier turn + this user message
		if want := 1 + 2*turn + 1; len(req.Messages) != want {
			t.Fatalf("turn %d: %d messages, want %d", turn, len(req.Messages), want)
		}
		if turn > 0 {
			if !reflect.DeepEqual(req.Messages[:len(prev.Messages)], prev.Messages) {
				t.Fatalf("turn %d does not extend the previous turn's history", turn)
			}
			got := req.Messages[len(prev.Messages)]
			if got.Role != "assistant" || got.Content != "reply-"+string(rune('0'+turn-1)) {
				t.Fatalf("turn %d: message after history is %+v, want the real answer", turn, got)
			}
		}
		if last := req.Messages[len(req.Messages)-1]; last.Role != "user" || last.Content == "" {
			t.Fatalf("turn %d: last message %+v, want a new user message", turn, last)
		}
		conv.Reply("reply-"+string(rune('0'+turn)), true)
		prev = req
	}
	if _, ok := conv.Next(); ok {
		t.Fatal("a fifth turn of a four-turn session")
	}
	if w.Conversation(0).(*session).id == w.Conversation(1).(*session).id {
		t.Fatal("two sessions share an id")
	}
}

func TestMultiTurnDropsAFailedTurn(t *testing.T) {
	w := mustWorkload(t, WorkloadConfig{Name: MultiTurn, Model: "m", Turns: 3})
	conv := w.Conversation(0)
	first, _ := conv.Next()
	conv.Reply("", false)
	second, _ := conv.Next()
	if len(second.Messages) != len(first.Messages) {
		t.Fatalf("after a failed turn: %d messages, want %d (the failed user message dropped)", len(second.Messages), len(first.Messages))
	}
	for i := 1; i < len(second.Messages); i++ {
		if second.Messages[i].Role == second.Messages[i-1].Role {
			t.Fatalf("two %s messages in a row", second.Messages[i].Role)
		}
	}
}

func TestSharedPrefixGroupsShareTheirPrefix(t *testing.T) {
	w := mustWorkload(t, WorkloadConfig{Name: SharedPrefix, Model: "m", Seed: 3, Groups: 4, SystemWords: 200, PromptWords: 20})
	systems := map[string]int{}
	users := map[string]bool{}
	for n := range 200 {
		reqs := drain(w, n)
		if len(reqs) != 1 {
			t.Fatalf("conversation %d: %d requests, want 1", n, len(reqs))
		}
		m := reqs[0].Messages
		if len(m) != 2 || m[0].Role != "system" || m[1].Role != "user" {
			t.Fatalf("conversation %d: messages %v", n, m)
		}
		if got := len(strings.Fields(m[0].Content)); got != 200 {
			t.Fatalf("system prompt of %d words, want 200", got)
		}
		systems[m[0].Content]++
		users[m[1].Content] = true
	}
	if len(systems) != 4 {
		t.Fatalf("%d distinct system prompts over 200 requests, want the 4 groups", len(systems))
	}
	for _, c := range systems {
		if c < 20 {
			t.Fatalf("a group drawn %d times out of 200: not uniform", c)
		}
	}
	if len(users) < 195 {
		t.Fatalf("only %d distinct questions out of 200", len(users))
	}
}

func TestSharedPrefixHotShare(t *testing.T) {
	const n = 4000
	tests := []struct {
		name   string
		groups int
		hot    float64
		want0  float64 // expected share of group 0
	}{
		{"uniform", 5, 0, 0.2},
		{"80% hot", 5, 0.8, 0.8},
		{"all hot", 5, 1, 1},
		{"one group", 1, 0.5, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := WorkloadConfig{Name: SharedPrefix, Model: "m", Seed: 4, Groups: tt.groups, SystemWords: 30, PromptWords: 5, HotShare: tt.hot}
			w := mustWorkload(t, cfg)
			hot := w.(*sharedPrefix).systems[0]
			count := map[string]int{}
			for i := range n {
				count[drain(w, i)[0].Messages[0].Content]++
			}
			if got := float64(count[hot]) / n; math.Abs(got-tt.want0) > 0.03 {
				t.Fatalf("group 0 in %.3f of requests, want %.2f ± 0.03", got, tt.want0)
			}
			// The cold groups share the rest alike: each within 25% of its due.
			if cold := tt.groups - 1; cold > 0 && tt.hot < 1 {
				due := float64(n) * (1 - tt.want0) / float64(cold)
				for s, c := range count {
					if s != hot && math.Abs(float64(c)-due) > 0.25*due {
						t.Fatalf("a cold group drawn %d times, want about %.0f", c, due)
					}
				}
				if len(count) != tt.groups {
					t.Fatalf("%d groups drawn, want %d", len(count), tt.groups)
				}
			}
		})
	}
}

// TestSharedPrefixRotation checks --active-groups/--rotate-every: each
// phase of RotateEvery requests draws from its own ActiveGroups groups only
// (and from all of them), the phases walk through every group, a group
// idles (G/K − 1) phases between bursts, and a seed gives the same prompts.
func TestSharedPrefixRotation(t *testing.T) {
	tests := []struct {
		name                  string
		groups, active, every int
		wantIdlePhases        int
	}{
		{"8 groups, 2 active", 8, 2, 50, 3},
		{"6 groups, 3 active", 6, 3, 40, 1},
		{"4 groups, 1 active", 4, 1, 30, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := WorkloadConfig{Name: SharedPrefix, Model: "m", Seed: 9, Groups: tt.groups, SystemWords: 30, PromptWords: 5,
				ActiveGroups: tt.active, RotateEvery: tt.every}
			w := mustWorkload(t, cfg)
			index := map[string]int{}
			for g, s := range w.(*sharedPrefix).systems {
				index[s] = g
			}
			cycle := tt.groups / tt.active
			last := map[int]int{} // group -> last phase it was drawn in
			for phase := range 2 * cycle {
				seen := map[int]bool{}
				for i := range tt.every {
					n := phase*tt.every + i
					g := index[drain(w, n)[0].Messages[0].Content]
					seen[g] = true
					if p, ok := last[g]; ok && p != phase && phase-p-1 != tt.wantIdlePhases {
						t.Fatalf("group %d drawn in phases %d and %d: idle %d phases, want %d", g, p, phase, phase-p-1, tt.wantIdlePhases)
					}
					last[g] = phase
				}
				if len(seen) != tt.active {
					t.Fatalf("phase %d drew groups %v, want %d of them", phase, seen, tt.active)
				}
				for g := range seen {
					if want := (phase * tt.active) % tt.groups; g < want || g >= want+tt.active {
						t.Fatalf("phase %d drew group %d, want %d..%d", phase, g, want, want+tt.active-1)
					}
				}
			}
			if len(last) != tt.groups {
				t.Fatalf("%d groups drawn over two cycles, want %d", len(last), tt.groups)
			}
			again := mustWorkload(t, cfg)
			for n := range 3 * tt.every {
				if a, b := drain(w, n)[0].Messages, drain(again, n)[0].Messages; a[0].Content != b[0].Content || a[1].Content != b[1].Content {
					t.Fatalf("request %d differs between two workloads of one seed", n)
				}
			}
		})
	}
}

func TestLoRAMixDrawsAdaptersByPopularity(t *testing.T) {
	w := mustWorkload(t, WorkloadConfig{Name: LoRAMix, Seed: 5, Adapters: []string{"a", "b", "c", "d"}, SystemWords: 5, PromptWords: 5})
	count := map[string]int{}
	for n := range 4000 {
		count[drain(w, n)[0].Model]++
	}
	// Zipf s=1 over 4: weights 12/25, 6/25, 4/25, 3/25 of 4000 = 1920, 960, 640, 480.
	if !(count["a"] > count["b"] && count["b"] > count["c"] && count["c"] > count["d"] && count["d"] > 300) {
		t.Fatalf("adapter counts %v, want a > b > c > d > 0 roughly 1920/960/640/480", count)
	}
}

func TestLongContextSendsLongPrompts(t *testing.T) {
	w := mustWorkload(t, WorkloadConfig{Name: LongContext, Model: "m", Seed: 2})
	seen := map[string]int{}
	for n := range 40 {
		req := drain(w, n)[0]
		if words := len(strings.Fields(req.Messages[0].Content)); words < 4000 {
			t.Fatalf("prompt of %d words, want the 4000-word default document", words)
		}
		seen[req.Messages[0].Content[:200]]++
	}
	if len(seen) == 40 {
		t.Fatal("no document recurred in 40 requests; some should be shared")
	}
}

func TestWorkloadConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  WorkloadConfig
		want string // substring of the error; empty for valid
	}{
		{"shared-prefix", WorkloadConfig{Name: SharedPrefix, Model: "m"}, ""},
		{"unknown", WorkloadConfig{Name: "chatty", Model: "m"}, "--workload"},
		{"no model", WorkloadConfig{Name: MultiTurn}, "--model"},
		{"lora-mix without adapters", WorkloadConfig{Name: LoRAMix}, "--adapters"},
		{"lora-mix empty adapter", WorkloadConfig{Name: LoRAMix, Adapters: []string{"a", " "}}, "--adapters"},
		{"lora-mix needs no model", WorkloadConfig{Name: LoRAMix, Adapters: []string{"a"}}, ""},
		{"negative turns", WorkloadConfig{Name: MultiTurn, Model: "m", Turns: -1}, "--turns"},
		{"negative max tokens", WorkloadConfig{Name: SharedPrefix, Model: "m", MaxTokens: -5}, "--max-tokens"},
		{"share over 1", WorkloadConfig{Name: LongContext, Model: "m", SharedShare: 1.5}, "--shared-share"},
		{"hot share", WorkloadConfig{Name: SharedPrefix, Model: "m", HotShare: 0.8}, ""},
		{"hot share of lora-mix", WorkloadConfig{Name: LoRAMix, Adapters: []string{"a"}, HotShare: 1}, ""},
		{"hot share over 1", WorkloadConfig{Name: SharedPrefix, Model: "m", HotShare: 1.2}, "--hot-share"},
		{"hot share negative", WorkloadConfig{Name: SharedPrefix, Model: "m", HotShare: -0.1}, "--hot-share"},
		{"hot share NaN", WorkloadConfig{Name: SharedPrefix, Model: "m", HotShare: math.NaN()}, "--hot-share"},
		{"hot share of multi-turn", WorkloadConfig{Name: MultiTurn, Model: "m", HotShare: 0.5}, "--hot-share"},
		{"rotation", WorkloadConfig{Name: SharedPrefix, Model: "m", ActiveGroups: 2, RotateEvery: 10}, ""},
		{"rotation of lora-mix", WorkloadConfig{Name: LoRAMix, Adapters: []string{"a"}, ActiveGroups: 8, RotateEvery: 1}, ""},
		{"active groups over groups", WorkloadConfig{Name: SharedPrefix, Model: "m", Groups: 4, ActiveGroups: 5, RotateEvery: 10}, "--active-groups"},
		{"active groups negative", WorkloadConfig{Name: SharedPrefix, Model: "m", ActiveGroups: -1, RotateEvery: 10}, "--active-groups"},
		{"rotate every negative", WorkloadConfig{Name: SharedPrefix, Model: "m", ActiveGroups: 2, RotateEvery: -1}, "--rotate-every"},
		{"active groups without rotate", WorkloadConfig{Name: SharedPrefix, Model: "m", ActiveGroups: 2}, "set both"},
		{"rotate without active groups", WorkloadConfig{Name: SharedPrefix, Model: "m", RotateEvery: 5}, "set both"},
		{"rotation with hot share", WorkloadConfig{Name: SharedPrefix, Model: "m", ActiveGroups: 2, RotateEvery: 5, HotShare: 0.5}, "--hot-share"},
		{"rotation of multi-turn", WorkloadConfig{Name: MultiTurn, Model: "m", ActiveGroups: 2, RotateEvery: 5}, "--active-groups"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate = %v, want an error naming %s", err, tt.want)
			}
		})
	}
}
