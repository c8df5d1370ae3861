package sim

import (
	"context"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/vllm"
)

// virtualClock advances by whatever is slept, at once: the step loop's
// tests take hundreds of steps without waiting.
type virtualClock struct{ now time.Time }

func (c *virtualClock) Now() time.Time { return c.now }

func (c *virtualClock) Sleep(ctx context.Context, d time.Duration) error {
	if d > 0 {
		c.now = c.now.Add(d)
	}
	return ctx.Err()
}

// gpuEngine is a stepped engine on an L4 serving Qwen2.5-0.5B, with the
// steps it takes recorded.
type gpuEngine struct {
	*engine
	clock *virtualClock
	steps []recordedStep
	rng   *rand.Rand
}

type recordedStep struct {
	at    time.Time // when the step started
	d     time.Duration
	items []stepItem
}

func newGPUEngine(t *testing.T, mutate func(*Config)) *gpuEngine {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Model, cfg.GPU, cfg.GPUMemoryUtilization = "Qwen/Qwen2.5-0.5B-Instruct", "l4", 0.6
	if mutate != nil {
		mutate(&cfg)
	}
	cfg.Derive()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	g := &gpuEngine{engine: newEngine(&cfg, nil), clock: &virtualClock{now: time.Unix(1700000000, 0)},
		rng: rand.New(rand.NewPCG(1, 2))}
	g.onStep = func(items []stepItem, d time.Duration) {
		g.steps = append(g.steps, recordedStep{g.clock.now, d, slices.Clone(items)})
	}
	return g
}

// add submits a fresh prompt (no prefix shared with any other).
func (g *gpuEngine) add(t *testing.T, prompt, maxTokens int) *gseq {
	t.Helper()
	return g.addWith(t, prompt, maxTokens, 0)
}

// addWith is add with a request priority.
func (g *gpuEngine) addWith(t *testing.T, prompt, maxTokens, priority int) *gseq {
	t.Helper()
	all := make([]int, prompt+maxTokens)
	for i := range all {
		all[i] = g.rng.IntN(TokenEOT)
	}
	none := vllm.NoneHash("0")
	hashes, err := vllm.BlockHashes(none, all[:prompt], g.blockSize, nil)
	if err != nil {
		t.Fatal(err)
	}
	allHashes, err := vllm.BlockHashes(none, all, g.blockSize, nil)
	if err != nil {
		t.Fatal(err)
	}
	return g.submit(nil, hashes, allHashes, all, prompt, maxTokens, "", 0, priority)
}

func (g *gpuEngine) step(t *testing.T) bool {
	t.Helper()
	ran, err := g.engine.step(context.Background(), g.clock, func() float64 { return 1 })
	if err != nil {
		t.Fatal(err)
	}
	return ran
}

// until steps until cond holds; a bound on steps keeps a bug from hanging.
func (g *gpuEngine) until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for i := 0; !cond(); i++ {
		if i == 100000 || !g.step(t) {
			t.Fatalf("%s: never happened (%d steps)", what, i)
		}
	}
}

// TestDecodeStepGrowsWithBatch: a decode step serves every running
// sequence, so its time — each sequence's time per output token — grows
// with the batch: weights are read once, but every sequence's KV and
// per-sequence overhead are added.
func TestDecodeStepGrowsWithBatch(t *testing.T) {
	var prev time.Duration
	for _, batch := range []int{1, 8, 64, 256} {
		g := newGPUEngine(t, nil)
		seqs := make([]*gseq, batch)
		for i := range seqs {
			seqs[i] = g.add(t, 512, 400)
		}
		g.until(t, "every prefill", func() bool {
			return !slices.ContainsFunc(seqs, func(s *gseq) bool { return s.generated == 0 })
		})
		g.steps = nil
		g.step(t)
		st := g.steps[0]
		if len(st.items) != batch || slices.ContainsFunc(st.items, func(it stepItem) bool { return it.newTokens != 1 }) {
			t.Fatalf("batch %d: step of %d items, want %d decodes", batch, len(st.items), batch)
		}
		t.Logf("batch %d: %v per decode step", batch, st.d)
		if st.d <= prev {
			t.Errorf("batch %d: decode step %v, not above the smaller batch's %v", batch, st.d, prev)
		}
		prev = st.d
	}
}

