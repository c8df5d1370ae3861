package adapters

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/vllm"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeEngine is vLLM's runtime LoRA API and the metrics the manager reads.
type fakeEngine struct {
	mu      sync.Mutex
	loaded  []string
	loads   map[string]int
	unloads map[string]int
	// fail answers a load of the name with this status and message.
	fail map[string]int
	// max, when not 0, is --max-loras: a load beyond it gets the
	// simulator's 500 "unload one first".
	max     int
	running []string
	// stuck, when set, is what the newest lora_requests_info series names
	// whatever runs: an activity metric stuck busy (issue 27).
	stuck []string
	srv   *httptest.Server
}

func newFakeEngine(t *testing.T, loaded ...string) *fakeEngine {
	f := &fakeEngine{loaded: loaded, loads: map[string]int{}, unloads: map[string]int{}, fail: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		base := "base"
		list := vllm.ModelList{Object: "list", Data: []vllm.ModelCard{{ID: "m", Object: "model"}}}
		for _, a := range f.loaded {
			list.Data = append(list.Data, vllm.ModelCard{ID: a, Object: "model", Parent: &base})
		}
		json.NewEncoder(w).Encode(list)
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		// A stale series naming everything, older than the current one.
		fmt.Fprintf(w, "vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"a,b,c\",waiting_lora_adapters=\"\"} 1.0e+09\n")
		named := f.running
		if f.stuck != nil {
			named = f.stuck
		}
		fmt.Fprintf(w, "vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=%q,waiting_lora_adapters=\"\"} 1.7e+09\n",
			strings.Join(named, ","))
		fmt.Fprintf(w, "vllm:num_requests_running{model_name=\"m\",engine=\"0\"} %d\n", len(f.running))
		fmt.Fprintf(w, "vllm:num_requests_waiting{model_name=\"m\",engine=\"0\"} 0\n")
	})
	mux.HandleFunc("POST /v1/load_lora_adapter", func(w http.ResponseWriter, r *http.Request) {
		var req struct{ LoRAName, LoRAPath string }
		body, _ := io.ReadAll(r.Body)
		var raw map[string]string
		json.Unmarshal(body, &raw)
		req.LoRAName, req.LoRAPath = raw["lora_name"], raw["lora_path"]
		f.mu.Lock()
		defer f.mu.Unlock()
		f.loads[req.LoRAName]++
		if code := f.fail[req.LoRAName]; code != 0 {
			w.WriteHeader(code)
			json.NewEncoder(w).Encode(vllm.NewError(code, "X", fmt.Sprintf("Loading lora %s failed: No adapter found for %s", req.LoRAName, req.LoRAPath)))
			return
		}
		if f.max > 0 && len(f.loaded) >= f.max && !slices.Contains(f.loaded, req.LoRAName) {
			w.WriteHeader(500)
			json.NewEncoder(w).Encode(vllm.NewError(500, "InternalServerError", fmt.Sprintf("Loading lora %s failed: %d adapters are held and --max-loras is %d; unload one first", req.LoRAName, len(f.loaded), f.max)))
			return
		}
		if slices.Contains(f.loaded, req.LoRAName) {
			w.WriteHeader(400)
			json.NewEncoder(w).Encode(vllm.NewError(400, vllm.ErrTypeInvalidInput, "The lora adapter '"+req.LoRAName+"' has already been loaded."))
			return
		}
		f.loaded = append(f.loaded, req.LoRAName)
		fmt.Fprintf(w, "Success: LoRA adapter '%s' added successfully.", req.LoRAName)
	})
	mux.HandleFunc("POST /v1/unload_lora_adapter", func(w http.ResponseWriter, r *http.Request) {
		var raw map[string]string
		json.NewDecoder(r.Body).Decode(&raw)
		f.mu.Lock()
		defer f.mu.Unlock()
		f.unloads[raw["lora_name"]]++
		f.loaded = slices.DeleteFunc(f.loaded, func(s string) bool { return s == raw["lora_name"] })
		fmt.Fprintf(w, "Success: LoRA adapter '%s' removed successfully.", raw["lora_name"])
	})
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeEngine) addr() string { return strings.TrimPrefix(f.srv.URL, "http://") }

