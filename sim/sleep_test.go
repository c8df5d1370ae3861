package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
	"github.com/llmgw/llmgw/vllm"
)

// recordingClock is a virtual clock that also records every non-zero
// sleep: what an engine spent loading, offloading and reloading.
type recordingClock struct {
	mu    sync.Mutex
	now   time.Time
	slept []time.Duration
}

func newRecordingClock() *recordingClock { return &recordingClock{now: time.Unix(1700000000, 0)} }

func (c *recordingClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *recordingClock) Sleep(ctx context.Context, d time.Duration) error {
	if d > 0 {
		c.mu.Lock()
		c.now = c.now.Add(d)
		c.slept = append(c.slept, d)
		c.mu.Unlock()
	}
	return ctx.Err()
}

// took reports whether d was slept (and forgets it, so each is counted
// once).
func (c *recordingClock) took(d time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, s := range c.slept {
		if s == d {
			c.slept = append(c.slept[:i], c.slept[i+1:]...)
			return true
		}
	}
	return false
}

// TestLoadTimes: the start is the fixed startup plus the weights over the
// disk and the host link, a sleep and a wake the weights over the host
// link (design §8 "Loading and sleeping"). The figures are in the design.
func TestLoadTimes(t *testing.T) {
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	tests := []struct {
		name             string
		gpu, model       string
		scale            float64
		delay            time.Duration
		start, sleep, wk time.Duration
	}{
		// 16.06 GB of BF16 weights: 5,353 ms from a 3 GB/s disk, 643 ms
		// over 78 % of PCIe Gen4's 32 GB/s, after 20 s of startup.
		{"llama 8b on l4", "l4", "meta-llama/Llama-3.1-8B-Instruct", 1, 0, ms(25996.7), ms(643.4), ms(643.4)},
		// 0.988 GB: 329 ms and 40 ms.
		{"qwen 0.5b on l4", "l4", "Qwen/Qwen2.5-0.5B-Instruct", 1, 0, ms(20368.9), ms(39.6), ms(39.6)},
		// PCIe Gen5 halves the copies.
		{"llama 8b on h100", "h100-sxm", "meta-llama/Llama-3.1-8B-Instruct", 1, 0, ms(25675.0), ms(321.7), ms(321.7)},
		{"scaled", "l4", "meta-llama/Llama-3.1-8B-Instruct", 0.1, 0, ms(2599.7), ms(64.3), ms(64.3)},
		{"scaled to nothing", "l4", "meta-llama/Llama-3.1-8B-Instruct", 0, 0, 0, 0, 0},
		{"a startup delay is the whole start", "l4", "meta-llama/Llama-3.1-8B-Instruct", 1, 3 * time.Second, 3 * time.Second, ms(643.4), ms(643.4)},
		{"no gpu: only the startup delay", "", "m", 1, time.Second, time.Second, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Model, c.GPU, c.LoadScale, c.StartupDelay = tc.model, tc.gpu, tc.scale, tc.delay
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			lt := c.LoadTimes()
			near := func(got, want time.Duration) bool { return (got - want).Abs() < ms(0.1) }
			if !near(lt.Start, tc.start) || !near(lt.Sleep, tc.sleep) || !near(lt.Wake, tc.wk) {
				t.Errorf("load times %+v, want start %v sleep %v wake %v", lt, tc.start, tc.sleep, tc.wk)
			}
		})
	}
}

func TestLoadScaleValidated(t *testing.T) {
	for _, v := range []float64{-0.1, 1.5} {
		c := testConfig()
		c.LoadScale = v
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--sim-load-scale") {
			t.Errorf("scale %v: %v, want an error naming --sim-load-scale", v, err)
		}
	}
}

