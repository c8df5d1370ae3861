package supervisor

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/agent/engine"
	"github.com/llmgw/llmgw/agent/internal/fakeengine"
	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func TestMain(m *testing.M) {
	fakeengine.MaybeRun()
	goleak.VerifyTestMain(m)
}

func TestBackoffNext(t *testing.T) {
	b := Backoff{Initial: 500 * time.Millisecond, Max: 30 * time.Second, StableAfter: time.Minute}
	tests := []struct {
		name      string
		prev, ran time.Duration
		want      time.Duration
	}{
		{"first crash", 0, time.Second, 500 * time.Millisecond},
		{"second in a row doubles", 500 * time.Millisecond, time.Second, time.Second},
		{"capped", 20 * time.Second, time.Second, 30 * time.Second},
		{"stays capped", 30 * time.Second, 0, 30 * time.Second},
		{"stable run resets", 30 * time.Second, time.Minute, 500 * time.Millisecond},
	}
	for _, tt := range tests {
		if got := b.Next(tt.prev, tt.ran); got != tt.want {
			t.Errorf("%s: Next(%v, %v) = %v, want %v", tt.name, tt.prev, tt.ran, got, tt.want)
		}
	}
}

func TestLogRing(t *testing.T) {
	tests := []struct {
		name   string
		writes []string
		want   []string
	}{
		{"lines split across writes", []string{"a\nb", "c\n", "d"}, []string{"a", "bc"}},
		{"keeps the last n", []string{"1\n2\n3\n4\n5\n"}, []string{"3", "4", "5"}},
		{"crlf trimmed", []string{"x\r\n"}, []string{"x"}},
	}
	for _, tt := range tests {
		r := newLogRing(3)
		for _, w := range tt.writes {
			r.write([]byte(w))
		}
		if got := r.snapshot(); !slices.Equal(got, tt.want) {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
}

// recorder collects reported statuses for assertions.
type recorder struct {
	mu sync.Mutex
	st []*llmgwv1.ReplicaStatus
}

func (r *recorder) report(s *llmgwv1.ReplicaStatus) {
	r.mu.Lock()
	r.st = append(r.st, s)
	r.mu.Unlock()
}

func (r *recorder) all() []*llmgwv1.ReplicaStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.st)
}

