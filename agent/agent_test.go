package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/llmgw/llmgw/agent/datadir"
	"github.com/llmgw/llmgw/agent/internal/fakeengine"
	"github.com/llmgw/llmgw/agent/supervisor"
	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func TestMain(m *testing.M) {
	fakeengine.MaybeRun()
	goleak.VerifyTestMain(m,
		// kv_test.go stands in for an engine's KV publisher with a zmq4
		// PUB socket; zmq4 v0.17.0 starts a writer goroutine per PUB
		// socket that Close never stops. The agent opens no PUB socket.
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}

// fakeControl is an in-test control node: it records what the agent sends
// and lets the test push desired sets and full-copy requests.
type fakeControl struct {
	llmgwv1.UnimplementedAgentServiceServer
	id     string
	addr   string
	srv    *grpc.Server
	push   chan *llmgwv1.ControlMessage
	silent atomic.Bool
	wg     sync.WaitGroup

	mu      sync.Mutex
	hellos  []*llmgwv1.AgentHello
	updates []*llmgwv1.EphemeralUpdate
	beats   int
}

func startFakeControl(t *testing.T, id string, opts ...grpc.ServerOption) *fakeControl {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeControl{id: id, addr: ln.Addr().String(), srv: grpc.NewServer(opts...), push: make(chan *llmgwv1.ControlMessage, 16)}
	llmgwv1.RegisterAgentServiceServer(f.srv, f)
	f.wg.Add(1)
	go func() { defer f.wg.Done(); _ = f.srv.Serve(ln) }()
	t.Cleanup(f.stop)
	return f
}

func (f *fakeControl) stop() {
	f.srv.Stop()
	f.wg.Wait()
}

func (f *fakeControl) Attach(stream llmgwv1.AgentService_AttachServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.hellos = append(f.hellos, first.GetHello())
	f.mu.Unlock()
	if err := stream.Send(&llmgwv1.ControlMessage{Body: &llmgwv1.ControlMessage_Welcome{Welcome: &llmgwv1.Welcome{
		SessionId: "s-" + f.id, ServerId: f.id}}}); err != nil {
		return err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			f.mu.Lock()
			if u := m.GetUpdate(); u != nil {
				f.updates = append(f.updates, u)
			}
			if m.GetHeartbeat() != nil {
				f.beats++
			}
			f.mu.Unlock()
		}
	}()
	hb := time.NewTicker(20 * time.Millisecond)
	defer hb.Stop()
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case m := <-f.push:
			if err := stream.Send(m); err != nil {
				return err
			}
		case <-hb.C:
			if f.silent.Load() {
				continue
			}
			if err := stream.Send(&llmgwv1.ControlMessage{Body: &llmgwv1.ControlMessage_Heartbeat{Heartbeat: &llmgwv1.Heartbeat{}}}); err != nil {
				return err
			}
		}
	}
}

func (f *fakeControl) snapshot() ([]*llmgwv1.AgentHello, []*llmgwv1.EphemeralUpdate) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.hellos), slices.Clone(f.updates)
}

func desired(rev uint64, reps ...*llmgwv1.Replica) *llmgwv1.ControlMessage {
	return &llmgwv1.ControlMessage{Body: &llmgwv1.ControlMessage_Desired{Desired: &llmgwv1.DesiredReplicas{
		Revision: rev, Replicas: reps,
		Models: []*llmgwv1.Model{{Name: "demo", Engine: "sim", Model: "org/demo", Replicas: 1}},
	}}}
}

func testConfig(t *testing.T, control ...string) Config {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c := DefaultConfig()
	c.NodeID = "n1"
	c.Control = control
	c.DataDir = t.TempDir()
	c.HTTPAddr = "127.0.0.1:0"
	c.GRPCAddr = "127.0.0.1:0"
	c.GPUs = 2
	c.Version = "test"
	c.PortRange = PortRange{Start: 31000, End: 31999}
	c.Engines = map[string]EngineConfig{"sim": {Command: []string{self},
		Env: map[string]string{fakeengine.EnvRecord: filepath.Join(c.DataDir, "engine.jsonl")}}}
	c.StopEnginesOnExit = true
	c.StopGrace = 5 * time.Second
	c.HeartbeatInterval = 100 * time.Millisecond
	c.ProbeInterval = 20 * time.Millisecond
	c.RestartBackoff = supervisor.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond, StableAfter: time.Hour}
	c.ReconnectInitial, c.ReconnectMax = 10*time.Millisecond, 50*time.Millisecond
	c.Jitter = func() float64 { return 0.5 }
	return c
}

