package supervisor

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/agent/engine"
	"github.com/llmgw/llmgw/agent/internal/fakeengine"
	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// sleepLaunch plans a model with autoscale.sleep through the vLLM driver,
// the test binary as the engine: it serves vLLM's sleep endpoints (the
// driver sets VLLM_SERVER_DEV_MODE), and fails them while the returned
// file exists.
func sleepLaunch(t *testing.T, sleep bool) (l engine.Launch, rec, fail string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rec, fail = filepath.Join(dir, "record.jsonl"), filepath.Join(dir, "fail")
	l, err = engine.Plan(engine.Spec{
		Replica: &llmgwv1.Replica{Id: "demo-0", Uid: 9},
		Model: &llmgwv1.Model{Name: "demo", Engine: engine.VLLM, Model: "org/model",
			Autoscale: &llmgwv1.Autoscale{Max: 2, TargetWaiting: 1, Sleep: sleep}},
		Host: "127.0.0.1", Port: freePort(t), Command: []string{self},
		Env: map[string]string{fakeengine.EnvRecord: rec, fakeengine.EnvSleepFail: fail},
	})
	if err != nil {
		t.Fatal(err)
	}
	return l, rec, fail
}

// calls are the sleep-mode calls the fake engine answered.
func calls(t *testing.T, rec string) []string {
	t.Helper()
	rs, err := fakeengine.Read(rec)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range rs {
		if r.Call != "" {
			out = append(out, r.Call)
		}
	}
	return out
}

// last is the newest status reported.
func (r *recorder) last() *llmgwv1.ReplicaStatus {
	all := r.all()
	if len(all) == 0 {
		return nil
	}
	return all[len(all)-1]
}

func (r *recorder) lastIs(phase llmgwv1.ReplicaPhase, msg string) func() bool {
	return func() bool {
		st := r.last()
		return st != nil && st.GetPhase() == phase && strings.Contains(st.GetMessage(), msg)
	}
}