func (r *recorder) has(phase llmgwv1.ReplicaPhase) func() bool {
	return func() bool {
		for _, s := range r.all() {
			if s.GetPhase() == phase {
				return true
			}
		}
		return false
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func testLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// fakeLaunch plans the model through its real driver, with the test binary
// as the engine program.
func fakeLaunch(t *testing.T, engineName, mode string) (engine.Launch, string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	rec := filepath.Join(t.TempDir(), "record.jsonl")
	l, err := engine.Plan(engine.Spec{
		Replica: &llmgwv1.Replica{Id: "demo-0", Uid: 9, GpuIndices: []uint32{1}},
		Model: &llmgwv1.Model{Name: "demo", Engine: engineName, Model: "org/model", KvEvents: engineName != engine.LlamaCpp,
			Adapters: []*llmgwv1.Adapter{{Name: "sql", Path: "/a/sql"}}},
		Host: "127.0.0.1", Port: freePort(t), KVEventsPort: freePort(t), KVReplayPort: freePort(t),
		Command: []string{self},
		Env:     map[string]string{fakeengine.EnvRecord: rec, fakeengine.EnvMode: mode},
	})
	if err != nil {
		t.Fatal(err)
	}
	return l, rec
}

func testConfig(t *testing.T, l engine.Launch) Config {
	c := DefaultConfig()
	c.ReplicaID, c.UID, c.Model, c.Node = "demo-0", 9, "demo", "n1"
	c.Launch = l
	c.LogPath = filepath.Join(t.TempDir(), "engine.log")
	c.ProbeInterval = 20 * time.Millisecond
	c.PollInterval = 10 * time.Millisecond
	c.StopGrace = 5 * time.Second
	c.Backoff = Backoff{Initial: 10 * time.Millisecond, Max: 40 * time.Millisecond, StableAfter: time.Hour}
	c.Pdeathsig = true
	return c
}

// run starts a supervisor and returns a stop function that cancels it and
// waits for Run to return.
func run(t *testing.T, c Config, rec *recorder) (*Supervisor, func()) {
	s := New(c, rec.report, testLogger())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	t.Cleanup(stop)
	return s, stop
}

// gone reports whether pid no longer runs (a zombie counts as gone: it
// holds no resources and its reaper may be a container's pid 1).
func gone(pid int) bool {
	if err := syscall.Kill(pid, 0); err == syscall.ESRCH {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] == "Z"
}

func records(t *testing.T, path string) []fakeengine.Record {
	t.Helper()
	rs, err := fakeengine.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// TestDriversThroughSupervisor runs each driver's launch through the real
// supervisor against the fake engine: what the engine saw must be exactly
// what the driver promised.
func TestDriversThroughSupervisor(t *testing.T) {
	for _, name := range []string{engine.VLLM, engine.LlamaCpp, engine.Sim} {
		t.Run(name, func(t *testing.T) {
			l, recPath := fakeLaunch(t, name, "")
			rec := &recorder{}
			s, stop := run(t, testConfig(t, l), rec)
			testkit.Wait(t, "READY", rec.has(llmgwv1.ReplicaPhase_REPLICA_PHASE_READY))
			rs := records(t, recPath)
			if len(rs) != 1 {
				t.Fatalf("%d starts recorded, want 1", len(rs))
			}
			if !slices.Equal(rs[0].Argv[1:], l.Argv[1:]) {
				t.Errorf("engine saw argv %q, driver promised %q", rs[0].Argv[1:], l.Argv[1:])
			}
			for _, kv := range l.Env {
				if !slices.Contains(rs[0].Env, kv) {
					t.Errorf("engine environment lacks %q", kv)
				}
			}
			st := s.Status()
			if st.GetAddress() != l.Address || st.GetPid() != int32(rs[0].Pid) || st.GetIncarnation() != 1 || st.GetUid() != 9 {
				t.Errorf("status %v does not describe the engine (pid %d, address %s)", st, rs[0].Pid, l.Address)
			}
			testkit.Wait(t, "engine output in the log ring", func() bool {
				return slices.ContainsFunc(s.Logs(), func(l string) bool { return strings.Contains(l, "fake engine starting") })
			})
			stop()
			if got := s.Status().GetPhase(); got != llmgwv1.ReplicaPhase_REPLICA_PHASE_STOPPED {
				t.Errorf("last phase %v, want STOPPED", got)
			}
			if !gone(rs[0].Pid) {
				t.Errorf("engine pid %d still runs after stop", rs[0].Pid)
			}
			if !rec.has(llmgwv1.ReplicaPhase_REPLICA_PHASE_STOPPING)() {
				t.Error("no STOPPING reported")
			}
		})
	}
}

func TestRestartsCrashedEngine(t *testing.T) {
	l, recPath := fakeLaunch(t, engine.VLLM, "crash")
	rec := &recorder{}
	_, stop := run(t, testConfig(t, l), rec)
	testkit.Wait(t, "three incarnations", func() bool {
		for _, s := range rec.all() {
			if s.GetIncarnation() >= 3 && s.GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_STARTING {
				return true
			}
		}
		return false
	})
	stop()
	sts := rec.all()
	var lastInc uint64
	var restarting int
	for _, s := range sts {
		if s.GetIncarnation() < lastInc {
			t.Errorf("incarnation went back from %d to %d", lastInc, s.GetIncarnation())
		}
		lastInc = s.GetIncarnation()
		if s.GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_RESTARTING {
			restarting++
			if s.GetRestarts() != uint32(restarting) {
				t.Errorf("RESTARTING #%d reports %d restarts", restarting, s.GetRestarts())
			}
			if !strings.Contains(s.GetMessage(), "exited with status 3") {
				t.Errorf("RESTARTING message %q lacks the exit status", s.GetMessage())
			}
		}
	}
	if restarting < 2 {
		t.Errorf("%d RESTARTING reports, want at least 2", restarting)
	}
	if n := len(records(t, recPath)); uint64(n) < lastInc-1 {
		t.Errorf("%d starts recorded for incarnation %d", n, lastInc)
	}
	for _, r := range records(t, recPath) {
		if !gone(r.Pid) {
			t.Errorf("pid %d still runs", r.Pid)
		}
	}
}

func TestStopKillsStuckEngineAndItsGroup(t *testing.T) {
	tests := []struct{ mode string }{{"ignore-term"}, {"child"}}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			l, recPath := fakeLaunch(t, engine.VLLM, tt.mode)
			rec := &recorder{}
			c := testConfig(t, l)
			c.StopGrace = 100 * time.Millisecond
			_, stop := run(t, c, rec)
			testkit.Wait(t, "READY", rec.has(llmgwv1.ReplicaPhase_REPLICA_PHASE_READY))
			if tt.mode == "child" {
				testkit.Wait(t, "grandchild", func() bool {
					return slices.ContainsFunc(records(t, recPath), func(r fakeengine.Record) bool { return r.Grandchild })
				})
			}
			stop()
			rs := records(t, recPath)
			for _, r := range rs {
				if !gone(r.Pid) {
					t.Errorf("pid %d (grandchild %v) still runs after stop", r.Pid, r.Grandchild)
				}
			}
			if !rec.has(llmgwv1.ReplicaPhase_REPLICA_PHASE_STOPPED)() {
				t.Error("no STOPPED reported")
			}
		})
	}
}