func (f *fakeEngine) state() (loaded []string, loads, unloads map[string]int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	loaded = slices.Clone(f.loaded)
	slices.Sort(loaded)
	loads, unloads = map[string]int{}, map[string]int{}
	for k, v := range f.loads {
		loads[k] = v
	}
	for k, v := range f.unloads {
		unloads[k] = v
	}
	return loaded, loads, unloads
}

func (f *fakeEngine) setRunning(names ...string) {
	f.mu.Lock()
	f.running = names
	f.mu.Unlock()
}

// skewClock is the wall clock plus an offset the test moves forward, so
// idle grace and retry delays pass without waiting for them.
type skewClock struct {
	mu     sync.Mutex
	offset time.Duration
}

func (c *skewClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

func (c *skewClock) advance(d time.Duration) {
	c.mu.Lock()
	c.offset += d
	c.mu.Unlock()
}

type harness struct {
	t     *testing.T
	m     *Manager
	clock *skewClock
	eng   *fakeEngine
	model *llmgwv1.Model
	reg   *prometheus.Registry
}

func start(t *testing.T, eng *fakeEngine, maxLoaded uint32, opts ...func(*Config)) *harness {
	t.Helper()
	h := &harness{t: t, clock: &skewClock{}, eng: eng, reg: prometheus.NewRegistry()}
	h.model = &llmgwv1.Model{Name: "m", Engine: "sim", Model: "/m", MaxLoadedAdapters: maxLoaded,
		Adapters: []*llmgwv1.Adapter{{Name: "a", Path: "/ad/a"}, {Name: "b", Path: "/ad/b"}, {Name: "c", Path: "/ad/c"}}}
	cfg := DefaultConfig()
	cfg.ScrapeInterval, cfg.IdleGrace, cfg.RetryInitial, cfg.RetryMax = 10*time.Millisecond, time.Hour, time.Hour, 4*time.Hour
	cfg.Now = h.clock.now
	for _, o := range opts {
		o(&cfg)
	}
	m, err := New(cfg, slog.New(slog.DiscardHandler), h.reg)
	if err != nil {
		t.Fatal(err)
	}
	h.m = m
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return h
}

func (h *harness) place(adapters ...string) {
	d := &llmgwv1.DesiredReplicas{Models: []*llmgwv1.Model{h.model},
		Replicas: []*llmgwv1.Replica{{Id: "m-0", Uid: 7, Model: "m"}}}
	for _, a := range adapters {
		d.Adapters = append(d.Adapters, &llmgwv1.AdapterPlacement{Model: "m", Adapter: a, Replicas: []string{"m-0"}})
	}
	h.m.Apply(d)
}

func (h *harness) engine(inc uint64) {
	h.m.Engine(&llmgwv1.ReplicaStatus{ReplicaId: "m-0", Uid: 7, Incarnation: inc, Model: "m",
		Phase: llmgwv1.ReplicaPhase_REPLICA_PHASE_READY, Address: h.eng.addr()}, h.model)
}

// states is the Full copy as adapter -> state.
func (h *harness) states() map[string]*llmgwv1.AdapterStatus {
	out := map[string]*llmgwv1.AdapterStatus{}
	for _, s := range h.m.Full() {
		out[s.GetAdapter()] = s
	}
	return out
}

func (h *harness) waitFor(what string, cond func() bool) {
	h.t.Helper()
	testkit.Wait(h.t, what, cond)
}

func (h *harness) waitState(adapter string, want llmgwv1.AdapterState) *llmgwv1.AdapterStatus {
	h.t.Helper()
	var st *llmgwv1.AdapterStatus
	h.waitFor(adapter+" "+want.String(), func() bool {
		st = h.states()[adapter]
		return st != nil && st.GetState() == want
	})
	return st
}

func TestPlacementsLoadedAndReported(t *testing.T) {
	h := start(t, newFakeEngine(t), 2)
	h.place("a", "b")
	h.engine(1)
	for _, a := range []string{"a", "b"} {
		st := h.waitState(a, llmgwv1.AdapterState_ADAPTER_STATE_LOADED)
		if st.GetReplicaId() != "m-0" || st.GetUid() != 7 || st.GetIncarnation() != 1 || st.GetLastActiveUnixNano() == 0 {
			t.Errorf("%s: %v", a, st)
		}
	}
	loaded, loads, _ := h.eng.state()
	if !slices.Equal(loaded, []string{"a", "b"}) || loads["a"] != 1 || loads["b"] != 1 {
		t.Errorf("engine holds %v after loads %v", loaded, loads)
	}
	// A delta after the full copy carries nothing new.
	if ch := h.m.Changes(); len(ch) != 0 {
		t.Errorf("changes after a full copy: %v", ch)
	}
}

// TestRemovedUnloadedWhenIdleOnly: an adapter taken out of the placement
// is UNLOADING; while the engine reports requests for it, it stays loaded
// past the grace; once idle for the grace, it is unloaded and reported
// gone.
func TestRemovedUnloadedWhenIdleOnly(t *testing.T) {
	// The bound on putting an unload off is beyond the test's clock.
	h := start(t, newFakeEngine(t), 2, func(c *Config) { c.UnloadDeferMax = 24 * time.Hour })
	h.place("a", "b")
	h.engine(1)
	h.waitState("a", llmgwv1.AdapterState_ADAPTER_STATE_LOADED)
	h.waitState("b", llmgwv1.AdapterState_ADAPTER_STATE_LOADED)
	h.eng.setRunning("a")
	h.waitFor("a active", func() bool { return h.states()["a"].GetActive() == 1 })
	h.m.Changes()

	h.place("b")
	h.waitState("a", llmgwv1.AdapterState_ADAPTER_STATE_UNLOADING)
	h.clock.advance(2 * time.Hour)
	// Several scrapes later it is still held: it is busy.
	h.waitFor("scrapes", func() bool {
		return time.Now().Add(2*time.Hour).Sub(time.Unix(0, h.states()["a"].GetLastActiveUnixNano())) < time.Minute
	})
	if _, _, unloads := h.eng.state(); unloads["a"] != 0 {
		t.Fatal("a busy adapter was unloaded")
	}
	h.eng.setRunning()
	h.waitFor("a idle", func() bool { return h.states()["a"].GetActive() == 0 })
	h.clock.advance(2 * time.Hour)
	h.waitFor("a gone", func() bool { _, ok := h.states()["a"]; return !ok })
	loaded, _, unloads := h.eng.state()
	if unloads["a"] != 1 || !slices.Equal(loaded, []string{"b"}) {
		t.Errorf("engine holds %v after unloads %v", loaded, unloads)
	}
	if st := h.states()["b"]; st.GetState() != llmgwv1.AdapterState_ADAPTER_STATE_LOADED {
		t.Errorf("b: %v", st)
	}
}

// fullEngine is an engine of --max-loras 2 holding a and b, placed and
// loaded by a manager with opts.
func fullEngine(t *testing.T, opts ...func(*Config)) (*fakeEngine, *harness) {
	t.Helper()
	eng := newFakeEngine(t)
	eng.max = 2
	h := start(t, eng, 2, opts...)
	h.place("a", "b")
	h.engine(1)
	h.waitState("a", llmgwv1.AdapterState_ADAPTER_STATE_LOADED)
	h.waitState("b", llmgwv1.AdapterState_ADAPTER_STATE_LOADED)
	return eng, h
}

// wantAReplacedByC fails t unless the engine unloaded a once and holds b
// and c.
func wantAReplacedByC(t *testing.T, eng *fakeEngine) {
	t.Helper()
	if loaded, _, unloads := eng.state(); unloads["a"] != 1 || !slices.Equal(loaded, []string{"b", "c"}) {
		t.Errorf("engine holds %v after unloads %v", loaded, unloads)
	}
}

// TestUnloadReadsTheEngineFirst: an adapter removed to make room, idle in
// the latest reading but busy in the engine now (a burst routed since the
// reading), is not unloaded: the fresh reading just before the unload
// shows it busy. Once the engine is idle it is unloaded and the new one
// loaded.
func TestUnloadReadsTheEngineFirst(t *testing.T) {
	eng, h := fullEngine(t, func(c *Config) { c.ScrapeInterval = time.Hour })
	if st := h.states()["a"]; st.GetActive() != 0 {
		t.Fatalf("a active in the reading: %v", st)
	}
	eng.setRunning("a") // after the last reading
	h.place("b", "c")
	h.waitFor("a's unload deferred", func() bool {
		return testkit.Metric(t, h.reg, "llmgw_agent_adapter_unloads_deferred_total", nil) >= 1
	})
	if _, _, unloads := eng.state(); unloads["a"] != 0 {
		t.Fatal("a was unloaded while the engine ran a request for it")
	}
	if st := h.states()["a"]; st.GetActive() == 0 {
		t.Errorf("a deferred but reported idle: %v", st)
	}
	eng.setRunning()
	h.clock.advance(2 * time.Hour) // the next reading, and the recheck
	h.waitState("c", llmgwv1.AdapterState_ADAPTER_STATE_LOADED)
	wantAReplacedByC(t, eng)
}

// TestUnloadCheckJudgesIdleEngine (issue 27): an engine whose activity
// metric still names an adapter while nothing runs or waits in it — vLLM's
// gauge keeps its last series, and some engines' never returns to idle. The
// periodic reading already took that for idle; the reading just before
// the unload must judge it the same way, or it puts the unload off for
// ever (164 times in the issue) and the adapter waiting for the slot is
// never loaded. The clock does not move: the bound on putting it off is
// not what lets it through.
func TestUnloadCheckJudgesIdleEngine(t *testing.T) {
	eng, h := fullEngine(t)
	eng.mu.Lock()
	eng.stuck = []string{"a"} // named, but the engine runs nothing
	eng.mu.Unlock()
	h.place("b", "c")
	h.waitState("c", llmgwv1.AdapterState_ADAPTER_STATE_LOADED)
	if n := testkit.Metric(t, h.reg, "llmgw_agent_adapter_unloads_deferred_total", nil); n != 0 {
		t.Errorf("the unload of a was put off %v times with the engine idle", n)
	}
	wantAReplacedByC(t, eng)
}

// TestStuckBusyUnloadedPastTheBound (issue 27): the engine is busy and its
// activity metric names the adapter removed to make room — stuck, or
// requests of a router that did not learn of the removal. The unload is
// put off, but not past UnloadDeferMax after the removal: then the
// adapter is unloaded, the one waiting for the slot loaded, and the
// overdue unload counted.
func TestStuckBusyUnloadedPastTheBound(t *testing.T) {
	eng, h := fullEngine(t)
	eng.setRunning("a")
	h.place("b", "c")
	h.waitFor("a's unload put off", func() bool {
		return testkit.Metric(t, h.reg, "llmgw_agent_adapter_unloads_deferred_total", nil) >= 1
	})
	if _, _, unloads := eng.state(); unloads["a"] != 0 {
		t.Fatal("a was unloaded within the bound while the engine's reading showed it busy")
	}
	h.clock.advance(DefaultConfig().UnloadDeferMax)
	h.waitState("c", llmgwv1.AdapterState_ADAPTER_STATE_LOADED)
	wantAReplacedByC(t, eng)
	if n := testkit.Metric(t, h.reg, "llmgw_agent_adapter_unloads_overdue_total", nil); n != 1 {
		t.Errorf("overdue unloads %v, want 1", n)
	}
}

func TestRemovalReportedInDelta(t *testing.T) {
	h := start(t, newFakeEngine(t), 2)
	h.place("a")
	h.engine(1)
	h.waitState("a", llmgwv1.AdapterState_ADAPTER_STATE_LOADED)
	h.m.Changes()
	h.place()
	h.clock.advance(2 * time.Hour)
	var seen []llmgwv1.AdapterState
	h.waitFor("removal in a delta", func() bool {
		for _, s := range h.m.Changes() {
			seen = append(seen, s.GetState())
		}
		return slices.Contains(seen, llmgwv1.AdapterState_ADAPTER_STATE_UNSPECIFIED)
	})
	if seen[0] != llmgwv1.AdapterState_ADAPTER_STATE_UNLOADING && seen[0] != llmgwv1.AdapterState_ADAPTER_STATE_UNSPECIFIED {
		t.Errorf("deltas %v", seen)
	}
}

func TestReloadAfterRestart(t *testing.T) {
	eng := newFakeEngine(t)
	h := start(t, eng, 2)
	h.place("a", "b")
	h.engine(1)
	h.waitState("a", llmgwv1.AdapterState_ADAPTER_STATE_LOADED)
	h.waitState("b", llmgwv1.AdapterState_ADAPTER_STATE_LOADED)
	// The engine restarts: a new process holds nothing.
	eng.mu.Lock()
	eng.loaded = nil
	eng.mu.Unlock()
	h.engine(2)
	h.waitFor("reloaded under incarnation 2", func() bool {
		s := h.states()
		return s["a"].GetIncarnation() == 2 && s["a"].GetState() == llmgwv1.AdapterState_ADAPTER_STATE_LOADED &&
			s["b"].GetIncarnation() == 2 && s["b"].GetState() == llmgwv1.AdapterState_ADAPTER_STATE_LOADED
	})
	if loaded, loads, _ := eng.state(); !slices.Equal(loaded, []string{"a", "b"}) || loads["a"] != 2 || loads["b"] != 2 {
		t.Errorf("engine holds %v after loads %v", loaded, loads)
	}
}

// TestAdoptedEngineNotLoadedTwice: what an engine already holds is listed
// and reported, not loaded again; with max_loaded_adapters 0 nothing is
// loaded or unloaded at all.
func TestAdoptedEngineNotLoadedTwice(t *testing.T) {
	for _, n := range []uint32{2, 0} {
		eng := newFakeEngine(t, "a", "c")
		h := start(t, eng, n)
		h.place("a")
		h.engine(3)
		h.waitState("a", llmgwv1.AdapterState_ADAPTER_STATE_LOADED)
		if n == 0 {
			h.waitState("c", llmgwv1.AdapterState_ADAPTER_STATE_LOADED)
			h.clock.advance(2 * time.Hour)
			time.Sleep(50 * time.Millisecond) // a few steps in which nothing may happen
		} else {
			h.clock.advance(2 * time.Hour)
			h.waitFor("c unloaded", func() bool { _, ok := h.states()["c"]; return !ok })
		}
		_, loads, unloads := eng.state()
		if loads["a"] != 0 || (n == 0 && unloads["c"] != 0) {
			t.Errorf("N=%d: loads %v unloads %v", n, loads, unloads)
		}
	}
}

func TestLoadFailures(t *testing.T) {
	for _, tc := range []struct {
		name      string
		code      int
		retryable bool
	}{
		{"missing path", 404, false},
		{"bad input", 400, false},
		{"engine error", 500, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := newFakeEngine(t)
			eng.fail["a"] = tc.code
			h := start(t, eng, 2)
			h.place("a")
			h.engine(1)
			st := h.waitState("a", llmgwv1.AdapterState_ADAPTER_STATE_FAILED)
			if !strings.Contains(st.GetReason(), fmt.Sprint(tc.code)) || !strings.Contains(st.GetReason(), "No adapter found for /ad/a") ||
				st.GetRetryAfterUnixNano() <= h.clock.now().UnixNano() {
				t.Errorf("status %v", st)
			}
			h.clock.advance(5 * time.Hour) // past any retry delay
			if tc.retryable {
				h.waitFor("a retry", func() bool { _, loads, _ := eng.state(); return loads["a"] >= 2 })
			} else {
				time.Sleep(50 * time.Millisecond) // steps in which it may not be retried
				if _, loads, _ := eng.state(); loads["a"] != 1 {
					t.Errorf("a 4xx load was retried: %d loads", loads["a"])
				}
			}
			// Withdrawn, the failed placement is no longer reported.
			h.place()
			h.waitFor("a gone", func() bool { _, ok := h.states()["a"]; return !ok })
		})
	}
}