// TestRunLoadsBeforeListening: Run spends the start time before it
// listens, and serves after.
func TestRunLoadsBeforeListening(t *testing.T) {
	cfg := testConfig()
	cfg.Model, cfg.GPU, cfg.NumGPUBlocks = "meta-llama/Llama-3.1-8B-Instruct", "l4", 0
	// A port taken from the kernel and freed: Run binds it after loading.
	var lc net.ListenConfig
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host, cfg.Port = "127.0.0.1", ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	clock := newRecordingClock()
	s, err := New(cfg, nil, WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	testkit.WaitErr(t, 10*time.Second, "the engine to serve", func() error {
		resp, err := http.Get("http://" + net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)) + "/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if want := cfg.LoadTimes().Start; !clock.took(want) {
		t.Errorf("slept %v, want the start %v first", clock.slept, want)
	}
}

// sleepConfig is a server with sleep mode and its endpoints.
func sleepConfig() Config {
	cfg := testConfig()
	cfg.DevMode, cfg.EnableSleepMode = true, true
	return cfg
}

func isSleeping(t *testing.T, base string) bool {
	t.Helper()
	resp, err := http.Get(base + "/is_sleeping")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct {
		IsSleeping *bool `json:"is_sleeping"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || v.IsSleeping == nil {
		t.Fatalf("/is_sleeping: %s: %v", resp.Status, err)
	}
	return *v.IsSleeping
}

func metricsText(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func sleepState(state string, v int) string {
	return `vllm:engine_sleep_state{engine="0",model_name="llama",sleep_state="` + state + `"} ` + strconv.Itoa(v)
}

// TestSleepWakeTimesAndState: a level-1 sleep offloads the weights over
// the host link, a wake reloads them; is_sleeping and
// vllm:engine_sleep_state follow; a wake of some tags leaves the engine
// asleep until the last.
func TestSleepWakeTimesAndState(t *testing.T) {
	cfg := sleepConfig()
	cfg.Model, cfg.GPU, cfg.NumGPUBlocks = "meta-llama/Llama-3.1-8B-Instruct", "l4", 0
	clock := newRecordingClock()
	_, ts := newTestServer(t, cfg, WithClock(clock))
	lt := cfg.LoadTimes()
	if isSleeping(t, ts.URL) {
		t.Fatal("asleep at start")
	}
	if m := metricsText(t, ts.URL); !strings.Contains(m, sleepState("awake", 1)) || !strings.Contains(m, sleepState("weights_offloaded", 0)) {
		t.Errorf("metrics at start:\n%s", m)
	}
	if resp, b := post(t, ts.URL+"/sleep?level=1", ""); resp.StatusCode != http.StatusOK || len(b) != 0 {
		t.Fatalf("sleep: %s %s", resp.Status, b)
	}
	if !clock.took(lt.Sleep) {
		t.Errorf("slept %v, want the offload %v", clock.slept, lt.Sleep)
	}
	if !isSleeping(t, ts.URL) {
		t.Error("not asleep after a sleep")
	}
	if m := metricsText(t, ts.URL); !strings.Contains(m, sleepState("awake", 0)) || !strings.Contains(m, sleepState("weights_offloaded", 1)) {
		t.Errorf("metrics asleep:\n%s", m)
	}
	// A second sleep is a no-op for the executor: nothing more is copied.
	post(t, ts.URL+"/sleep", "")
	if len(clock.slept) != 0 {
		t.Errorf("a second sleep slept %v", clock.slept)
	}
	// The KV cache woken alone moves no weights and leaves the engine
	// asleep; a tag not asleep makes a wake a no-op.
	post(t, ts.URL+"/wake_up?tags=kv_cache", "")
	post(t, ts.URL+"/wake_up?tags=kv_cache", "")
	if len(clock.slept) != 0 || !isSleeping(t, ts.URL) {
		t.Errorf("after waking the KV cache: slept %v, asleep %v", clock.slept, isSleeping(t, ts.URL))
	}
	if resp, b := post(t, ts.URL+"/wake_up?tags=weights&tags=scheduling", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("wake: %s %s", resp.Status, b)
	}
	if !clock.took(lt.Wake) {
		t.Errorf("slept %v, want the reload %v", clock.slept, lt.Wake)
	}
	if isSleeping(t, ts.URL) {
		t.Error("asleep after the last tag woke")
	}
	if m := metricsText(t, ts.URL); !strings.Contains(m, sleepState("awake", 1)) {
		t.Errorf("metrics awake:\n%s", m)
	}
}

// TestSleepLevels: level 0 only pauses (the cache stays), level 2 discards
// the weights (no copy either way), and without --enable-sleep-mode a sleep
// frees nothing and takes no time — the engine still pauses.
func TestSleepLevels(t *testing.T) {
	tests := []struct {
		name      string
		level     string
		sleepMode bool
		copied    bool
		cleared   bool
		state     string
	}{
		{"level 0 pauses only", "0", true, false, false, ""},
		{"level 1 offloads", "1", true, true, true, "weights_offloaded"},
		{"level 2 discards", "2", true, false, true, "discard_all"},
		{"no sleep mode", "1", false, false, true, "weights_offloaded"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := sleepConfig()
			cfg.Model, cfg.GPU, cfg.NumGPUBlocks, cfg.EnableSleepMode = "meta-llama/Llama-3.1-8B-Instruct", "l4", 0, tc.sleepMode
			clock := newRecordingClock()
			obs := &clearedObserver{}
			_, ts := newTestServer(t, cfg, WithClock(clock), WithCacheObserver(obs))
			if resp, b := post(t, ts.URL+"/sleep?level="+tc.level, ""); resp.StatusCode != http.StatusOK {
				t.Fatalf("sleep: %s %s", resp.Status, b)
			}
			if copied := clock.took(cfg.LoadTimes().Sleep); copied != tc.copied {
				t.Errorf("weights copied %v, want %v", copied, tc.copied)
			}
			if obs.count() == 1 != tc.cleared {
				t.Errorf("AllBlocksCleared %d times, want cleared %v", obs.count(), tc.cleared)
			}
			if !isSleeping(t, ts.URL) {
				t.Error("not asleep")
			}
			m := metricsText(t, ts.URL)
			for _, s := range []string{"awake", "weights_offloaded", "discard_all"} {
				want := 0
				if s == tc.state {
					want = 1
				}
				if !strings.Contains(m, sleepState(s, want)) {
					t.Errorf("metrics lack %s", sleepState(s, want))
				}
			}
			post(t, ts.URL+"/wake_up", "")
			if copied := clock.took(cfg.LoadTimes().Wake); copied != tc.copied {
				t.Errorf("weights copied back %v, want %v", copied, tc.copied)
			}
			if isSleeping(t, ts.URL) {
				t.Error("asleep after a wake")
			}
		})
	}
}

type clearedObserver struct {
	nopObserver
	mu      sync.Mutex
	cleared int
}

func (o *clearedObserver) AllBlocksCleared() {
	o.mu.Lock()
	o.cleared++
	o.mu.Unlock()
}

func (o *clearedObserver) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.cleared
}

// TestSleepEndpointsNeedDevMode: as vLLM's, the routes exist only with
// VLLM_SERVER_DEV_MODE; bad parameters are refused as FastAPI does.
func TestSleepEndpointsNeedDevMode(t *testing.T) {
	cfg := testConfig()
	cfg.EnableSleepMode = true
	_, ts := newTestServer(t, cfg)
	for _, path := range []string{"/sleep", "/wake_up"} {
		if resp, _ := post(t, ts.URL+path, ""); resp.StatusCode != http.StatusNotFound {
			t.Errorf("POST %s without dev mode: %s, want 404", path, resp.Status)
		}
	}
	_, ts = newTestServer(t, sleepConfig())
	for _, q := range []string{"level=3", "level=x", "mode=later"} {
		if resp, b := post(t, ts.URL+"/sleep?"+q, ""); resp.StatusCode != http.StatusUnprocessableEntity {
			t.Errorf("sleep?%s: %s %s, want 422", q, resp.Status, b)
		}
	}
	if resp, b := post(t, ts.URL+"/sleep?mode=keep", ""); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("keep with simple timing: %s %s, want 400", resp.Status, b)
	}
	if isSleeping(t, ts.URL) {
		t.Error("a refused sleep paused the engine")
	}
}

// TestSleepAbortsInFlightAndHoldsNew: a sleep in mode abort ends the
// request in flight with what it has and finish_reason abort, empties the
// cache; a request sent while asleep waits and is served after the wake.
func TestSleepAbortsInFlightAndHoldsNew(t *testing.T) {
	cfg := sleepConfig()
	cfg.DecodePerToken = time.Millisecond // each later token waits for the gate
	gate := newGateClock()
	s, ts := newTestServer(t, cfg, WithClock(gate))
	type answer struct {
		resp *http.Response
		body []byte
	}
	inflight := make(chan answer, 1)
	go func() {
		resp, b := post(t, ts.URL+"/v1/chat/completions", chatBody("in flight", `,"max_tokens":4`))
		inflight <- answer{resp, b}
	}()
	testkit.Wait(t, "the request running", func() bool { return s.eng.stats().Running == 1 })
	if resp, b := post(t, ts.URL+"/sleep?level=1", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("sleep: %s %s", resp.Status, b)
	}
	a := <-inflight
	var c vllm.ChatCompletion
	if err := json.Unmarshal(a.body, &c); err != nil || a.resp.StatusCode != http.StatusOK || len(c.Choices) != 1 {
		t.Fatalf("aborted request: %s %s", a.resp.Status, a.body)
	}
	if f := c.Choices[0].FinishReason; f == nil || *f != vllm.FinishedAbort || c.Usage.CompletionTokens != 1 {
		t.Errorf("aborted request: finish %v, %d completion tokens; want abort after 1: %s", f, c.Usage.CompletionTokens, a.body)
	}
	if st := s.eng.stats(); st.Running != 0 || st.KVUsage != 0 {
		t.Errorf("asleep: %+v, want nothing running or held in the cache", st)
	}
	held := make(chan answer, 1)
	go func() {
		resp, b := post(t, ts.URL+"/v1/completions", `{"prompt":"while asleep","max_tokens":1}`)
		held <- answer{resp, b}
	}()
	testkit.Wait(t, "the request held", func() bool { return s.eng.stats().Waiting == 1 })
	if m := metricsText(t, ts.URL); !strings.Contains(m, `vllm:num_requests_waiting{engine="0",model_name="llama"} 1`) {
		t.Errorf("a held request is not counted waiting:\n%s", m)
	}
	select {
	case a := <-held:
		t.Fatalf("served while asleep: %s %s", a.resp.Status, a.body)
	case <-time.After(50 * time.Millisecond):
	}
	post(t, ts.URL+"/wake_up", "")
	a = <-held
	if a.resp.StatusCode != http.StatusOK || !strings.Contains(string(a.body), `"finish_reason":"length"`) {
		t.Errorf("held request after the wake: %s %s", a.resp.Status, a.body)
	}
}

// TestSleepAbortEndsStream: a streamed request the engine aborts ends with
// a chunk of finish_reason abort, its usage and [DONE].
func TestSleepAbortEndsStream(t *testing.T) {
	cfg := sleepConfig()
	cfg.DecodePerToken = time.Millisecond
	gate := newGateClock()
	s, ts := newTestServer(t, cfg, WithClock(gate))
	resp, err := http.Post(ts.URL+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt":"stream me","stream":true,"max_tokens":5,"stream_options":{"include_usage":true}}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := sseReader{bufio.NewReader(resp.Body)}
	if ev := r.next(t); strings.Contains(ev, "finish_reason\":\"") {
		t.Fatalf("first token: %s", ev)
	}
	testkit.Wait(t, "the request running", func() bool { return s.eng.stats().Running == 1 })
	post(t, ts.URL+"/sleep", "")
	if ev := r.next(t); !strings.Contains(ev, `"finish_reason":"abort"`) {
		t.Errorf("after the sleep: %s, want finish_reason abort", ev)
	}
	if ev := r.next(t); !strings.Contains(ev, `"completion_tokens":1`) {
		t.Errorf("usage: %s", ev)
	}
	if ev := r.next(t); ev != "[DONE]" {
		t.Errorf("got %q, want [DONE]", ev)
	}
}

// TestPauseModesStepped: the stepped engine pauses as vLLM's engine core
// (pause_scheduler): abort takes every request out at once and tells its
// handler; wait lets those in the engine finish; keep preempts the running
// ones, which run again after the resume. In every mode a request that
// arrives while paused is held until the resume, and a reset of the cache
// succeeds once the pause has taken hold.
func TestPauseModesStepped(t *testing.T) {
	for _, mode := range []string{pauseAbort, pauseWait, pauseKeep} {
		t.Run(mode, func(t *testing.T) {
			g := newGPUEngine(t, nil)
			a, b := g.add(t, 300, 20), g.add(t, 300, 20)
			aborted := 0
			a.onAbort, b.onAbort = func() { aborted++ }, func() { aborted++ }
			g.until(t, "both decoding", func() bool { return a.generated > 1 && b.generated > 1 })
			g.mu.Lock()
			g.pauseLocked(mode)
			g.mu.Unlock()
			late := g.add(t, 100, 2)
			switch mode {
			case pauseAbort:
				if a.state != seqAborted || b.state != seqAborted || aborted != 2 {
					t.Errorf("abort: states %v %v, %d told", a.state, b.state, aborted)
				}
			case pauseWait:
				g.until(t, "both finished", func() bool { return a.state == seqFinished && b.state == seqFinished })
				if err := g.waitDrained(context.Background()); err != nil {
					t.Fatal(err)
				}
				g.pause = pausedAll
			case pauseKeep:
				if a.state != seqWaiting || b.state != seqWaiting || a.computed != 0 || g.wait[0] != a || g.wait[1] != b {
					t.Errorf("keep: %v %v, want both preempted back to the queue in order", a.state, b.state)
				}
			}
			if g.step(t) {
				t.Error("a step ran while paused")
			}
			if late.state != seqWaiting || !late.held {
				t.Errorf("a request sent while paused: %v held %v", late.state, late.held)
			}
			if err := g.resetPrefixCache(false); err != nil {
				t.Errorf("reset while paused: %v", err)
			}
			g.resume()
			g.until(t, "the held request served", func() bool { return late.state == seqFinished })
			if mode == pauseKeep {
				g.until(t, "the kept requests served", func() bool { return a.state == seqFinished && b.state == seqFinished })
				if a.generated != 20 || b.generated != 20 {
					t.Errorf("kept requests generated %d and %d tokens, want 20", a.generated, b.generated)
				}
			}
			if st := g.stats(); st.Running+st.Waiting != 0 || st.KVUsage != 0 {
				t.Errorf("after the resume: %+v", st)
			}
		})
	}
}