// TestLongPrefillDelaysDecodes: a long prompt's prefill runs in the same
// step as the running sequences' decodes, so their next token waits for it.
func TestLongPrefillDelaysDecodes(t *testing.T) {
	g := newGPUEngine(t, nil)
	a := g.add(t, 64, 200)
	g.until(t, "a decoding", func() bool { return a.generated >= 5 })
	gap := func() time.Duration {
		before, at := a.generated, g.clock.now
		g.until(t, "a's next token", func() bool { return a.generated > before })
		return g.clock.now.Sub(at)
	}
	alone := gap()
	b := g.add(t, 2000, 4)
	withPrefill := gap()
	if b.computed != 2000 || b.generated != 1 {
		t.Fatalf("b: computed %d generated %d, want its whole prompt in that one step", b.computed, b.generated)
	}
	after := gap()
	t.Logf("a's token gap: %v alone, %v beside b's prefill, %v after", alone, withPrefill, after)
	if withPrefill < 3*alone {
		t.Errorf("a's token beside a 2000-token prefill took %v, want well over %v alone", withPrefill, alone)
	}
	if after >= 2*alone {
		t.Errorf("a's token after the prefill took %v, want back near %v", after, alone)
	}
}

// TestChunkedPrefill: a prompt longer than the step's token budget is
// prefilled over several steps, and its first token comes from the last.
func TestChunkedPrefill(t *testing.T) {
	g := newGPUEngine(t, func(c *Config) { c.MaxNumBatchedTokens = 256 })
	s := g.add(t, 1000, 2)
	g.until(t, "the first token", func() bool { return s.generated == 1 })
	var chunks []int
	for _, st := range g.steps {
		chunks = append(chunks, st.items[0].newTokens)
	}
	if want := []int{256, 256, 256, 232}; !slices.Equal(chunks, want) {
		t.Errorf("chunks %v, want %v", chunks, want)
	}
	g.until(t, "the end", func() bool { return s.state == seqFinished })
	if st := g.stats(); st.Running != 0 || st.KVUsage != 0 {
		t.Errorf("after the end: %+v", st)
	}
}