func TestNotInModelFails(t *testing.T) {
	h := start(t, newFakeEngine(t), 2)
	h.place("zzz")
	h.engine(1)
	st := h.waitState("zzz", llmgwv1.AdapterState_ADAPTER_STATE_FAILED)
	if !strings.Contains(st.GetReason(), "not one of model") {
		t.Errorf("status %v", st)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		mut  func(*Config)
		want string
	}{
		{func(c *Config) {}, ""},
		{func(c *Config) { c.IdleGrace = -1 }, "idle_grace"},
		{func(c *Config) { c.RetryInitial, c.RetryMax = time.Hour, time.Minute }, "retry_initial"},
	} {
		c := DefaultConfig()
		tc.mut(&c)
		err := c.Validate()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%v, want %q", err, tc.want)
		}
	}
}

// TestEvictionMakesRoomAtOnce: the control plane evicts a (it judged it
// idle) and places c on a replica at max_loaded_adapters. The agent must
// unload a first, without its IdleGrace (an hour here), and load c at once;
// while a is busy c waits in LOADING, never FAILED (the plane would answer
// failed and the router 503 until the retry delay, an hour here); a load
// the engine refuses as full is tried again as soon as the unload is done.
// IdleGrace still holds for a removal no load needs room from.
func TestEvictionMakesRoomAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		// engineMax is the engine's --max-loras, modelMax the model's N:
		// an engine stricter than the model refuses a load the count
		// allows.
		engineMax, modelMax uint32
		busy                bool // a is running when it is evicted
		place               []string
		wantLoadsC          int
		wantRefusedFirst    bool // c's first load is refused as full
		wantUnloadA         bool // a is unloaded without the clock moving
	}{
		{name: "idle evicted adapter unloaded, then loaded", engineMax: 2, modelMax: 2, place: []string{"b", "c"},
			wantLoadsC: 1, wantUnloadA: true},
		{name: "busy evicted adapter: the load waits in LOADING", engineMax: 2, modelMax: 2, busy: true, place: []string{"b", "c"},
			wantLoadsC: 1, wantUnloadA: true},
		{name: "refused as full: loaded after the unload", engineMax: 2, modelMax: 3, busy: true, place: []string{"b", "c"},
			wantLoadsC: 2, wantRefusedFirst: true, wantUnloadA: true},
		{name: "removal without a load to make room for keeps the grace", engineMax: 2, modelMax: 2, place: []string{"b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := newFakeEngine(t)
			eng.max = int(tc.engineMax)
			h := start(t, eng, tc.modelMax)
			h.place("a", "b")
			h.engine(1)
			h.waitState("a", llmgwv1.AdapterState_ADAPTER_STATE_LOADED)
			h.waitState("b", llmgwv1.AdapterState_ADAPTER_STATE_LOADED)
			if tc.busy {
				eng.setRunning("a")
				h.waitFor("a active", func() bool { return h.states()["a"].GetActive() == 1 })
			}
			h.place(tc.place...)
			var seen []llmgwv1.AdapterState
			record := func() map[string]*llmgwv1.AdapterStatus {
				s := h.states()
				if st, ok := s["c"]; ok && (len(seen) == 0 || seen[len(seen)-1] != st.GetState()) {
					seen = append(seen, st.GetState())
				}
				return s
			}
			if tc.busy {
				h.waitFor("a UNLOADING", func() bool {
					return record()["a"].GetState() == llmgwv1.AdapterState_ADAPTER_STATE_UNLOADING
				})
				if tc.wantRefusedFirst {
					h.waitFor("c refused", func() bool { record(); _, loads, _ := eng.state(); return loads["c"] == 1 })
				}
				// Several scrapes while a is busy: nothing unloads it.
				for range 5 {
					record()
					time.Sleep(20 * time.Millisecond)
				}
				if _, _, unloads := eng.state(); unloads["a"] != 0 {
					t.Fatal("a busy adapter was unloaded")
				}
				eng.setRunning()
			}
			if !tc.wantUnloadA {
				for range 5 {
					time.Sleep(20 * time.Millisecond)
				}
				if st := h.states()["a"]; st.GetState() != llmgwv1.AdapterState_ADAPTER_STATE_UNLOADING {
					t.Fatalf("a within its grace: %v", st)
				}
				h.clock.advance(2 * time.Hour)
				h.waitFor("a unloaded after the grace", func() bool { _, ok := h.states()["a"]; return !ok })
				return
			}
			h.waitFor("c LOADED", func() bool {
				return record()["c"].GetState() == llmgwv1.AdapterState_ADAPTER_STATE_LOADED
			})
			if slices.Contains(seen, llmgwv1.AdapterState_ADAPTER_STATE_FAILED) {
				t.Errorf("c went through FAILED: %v", seen)
			}
			loaded, loads, unloads := eng.state()
			if !slices.Equal(loaded, []string{"b", "c"}) || loads["c"] != tc.wantLoadsC || unloads["a"] != 1 {
				t.Errorf("engine holds %v after loads %v unloads %v", loaded, loads, unloads)
			}
		})
	}
}