func startAgent(t *testing.T, c Config) (*Agent, func()) {
	t.Helper()
	a, err := New(c, slog.New(slog.NewTextHandler(testLogOut, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return a, stop
}

// checkOrder verifies the numbering rule of design §5.4 on one session's
// updates: full copy with seq 1 first, then seq+1 each.
func checkOrder(t *testing.T, ups []*llmgwv1.EphemeralUpdate, epoch uint64) {
	t.Helper()
	var want uint64 = 1
	for i, u := range ups {
		if u.GetEpoch() != epoch {
			continue
		}
		if u.GetSeq() != want {
			t.Errorf("update %d has seq %d, want %d", i, u.GetSeq(), want)
		}
		if want == 1 && !u.GetFull() {
			t.Errorf("first update of epoch %d is not a full copy", epoch)
		}
		if u.GetNode() != "n1" {
			t.Errorf("update node %q", u.GetNode())
		}
		want = u.GetSeq() + 1
	}
}

// latest folds one epoch's updates (every epoch's, in order, for 0) into
// the replica statuses they describe. Epochs only grow and each session
// starts with a full copy, so folding across sessions is sound.
func latest(ups []*llmgwv1.EphemeralUpdate, epoch uint64) map[string]*llmgwv1.ReplicaStatus {
	out := map[string]*llmgwv1.ReplicaStatus{}
	for _, u := range ups {
		if epoch != 0 && u.GetEpoch() != epoch {
			continue
		}
		if u.GetFull() {
			clear(out)
		}
		for _, s := range u.GetStatuses() {
			out[s.GetReplicaId()] = s
		}
		for _, id := range u.GetRemovedReplicas() {
			delete(out, id)
		}
	}
	return out
}

func TestSessionRunsDesiredReplicas(t *testing.T) {
	ctl := startFakeControl(t, "c1")
	c := testConfig(t, ctl.addr)
	a, stop := startAgent(t, c)
	testkit.Wait(t, "hello and first update", func() bool { h, u := ctl.snapshot(); return len(h) == 1 && len(u) >= 1 })
	hellos, _ := ctl.snapshot()
	h := hellos[0]
	if h.GetEpoch() == 0 || h.GetNode().GetId() != "n1" || h.GetNode().GetGpus() != 2 || h.GetNode().GetAgentHttpAddr() != a.HTTPAddr() {
		t.Fatalf("hello %v", h)
	}
	b, err := os.ReadFile(filepath.Join(c.DataDir, "epoch"))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := datadir.ParseEpoch(b); got != h.GetEpoch() {
		t.Fatalf("persisted epoch %d, hello carried %d", got, h.GetEpoch())
	}

	ctl.push <- desired(10, &llmgwv1.Replica{Id: "demo-0", Uid: 5, Model: "demo", Node: "n1", GpuIndices: []uint32{1}})
	ready := func(uid uint64) func() bool {
		return func() bool {
			_, ups := ctl.snapshot()
			s := latest(ups, 0)["demo-0"]
			return s.GetUid() == uid && s.GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY && s.GetAddress() != ""
		}
	}
	testkit.Wait(t, "demo-0 READY", ready(5))
	_, ups := ctl.snapshot()
	st := latest(ups, 0)["demo-0"]
	if !strings.HasPrefix(st.GetAddress(), "127.0.0.1:31") || st.GetIncarnation() != 1 || st.GetPid() == 0 {
		t.Errorf("status %v", st)
	}
	resp, err := http.Get("http://" + a.HTTPAddr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/readyz %d while attached", resp.StatusCode)
	}

	// A full copy on request, numbered next.
	ctl.push <- &llmgwv1.ControlMessage{Body: &llmgwv1.ControlMessage_FullCopyRequest{FullCopyRequest: &llmgwv1.FullCopyRequest{Reason: "test"}}}
	testkit.Wait(t, "second full copy", func() bool {
		_, ups := ctl.snapshot()
		return slices.ContainsFunc(ups[1:], func(u *llmgwv1.EphemeralUpdate) bool { return u.GetFull() })
	})

	// Re-placed under a new uid: a new engine, a new placement.
	firstPid := st.GetPid()
	ctl.push <- desired(11, &llmgwv1.Replica{Id: "demo-0", Uid: 8, Model: "demo", Node: "n1"})
	testkit.Wait(t, "demo-0 uid 8 READY", ready(8))
	_, ups = ctl.snapshot()
	if pid := latest(ups, 0)["demo-0"].GetPid(); pid == firstPid {
		t.Errorf("new uid kept the old engine pid %d", pid)
	}

	// Gone from the desired set: stopped, then removed.
	ctl.push <- desired(12)
	testkit.Wait(t, "demo-0 removed", func() bool {
		_, ups := ctl.snapshot()
		return slices.ContainsFunc(ups, func(u *llmgwv1.EphemeralUpdate) bool { return slices.Contains(u.GetRemovedReplicas(), "demo-0") })
	})
	hellos, ups = ctl.snapshot()
	// A slow machine may have dropped and renewed the session meanwhile;
	// every session must follow the numbering rule.
	for _, h := range hellos {
		checkOrder(t, ups, h.GetEpoch())
	}
	if _, ok := latest(ups, 0)["demo-0"]; ok {
		t.Error("removed replica still in the agent's reported state")
	}
	recs, err := fakeengine.Read(filepath.Join(c.DataDir, "engine.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 {
		t.Errorf("%d engine starts, want 2", len(recs))
	}
	for _, r := range recs {
		if !slices.Contains(r.Argv, "--served-model-name=demo") {
			t.Errorf("engine argv %q", r.Argv)
		}
		if err := syscall.Kill(r.Pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("engine pid %d still exists after removal", r.Pid)
		}
	}
	stop()
}

func TestFailoverToNextServer(t *testing.T) {
	tests := []struct {
		name string
		// kill makes the first server fail in its own way.
		kill func(*fakeControl)
	}{
		{"server stops", func(f *fakeControl) { f.srv.Stop() }},
		{"server goes silent", func(f *fakeControl) { f.silent.Store(true) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			first, second := startFakeControl(t, "c1"), startFakeControl(t, "c2")
			c := testConfig(t, first.addr, second.addr)
			a, stop := startAgent(t, c)
			testkit.Wait(t, "attach to first", func() bool { _, u := first.snapshot(); return len(u) >= 1 })
			first.push <- desired(3, &llmgwv1.Replica{Id: "demo-0", Uid: 2, Model: "demo", Node: "n1"})
			testkit.Wait(t, "replica READY", func() bool {
				_, ups := first.snapshot()
				return latest(ups, 0)["demo-0"].GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY
			})
			tt.kill(first)
			testkit.Wait(t, "full copy at second", func() bool { _, u := second.snapshot(); return len(u) >= 1 })
			h1, _ := first.snapshot()
			h2, ups := second.snapshot()
			if h2[0].GetEpoch() <= h1[0].GetEpoch() {
				t.Errorf("epoch did not increase across sessions: %d then %d", h1[0].GetEpoch(), h2[0].GetEpoch())
			}
			// Cut off, the agent kept running its replica, and tells the
			// new server about it.
			if s := latest(ups, 0)["demo-0"]; s.GetPhase() != llmgwv1.ReplicaPhase_REPLICA_PHASE_READY {
				t.Errorf("full copy at second server: demo-0 is %v", s)
			}
			if len(h2[0].GetRunning()) != 1 {
				t.Errorf("hello at second server lists %d running replicas, want 1", len(h2[0].GetRunning()))
			}
			checkOrder(t, ups, h2[0].GetEpoch())
			if !a.Attached() {
				t.Error("not attached after failover")
			}
			stop()
		})
	}
}

func TestEnginesOutliveAgentUnlessAsked(t *testing.T) {
	for _, stopOnExit := range []bool{true, false} {
		t.Run(map[bool]string{true: "stop-engines-on-exit", false: "detach"}[stopOnExit], func(t *testing.T) {
			ctl := startFakeControl(t, "c1")
			c := testConfig(t, ctl.addr)
			c.StopEnginesOnExit = stopOnExit
			_, stop := startAgent(t, c)
			ctl.push <- desired(3, &llmgwv1.Replica{Id: "demo-0", Uid: 2, Model: "demo", Node: "n1"})
			var pid int32
			testkit.Wait(t, "replica READY", func() bool {
				_, ups := ctl.snapshot()
				if len(ups) == 0 {
					return false
				}
				s := latest(ups, 0)["demo-0"]
				pid = s.GetPid()
				return s.GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY
			})
			stop()
			alive := syscall.Kill(int(pid), 0) == nil
			if !stopOnExit {
				// Clean up the engine the agent left running on purpose.
				_ = syscall.Kill(-int(pid), syscall.SIGKILL)
				var ws syscall.WaitStatus
				_, _ = syscall.Wait4(int(pid), &ws, 0, nil)
			}
			if alive != !stopOnExit {
				t.Errorf("engine alive after agent exit = %v, want %v", alive, !stopOnExit)
			}
		})
	}
}

var testLogOut io.Writer = io.Discard