func TestNotReadyInTimeIsRestarted(t *testing.T) {
	l, _ := fakeLaunch(t, engine.VLLM, "unready")
	rec := &recorder{}
	c := testConfig(t, l)
	c.ReadyTimeout = 100 * time.Millisecond
	_, stop := run(t, c, rec)
	testkit.Wait(t, "RESTARTING", rec.has(llmgwv1.ReplicaPhase_REPLICA_PHASE_RESTARTING))
	stop()
	for _, s := range rec.all() {
		if s.GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_RESTARTING && !strings.Contains(s.GetMessage(), "not ready within") {
			t.Errorf("RESTARTING message %q does not say why", s.GetMessage())
		}
		if s.GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY {
			t.Error("an engine that never answered 200 was reported READY")
		}
	}
}

func TestMissingProgramFails(t *testing.T) {
	rec := &recorder{}
	c := testConfig(t, engine.Launch{Argv: []string{filepath.Join(t.TempDir(), "no-such-engine")}, Address: "127.0.0.1:1", HealthURL: "http://127.0.0.1:1/health"})
	_, stop := run(t, c, rec)
	testkit.Wait(t, "FAILED", rec.has(llmgwv1.ReplicaPhase_REPLICA_PHASE_FAILED))
	stop()
	if got := rec.all()[len(rec.all())-1].GetPhase(); got != llmgwv1.ReplicaPhase_REPLICA_PHASE_STOPPED {
		t.Errorf("last phase %v, want STOPPED", got)
	}
}