// TestSleepAndWake: a sleep-mode engine is put to sleep (level 1, mode
// abort) and reported SLEEPING, stays so while its probes pass, and is
// woken and reported READY again; a wake that fails is reported in the
// message, the phase kept, and retried until it succeeds.
func TestSleepAndWake(t *testing.T) {
	l, rec, fail := sleepLaunch(t, true)
	r := &recorder{}
	s, _ := run(t, testConfig(t, l), r)
	testkit.Wait(t, "READY", r.has(llmgwv1.ReplicaPhase_REPLICA_PHASE_READY))
	s.SetSleeping(true)
	testkit.Wait(t, "SLEEPING", r.lastIs(llmgwv1.ReplicaPhase_REPLICA_PHASE_SLEEPING, "asleep"))
	if got := calls(t, rec); len(got) != 1 || got[0] != "POST /sleep?level=1&mode=abort" {
		t.Errorf("calls %q, want one sleep at level 1 in mode abort", got)
	}
	n := len(r.all())
	// Probes pass while asleep: nothing changes.
	testkit.Wait(t, "a few probes", func() bool {
		return s.Status() != nil && time.Since(time.Unix(0, s.Status().GetUpdatedUnixNano())) > 5*testConfig(t, l).ProbeInterval
	})
	if got := len(r.all()); got != n {
		t.Errorf("statuses while asleep: %v", r.all()[n:])
	}
	if err := os.WriteFile(fail, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s.SetSleeping(false)
	testkit.Wait(t, "the failed wake reported", r.lastIs(llmgwv1.ReplicaPhase_REPLICA_PHASE_SLEEPING, "wake failed: POST /wake_up: 500"))
	if !strings.Contains(r.last().GetMessage(), "retrying in") {
		t.Errorf("message %q names no retry", r.last().GetMessage())
	}
	if err := os.Remove(fail); err != nil {
		t.Fatal(err)
	}
	testkit.Wait(t, "READY after the retry", r.lastIs(llmgwv1.ReplicaPhase_REPLICA_PHASE_READY, ""))
	if got := calls(t, rec); len(got) != 2 || got[1] != "POST /wake_up" {
		t.Errorf("calls %q, want the sleep then one wake", got)
	}
	if st := r.last(); st.GetIncarnation() != 1 || st.GetMessage() != "" {
		t.Errorf("awake: %v, want incarnation 1 and no message", st)
	}
}

// TestSleepWishBeforeReady: a wish to sleep set before the engine is ready
// is acted on once it is: the engine loads, then sleeps.
func TestSleepWishBeforeReady(t *testing.T) {
	l, rec, _ := sleepLaunch(t, true)
	r := &recorder{}
	s := New(testConfig(t, l), r.report, testLogger())
	s.SetSleeping(true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	testkit.Wait(t, "SLEEPING", r.lastIs(llmgwv1.ReplicaPhase_REPLICA_PHASE_SLEEPING, ""))
	if !r.has(llmgwv1.ReplicaPhase_REPLICA_PHASE_READY)() || len(calls(t, rec)) != 1 {
		t.Errorf("statuses %v, calls %q: want READY, then one sleep", r.all(), calls(t, rec))
	}
}

// logBuffer is a logger whose output a test can read.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestSleepWithoutSleepMode: an engine started without sleep mode is not
// asked to sleep; the agent says so in its log and keeps it READY.
func TestSleepWithoutSleepMode(t *testing.T) {
	l, rec, _ := sleepLaunch(t, false)
	r := &recorder{}
	logs := &logBuffer{}
	s := New(testConfig(t, l), r.report, slog.New(slog.NewTextHandler(logs, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	testkit.Wait(t, "READY", r.has(llmgwv1.ReplicaPhase_REPLICA_PHASE_READY))
	s.SetSleeping(true)
	testkit.Wait(t, "the warning", func() bool { return strings.Contains(logs.String(), "without sleep mode") })
	if st := r.last(); st.GetPhase() != llmgwv1.ReplicaPhase_REPLICA_PHASE_READY || len(calls(t, rec)) != 0 {
		t.Errorf("last status %v, calls %q: want READY and none", st, calls(t, rec))
	}
}

// TestAdoptedAsleepIsWoken: an engine a previous agent left asleep is
// reported SLEEPING from the start, not READY, and woken when it should be
// awake; the log says how long the first start took to become ready.
func TestAdoptedAsleepIsWoken(t *testing.T) {
	l, rec, _ := sleepLaunch(t, true)
	c := testConfig(t, l)
	r1 := &recorder{}
	logs := &logBuffer{}
	first := New(c, r1.report, slog.New(slog.NewTextHandler(logs, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- first.Run(ctx) }()
	testkit.Wait(t, "READY", r1.has(llmgwv1.ReplicaPhase_REPLICA_PHASE_READY))
	if !strings.Contains(logs.String(), `msg="engine ready"`) || !strings.Contains(logs.String(), "took=") {
		t.Errorf("no readiness line with its duration in:\n%s", logs.String())
	}
	pid := int(r1.last().GetPid())
	first.Detach()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The engine is put to sleep behind the agent's back, as an agent that
	// died after sleeping it would leave it.
	base := strings.TrimSuffix(l.HealthURL, "/health")
	resp, err := http.Post(base+"/sleep?level=1", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	start, err := ProcStartTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	c.Adopt = &Adoption{Pid: pid, StartTime: start, Incarnation: 1, Started: time.Now()}
	r2 := &recorder{}
	run(t, c, r2)
	testkit.Wait(t, "READY after the wake", r2.lastIs(llmgwv1.ReplicaPhase_REPLICA_PHASE_READY, ""))
	if first := r2.all()[0]; first.GetPhase() != llmgwv1.ReplicaPhase_REPLICA_PHASE_SLEEPING {
		t.Errorf("adopted asleep, first reported %v", first)
	}
	if got := calls(t, rec); len(got) != 2 || got[1] != "POST /wake_up" {
		t.Errorf("calls %q, want the outside sleep then the agent's wake", got)
	}
}