// TestPreemptionWhenBlocksRunOut: sequences whose decodes outgrow the KV
// cache preempt the most recently admitted one, which recomputes later;
// every request still finishes with all its tokens.
func TestPreemptionWhenBlocksRunOut(t *testing.T) {
	// 20 blocks of 16 tokens; each sequence grows to 14 blocks.
	g := newGPUEngine(t, func(c *Config) { c.NumGPUBlocks, c.MaxModelLen = 20, 256 })
	seqs := []*gseq{g.add(t, 64, 150), g.add(t, 64, 150), g.add(t, 64, 150)}
	g.until(t, "a preemption", func() bool { return g.preemptions > 0 })
	if g.wait[0] != seqs[2] {
		t.Errorf("preempted first: not the last admitted sequence")
	}
	if seqs[2].computed != 0 || seqs[2].blocks != 0 {
		t.Errorf("preempted sequence kept computed=%d blocks=%d", seqs[2].computed, seqs[2].blocks)
	}
	g.until(t, "every sequence finished", func() bool {
		return !slices.ContainsFunc(seqs, func(s *gseq) bool { return s.state != seqFinished })
	})
	for i, s := range seqs {
		if s.generated != 150 {
			t.Errorf("seq %d: %d tokens, want 150", i, s.generated)
		}
	}
	if st := g.stats(); st.Preemptions < 1 || st.KVUsage != 0 || st.Running+st.Waiting != 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestAbortFreesBlocks: a client that leaves mid-generation takes its
// sequence out at once; the step in flight does not bring it back.
func TestAbortFreesBlocks(t *testing.T) {
	g := newGPUEngine(t, nil)
	s := g.add(t, 300, 50)
	g.until(t, "decoding", func() bool { return s.generated > 2 })
	g.abort(s)
	if st := g.stats(); st.Running != 0 || st.KVUsage != 0 {
		t.Errorf("after abort: %+v", st)
	}
	if g.step(t) {
		t.Error("a step ran with nothing to do")
	}
}

// TestRunStepsStopsWithContext: the loop idles without work and returns
// when its context ends.
func TestRunStepsStopsWithContext(t *testing.T) {
	g := newGPUEngine(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.runSteps(ctx, realClock{}, func() float64 { return 0 })
	}()
	s := g.add(t, 32, 3)
	select {
	case <-s.notify:
	case <-time.After(10 * time.Second):
		t.Fatal("no token from the running loop")
	}
	cancel()
	<-done
}

// TestPriorityScheduling is vLLM's priority policy: the waiting queue is
// ordered by (priority, arrival), so a request of a higher class (a lower
// number) that arrives behind others is admitted before them; under FCFS
// it waits its turn. Under KV pressure the running sequence last in that
// order is preempted, not the last admitted.
func TestPriorityScheduling(t *testing.T) {
	admitted := func(policy string) []int {
		g := newGPUEngine(t, func(c *Config) { c.MaxNumSeqs, c.SchedulingPolicy = 1, policy })
		first := g.addWith(t, 64, 4, 5) // runs alone: one slot
		g.step(t)
		var order []int
		seqs := []*gseq{g.addWith(t, 64, 4, 5), g.addWith(t, 64, 4, 5), g.addWith(t, 64, 4, 0)}
		seen := map[*gseq]bool{first: true}
		g.until(t, "every request admitted", func() bool {
			for i, s := range seqs {
				if !seen[s] && s.state != seqWaiting {
					seen[s] = true
					order = append(order, i)
				}
			}
			return len(order) == len(seqs)
		})
		return order
	}
	if got := admitted("fcfs"); !slices.Equal(got, []int{0, 1, 2}) {
		t.Errorf("fcfs admitted %v, want arrival order [0 1 2]", got)
	}
	if got := admitted("priority"); !slices.Equal(got, []int{2, 0, 1}) {
		t.Errorf("priority admitted %v, want the priority-0 request first: [2 0 1]", got)
	}

	// KV pressure: three running sequences that each grow; with too few
	// blocks for all, the priority policy preempts the priority-9 one
	// although it was admitted first.
	g := newGPUEngine(t, func(c *Config) { c.SchedulingPolicy, c.NumGPUBlocks, c.MaxModelLen = "priority", 12, 128 })
	low := g.addWith(t, 48, 64, 9)
	g.step(t)
	mid, high := g.addWith(t, 48, 64, 1), g.addWith(t, 48, 64, 0)
	// The step that preempts may run nothing: vLLM stops scheduling the
	// running queue at the request it had to preempt, here the first.
	for i := 0; g.preemptions == 0; i++ {
		if i == 1000 {
			t.Fatal("no preemption in 1000 steps")
		}
		g.step(t)
	}
	if low.state != seqWaiting || mid.state == seqWaiting || high.state == seqWaiting {
		t.Fatalf("after the first preemption: low %v, mid %v, high %v; want low preempted", low.state, mid.state, high.state)
	}
}

// TestPriorityRefusedUnderFCFS: vLLM's processor refuses a priority other
// than 0 unless the engine schedules by priority.
func TestPriorityRefusedUnderFCFS(t *testing.T) {
	for _, tc := range []struct {
		policy string
		body   string
		code   int
	}{
		{"fcfs", `{"model":"llama","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"priority":1}`, http.StatusBadRequest},
		{"fcfs", `{"model":"llama","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"priority":0}`, http.StatusOK},
		{"priority", `{"model":"llama","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"priority":3}`, http.StatusOK},
		{"fcfs", `{"model":"llama","prompt":"hi","max_tokens":2,"priority":-1}`, http.StatusBadRequest},
	} {
		cfg := testConfig()
		cfg.SchedulingPolicy = tc.policy
		_, ts := newTestServer(t, cfg)
		path := "/v1/chat/completions"
		if strings.Contains(tc.body, `"prompt"`) {
			path = "/v1/completions"
		}
		resp, body := post(t, ts.URL+path, tc.body)
		if resp.StatusCode != tc.code {
			t.Errorf("%s %s: %d %s, want %d", tc.policy, tc.body, resp.StatusCode, body, tc.code)
		}
		if tc.code == http.StatusBadRequest && !strings.Contains(string(body), "Priority scheduling is not enabled.") {
			t.Errorf("%s: %s, want vLLM's words", tc.body, body)
		}
	}
}