// TestExternalIsProbedOnly: an external engine is probed at /health and
// /v1/models, READY only while it serves the model's name, UNHEALTHY after
// failed probes, and READY again as a new incarnation when it comes back.
// TestReportsMaxModelLen: the READY status carries the context length the
// engine's own /v1/models card gives (vLLM's max_model_len), for engines
// llmgw runs and external ones; 0 when the card has none or a value no
// engine could have. Routers show it in their model cards.
func TestReportsMaxModelLen(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	runBy := func(engineName string, extra []string) func(t *testing.T) engine.Launch {
		return func(t *testing.T) engine.Launch {
			l, err := engine.Plan(engine.Spec{
				Replica: &llmgwv1.Replica{Id: "demo-0", Uid: 9, GpuIndices: []uint32{1}},
				Model:   &llmgwv1.Model{Name: "demo", Engine: engineName, Model: "org/model", ExtraArgs: extra},
				Host:    "127.0.0.1", Port: freePort(t), KVEventsPort: freePort(t), KVReplayPort: freePort(t),
				Command: []string{self},
				Env:     map[string]string{fakeengine.EnvRecord: filepath.Join(t.TempDir(), "record.jsonl")},
			})
			if err != nil {
				t.Fatal(err)
			}
			return l
		}
	}
	external := func(card string) func(t *testing.T) engine.Launch {
		return func(t *testing.T) engine.Launch {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/v1/models" {
					fmt.Fprintf(w, `{"object":"list","data":[{"id":"other","max_model_len":99},%s]}`, card)
				}
			}))
			t.Cleanup(srv.Close)
			l, err := engine.Plan(engine.Spec{Replica: &llmgwv1.Replica{Id: "demo-0", Endpoint: srv.URL},
				Model: &llmgwv1.Model{Name: "demo", Engine: engine.External, Endpoints: []string{srv.URL}}})
			if err != nil {
				t.Fatal(err)
			}
			return l
		}
	}
	tests := []struct {
		name       string
		launch     func(*testing.T) engine.Launch
		want       uint32
		wantBlocks uint64 // the cache size from the engine's metrics (engines llmgw runs)
	}{
		{"vllm started with --max-model-len", runBy(engine.VLLM, []string{"--max-model-len=4096"}), 4096, 0},
		{"vllm whose card has null", runBy(engine.VLLM, nil), 0, 0},
		{"vllm publishing its cache size", runBy(engine.VLLM, []string{"--num-gpu-blocks-override=2048"}), 0, 2048},
		{"llama.cpp (no max_model_len on its card)", runBy(engine.LlamaCpp, nil), 0, 0},
		{"external vLLM", external(`{"id":"demo","max_model_len":32768}`), 32768, 0},
		{"external without max_model_len", external(`{"id":"demo"}`), 0, 0},
		{"external with a negative one", external(`{"id":"demo","max_model_len":-1}`), 0, 0},
		{"external past uint32", external(`{"id":"demo","max_model_len":4294967296}`), 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recorder{}
			_, stop := run(t, testConfig(t, tt.launch(t)), rec)
			testkit.Wait(t, "READY", rec.has(llmgwv1.ReplicaPhase_REPLICA_PHASE_READY))
			stop()
			for _, s := range rec.all() {
				if s.GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY && s.GetMaxModelLen() != tt.want {
					t.Errorf("READY with max_model_len %d, want %d", s.GetMaxModelLen(), tt.want)
				}
				if s.GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY && s.GetKvCacheBlocks() != tt.wantBlocks {
					t.Errorf("READY with kv_cache_blocks %d, want %d", s.GetKvCacheBlocks(), tt.wantBlocks)
				}
			}
		})
	}
}

func TestExternalIsProbedOnly(t *testing.T) {
	var mu sync.Mutex
	healthy, served := true, "other"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case !healthy:
			w.WriteHeader(http.StatusServiceUnavailable)
		case r.URL.Path == "/v1/models":
			fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model"}]}`, served)
		}
	}))
	defer srv.Close()
	set := func(h bool, s string) {
		mu.Lock()
		defer mu.Unlock()
		healthy, served = h, s
	}
	l, err := engine.Plan(engine.Spec{Replica: &llmgwv1.Replica{Id: "ext-0", Endpoint: srv.URL + "/v1"},
		Model: &llmgwv1.Model{Name: "ext", Engine: engine.External, Endpoints: []string{srv.URL + "/v1"}}})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	_, stop := run(t, testConfig(t, l), rec)
	testkit.Wait(t, "a STARTING that says the model is not served", func() bool {
		for _, s := range rec.all() {
			if s.GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_STARTING && strings.Contains(s.GetMessage(), `does not serve model "ext" (it serves "other")`) {
				return true
			}
		}
		return false
	})
	set(true, "ext")
	testkit.Wait(t, "READY", rec.has(llmgwv1.ReplicaPhase_REPLICA_PHASE_READY))
	set(false, "ext")
	testkit.Wait(t, "UNHEALTHY", rec.has(llmgwv1.ReplicaPhase_REPLICA_PHASE_UNHEALTHY))
	set(true, "ext")
	testkit.Wait(t, "READY as incarnation 2", func() bool {
		all := rec.all()
		last := all[len(all)-1]
		return last.GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY && last.GetIncarnation() == 2
	})
	stop()
	for _, s := range rec.all() {
		if s.GetAddress() != strings.TrimPrefix(srv.URL, "http://") {
			t.Errorf("address %q, want the endpoint's", s.GetAddress())
		}
		if s.GetPid() != 0 {
			t.Errorf("pid %d for an engine llmgw does not run", s.GetPid())
		}
	}
}
