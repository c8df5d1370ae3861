package session

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeControl is an in-test control node: it welcomes every session,
// records what the agent sends and lets the test push messages.
type fakeControl struct {
	llmgwv1.UnimplementedAgentServiceServer
	addr string
	srv  *grpc.Server
	push chan *llmgwv1.ControlMessage
	// silent: no welcome and no heartbeat, as a hung server.
	silent atomic.Bool
	// held, when above a session's epoch, is a newer session of the node
	// held here: its hello is refused, a running session ended, with
	// held in the trailer (as controlplane/service/agent does).
	held atomic.Uint64
	wg   sync.WaitGroup

	mu      sync.Mutex
	hellos  []*llmgwv1.AgentHello
	updates []*llmgwv1.EphemeralUpdate
}

func startFakeControl(t *testing.T) *fakeControl {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeControl{addr: ln.Addr().String(), srv: grpc.NewServer(), push: make(chan *llmgwv1.ControlMessage, 16)}
	llmgwv1.RegisterAgentServiceServer(f.srv, f)
	f.wg.Add(1)
	go func() { defer f.wg.Done(); _ = f.srv.Serve(ln) }()
	t.Cleanup(func() { f.srv.Stop(); f.wg.Wait() })
	return f
}

func (f *fakeControl) Attach(stream llmgwv1.AgentService_AttachServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.hellos = append(f.hellos, first.GetHello())
	f.mu.Unlock()
	if f.silent.Load() {
		<-stream.Context().Done()
		return nil
	}
	epoch := first.GetHello().GetEpoch()
	superseded := func() error {
		if held := f.held.Load(); held > epoch {
			stream.SetTrailer(metadata.Pairs(heldEpochTrailer, strconv.FormatUint(held, 10)))
			return status.Errorf(codes.Aborted, "a newer session (epoch %d)", held)
		}
		return nil
	}
	if err := superseded(); err != nil {
		return err
	}
	welcome := &llmgwv1.Welcome{SessionId: "s1", ServerId: "c1",
		Servers: []*llmgwv1.ControlServer{{GrpcAddr: f.addr}}}
	if err := stream.Send(&llmgwv1.ControlMessage{Body: &llmgwv1.ControlMessage_Welcome{Welcome: welcome}}); err != nil {
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
			if u := m.GetUpdate(); u != nil {
				f.mu.Lock()
				f.updates = append(f.updates, u)
				f.mu.Unlock()
			}
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
			if err := superseded(); err != nil {
				return err
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

// notifier is the token channel every source signals on.
type notifier struct{ ch chan struct{} }

func newNotifier() notifier                { return notifier{ch: make(chan struct{}, 1)} }
func (n notifier) Notify() <-chan struct{} { return n.ch }
func (n notifier) signal() {
	select {
	case n.ch <- struct{}{}:
	default:
	}
}

// fakeBook holds statuses by version, as replicas.Book does.
type fakeBook struct {
	notifier
	mu      sync.Mutex
	version uint64
	sts     map[string]*llmgwv1.ReplicaStatus
	vers    map[string]uint64
}

func (b *fakeBook) put(st *llmgwv1.ReplicaStatus) {
	b.mu.Lock()
	b.version++
	b.sts[st.GetReplicaId()], b.vers[st.GetReplicaId()] = st, b.version
	b.mu.Unlock()
	b.signal()
}

func (b *fakeBook) Snapshot() ([]*llmgwv1.ReplicaStatus, uint64) {
	ups, _, v := b.Since(0)
	return ups, v
}

func (b *fakeBook) Since(from uint64) ([]*llmgwv1.ReplicaStatus, []string, uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var ups []*llmgwv1.ReplicaStatus
	for id, v := range b.vers {
		if v > from {
			ups = append(ups, b.sts[id])
		}
	}
	return ups, nil, b.version
}

// fakeKV and fakeAdapters hand out what the test queued, once.
type fakeKV struct {
	notifier
	mu      sync.Mutex
	pending []*llmgwv1.KVBlocks
}

func (k *fakeKV) add(b *llmgwv1.KVBlocks) {
	k.mu.Lock()
	k.pending = append(k.pending, b)
	k.mu.Unlock()
	k.signal()
}
func (k *fakeKV) Full() []*llmgwv1.KVBlocks { return nil }
func (k *fakeKV) Changes() []*llmgwv1.KVBlocks {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := k.pending
	k.pending = nil
	return out
}
func (k *fakeKV) FlushIn() (time.Duration, bool) { return time.Millisecond, true }

type fakeAdapters struct {
	notifier
	mu      sync.Mutex
	pending []*llmgwv1.AdapterStatus
}

func (a *fakeAdapters) add(s *llmgwv1.AdapterStatus) {
	a.mu.Lock()
	a.pending = append(a.pending, s)
	a.mu.Unlock()
	a.signal()
}
func (a *fakeAdapters) Full() []*llmgwv1.AdapterStatus { return nil }
func (a *fakeAdapters) Changes() []*llmgwv1.AdapterStatus {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := a.pending
	a.pending = nil
	return out
}

type fakeReplicas struct {
	mu      sync.Mutex
	desired []*llmgwv1.DesiredReplicas
}

func (r *fakeReplicas) Apply(d *llmgwv1.DesiredReplicas) {
	r.mu.Lock()
	r.desired = append(r.desired, d)
	r.mu.Unlock()
}

func (r *fakeReplicas) revisions() []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []uint64
	for _, d := range r.desired {
		out = append(out, d.GetRevision())
	}
	return out
}

type fixture struct {
	client   *Client
	reg      *prometheus.Registry
	book     *fakeBook
	kv       *fakeKV
	adapters *fakeAdapters
	replicas *fakeReplicas
}

// startClient runs a client of control until the test ends.
func startClient(t *testing.T, control ...string) *fixture {
	t.Helper()
	f := &fixture{reg: prometheus.NewRegistry(),
		book:     &fakeBook{notifier: newNotifier(), sts: map[string]*llmgwv1.ReplicaStatus{}, vers: map[string]uint64{}},
		kv:       &fakeKV{notifier: newNotifier()},
		adapters: &fakeAdapters{notifier: newNotifier()},
		replicas: &fakeReplicas{}}
	cfg := Config{NodeID: "n1", Control: control, EpochPath: filepath.Join(t.TempDir(), "epoch"),
		HeartbeatInterval: 100 * time.Millisecond, ReconnectInitial: 10 * time.Millisecond, ReconnectMax: 50 * time.Millisecond,
		Jitter: func() float64 { return 0.5 }}
	deps := Deps{Node: func() *llmgwv1.Node { return &llmgwv1.Node{Id: "n1"} },
		Book: f.book, KV: f.kv, Adapters: f.adapters, Replicas: f.replicas}
	c, err := New(cfg, deps, slog.New(slog.DiscardHandler), f.reg)
	if err != nil {
		t.Fatal(err)
	}
	f.client = c
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return f
}

// TestOneDeltaPath: after the welcome's full copy (seq 1), each source's
// changes go as a delta numbered next, carrying that source's changes
// only, and counted as a delta.
func TestOneDeltaPath(t *testing.T) {
	ctl := startFakeControl(t)
	f := startClient(t, ctl.addr)
	f.book.put(&llmgwv1.ReplicaStatus{ReplicaId: "r0", Phase: llmgwv1.ReplicaPhase_REPLICA_PHASE_STARTING})
	testkit.Wait(t, "the welcome's full copy", func() bool { _, u := ctl.snapshot(); return len(u) >= 1 })
	_, ups := ctl.snapshot()
	if u := ups[0]; !u.GetFull() || u.GetSeq() != 1 || u.GetNode() != "n1" || len(u.GetStatuses()) != 1 {
		t.Fatalf("first update %v, want the full copy, seq 1, with r0", u)
	}
	if !f.client.Attached() {
		t.Error("not attached after the welcome")
	}

	tests := []struct {
		name   string
		change func()
		want   *llmgwv1.EphemeralUpdate
	}{
		{"book", func() {
			f.book.put(&llmgwv1.ReplicaStatus{ReplicaId: "r0", Phase: llmgwv1.ReplicaPhase_REPLICA_PHASE_READY})
		},
			&llmgwv1.EphemeralUpdate{Statuses: []*llmgwv1.ReplicaStatus{{ReplicaId: "r0", Phase: llmgwv1.ReplicaPhase_REPLICA_PHASE_READY}}}},
		{"kv", func() { f.kv.add(&llmgwv1.KVBlocks{ReplicaId: "r0", Stored: []uint64{7}}) },
			&llmgwv1.EphemeralUpdate{Kv: []*llmgwv1.KVBlocks{{ReplicaId: "r0", Stored: []uint64{7}}}}},
		{"adapters", func() { f.adapters.add(&llmgwv1.AdapterStatus{ReplicaId: "r0", Adapter: "a"}) },
			&llmgwv1.EphemeralUpdate{Adapters: []*llmgwv1.AdapterStatus{{ReplicaId: "r0", Adapter: "a"}}}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.change()
			seq := uint64(i + 2)
			testkit.Wait(t, "the delta", func() bool { _, u := ctl.snapshot(); return len(u) >= int(seq) })
			_, ups := ctl.snapshot()
			want := proto.Clone(tt.want).(*llmgwv1.EphemeralUpdate)
			want.Node, want.Epoch, want.Seq = "n1", ups[0].GetEpoch(), seq
			if got := ups[seq-1]; !proto.Equal(got, want) {
				t.Errorf("delta %v, want %v", got, want)
			}
			if n := testkit.Metric(t, f.reg, "llmgw_agent_updates_sent_total", testkit.Labels{"kind": "delta"}); n != float64(i+1) {
				t.Errorf("%v deltas counted, want %d", n, i+1)
			}
		})
	}
}

// TestControlMessages: desired sets reach the replicas in order, and a
// full-copy request is answered with a full copy numbered next.
func TestControlMessages(t *testing.T) {
	ctl := startFakeControl(t)
	f := startClient(t, ctl.addr)
	testkit.Wait(t, "the welcome's full copy", func() bool { _, u := ctl.snapshot(); return len(u) >= 1 })
	for rev := uint64(1); rev <= 2; rev++ {
		ctl.push <- &llmgwv1.ControlMessage{Body: &llmgwv1.ControlMessage_Desired{Desired: &llmgwv1.DesiredReplicas{Revision: rev}}}
	}
	ctl.push <- &llmgwv1.ControlMessage{Body: &llmgwv1.ControlMessage_FullCopyRequest{FullCopyRequest: &llmgwv1.FullCopyRequest{Reason: "test"}}}
	testkit.Wait(t, "the requested full copy", func() bool { _, u := ctl.snapshot(); return len(u) >= 2 })
	_, ups := ctl.snapshot()
	if u := ups[1]; !u.GetFull() || u.GetSeq() != 2 {
		t.Errorf("second update %v, want a full copy with seq 2", u)
	}
	if got := f.replicas.revisions(); !slices.Equal(got, []uint64{1, 2}) {
		t.Errorf("desired revisions applied %v, want [1 2]", got)
	}
	testkit.WaitMetric(t, f.reg, "llmgw_agent_full_copy_requests_total", nil, 1)
	testkit.WaitMetric(t, f.reg, "llmgw_agent_updates_sent_total", testkit.Labels{"kind": "full"}, 2)
}

// TestSilentServerFailsOver: a server that never answers is dead after
// three heartbeat intervals, and the next address is tried under a new
// epoch.
func TestSilentServerFailsOver(t *testing.T) {
	silent, next := startFakeControl(t), startFakeControl(t)
	silent.silent.Store(true)
	f := startClient(t, silent.addr, next.addr)
	testkit.Wait(t, "a full copy at the next server", func() bool { _, u := next.snapshot(); return len(u) >= 1 })
	h1, _ := silent.snapshot()
	h2, _ := next.snapshot()
	if h2[0].GetEpoch() <= h1[0].GetEpoch() {
		t.Errorf("epoch did not increase across sessions: %d then %d", h1[0].GetEpoch(), h2[0].GetEpoch())
	}
	if got := testkit.Metric(t, f.reg, "llmgw_agent_sessions_total", nil); got != 1 {
		t.Errorf("%v sessions welcomed, want 1", got)
	}
}

// TestGoesAboveAHeldEpoch: a session ended because a newer session of the
// node is held (ABORTED, the held epoch in the trailer) is followed by a
// hello above that epoch, which wins at once — however far the clock is
// behind it, within the bound. A held epoch beyond the bound is ignored:
// the agent's epoch stays with its clock and every hello is refused.
func TestGoesAboveAHeldEpoch(t *testing.T) {
	tests := []struct {
		name   string
		ahead  time.Duration // the held epoch, past the agent's clock
		raised bool
	}{
		{"a session 4 minutes ahead", 4 * time.Minute, true},
		{"a session 2 seconds ahead", 2 * time.Second, true},
		{"a session an hour ahead: ignored", time.Hour, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctl := startFakeControl(t)
			f := startClient(t, ctl.addr)
			testkit.Wait(t, "the first welcome", func() bool { _, u := ctl.snapshot(); return len(u) >= 1 })
			held := uint64(time.Now().Add(tt.ahead).UnixNano())
			ctl.held.Store(held)
			if !tt.raised {
				testkit.WaitMetric(t, f.reg, "llmgw_agent_sessions_superseded_total", testkit.Labels{"held": "ignored"}, 3)
				hellos, _ := ctl.snapshot()
				for _, h := range hellos {
					if h.GetEpoch() > held {
						t.Fatalf("hello at epoch %d, above the held %d that is beyond the bound", h.GetEpoch(), held)
					}
				}
				if got := testkit.Metric(t, f.reg, "llmgw_agent_sessions_superseded_total", testkit.Labels{"held": "raised"}); got != 0 {
					t.Fatalf("raised %v times, want 0", got)
				}
				return
			}
			testkit.Wait(t, "a hello above the held epoch, welcomed", func() bool {
				hellos, _ := ctl.snapshot()
				last := hellos[len(hellos)-1]
				return last.GetEpoch() == held+1 && f.client.Attached()
			})
			if got := testkit.Metric(t, f.reg, "llmgw_agent_sessions_superseded_total", testkit.Labels{"held": "raised"}); got != 1 {
				t.Fatalf("raised %v times, want 1", got)
			}
			if got := testkit.Metric(t, f.reg, "llmgw_agent_sessions_total", nil); got != 2 {
				t.Fatalf("%v sessions welcomed, want 2 (the first, and the one above the held epoch)", got)
			}
		})
	}
}

func TestServerAddrs(t *testing.T) {
	got := serverAddrs([]*llmgwv1.ControlServer{{GrpcAddr: "127.0.0.1:7400"}, {}, {GrpcAddr: "127.0.0.1:7410"}})
	if !slices.Equal(got, []string{"127.0.0.1:7400", "127.0.0.1:7410"}) {
		t.Errorf("serverAddrs = %v", got)
	}
}

func TestFailedNamesDeadServer(t *testing.T) {
	s := &session{addr: "127.0.0.1:7400"}
	if err := s.failed("receive", context.Canceled); !errors.Is(err, context.Canceled) {
		t.Errorf("failed = %v, want the cause", err)
	}
	s.dead.Store(true)
	if err := s.failed("receive", context.Canceled); !errors.Is(err, errDeadServer) {
		t.Errorf("failed = %v, want the dead server", err)
	}
}
