package controlplane

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// syncBuffer collects log output from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func testConfig(t *testing.T, dir, raftAddr string) Config {
	cfg := DefaultConfig()
	cfg.NodeID = "c1"
	cfg.DataDir = dir
	cfg.GRPCAddr = "127.0.0.1:0"
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.GossipAddr = ""
	cfg.RaftAddr = raftAddr
	cfg.Bootstrap = true
	cfg.HeartbeatInterval = 100 * time.Millisecond
	// The fake agent sends no heartbeats; the session must not time out.
	cfg.AgentTimeout = time.Minute
	cfg.WatchWait = 200 * time.Millisecond
	cfg.ReconcileInterval = 200 * time.Millisecond
	// Without gossip no leader's gRPC address is known: a follower holds a
	// write this long, then refuses it.
	cfg.RPCHoldTimeout = 300 * time.Millisecond
	return cfg
}

type running struct {
	srv    *Server
	cancel context.CancelFunc
	done   chan error
	conn   *grpc.ClientConn
	logs   *syncBuffer
}

func start(t *testing.T, cfg Config) *running { return startWith(t, cfg, nil) }

// startWith runs a server and waits until it is ready; hook, when set,
// adjusts it before Run.
func startWith(t *testing.T, cfg Config, hook func(*Server)) *running {
	t.Helper()
	r := launch(t, cfg, hook)
	r.awaitReady(t)
	return r
}

// launch runs a server without waiting for it to be ready (a server that
// is to be joined is ready only once it is).
func launch(t *testing.T, cfg Config, hook func(*Server)) *running {
	t.Helper()
	logs := &syncBuffer{}
	srv, err := New(cfg, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if hook != nil {
		hook(srv)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("server %s log:\n%s", cfg.NodeID, logs)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{srv: srv, cancel: cancel, done: make(chan error, 1), logs: logs}
	go func() { r.done <- srv.Run(ctx) }()
	return r
}

func (r *running) awaitReady(t *testing.T) {
	t.Helper()
	select {
	case <-r.srv.Ready():
	case err := <-r.done:
		t.Fatalf("Run returned before ready: %v\n%s", err, r.logs)
	case <-time.After(20 * time.Second):
		r.cancel()
		<-r.done
		t.Fatalf("server not ready\n%s", r.logs)
	}
	var err error
	r.conn, err = grpc.NewClient("passthrough:///"+r.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
}

func (r *running) stop(t *testing.T) {
	t.Helper()
	r.conn.Close()
	r.cancel()
	if err := <-r.done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// recvAgent returns the next control message that is not a heartbeat or a
// servers list.
func recvAgent(t *testing.T, s llmgwv1.AgentService_AttachClient) *llmgwv1.ControlMessage {
	t.Helper()
	for {
		m, err := s.Recv()
		if err != nil {
			t.Fatalf("agent recv: %v", err)
		}
		if m.GetHeartbeat() == nil && m.GetServers() == nil {
			return m
		}
	}
}

// recvWatch returns the next watch event that is not a heartbeat.
func recvWatch(t *testing.T, s llmgwv1.WatchService_WatchClient) *llmgwv1.WatchEvent {
	t.Helper()
	for {
		e, err := s.Recv()
		if err != nil {
			t.Fatalf("watch recv: %v", err)
		}
		if e.GetHeartbeat() == nil {
			return e
		}
	}
}

func status1(id string, uid uint64, port string) *llmgwv1.ReplicaStatus {
	return &llmgwv1.ReplicaStatus{ReplicaId: id, Uid: uid, Incarnation: 1, Model: "demo", Node: "n1",
		Phase: llmgwv1.ReplicaPhase_REPLICA_PHASE_READY, Address: "127.0.0.1:" + port}
}

func TestServerEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	dir, raftAddr := t.TempDir(), freeAddr(t)
	r := start(t, testConfig(t, dir, raftAddr))
	admin := llmgwv1.NewAdminServiceClient(r.conn)

	// Validation errors name the field and are INVALID_ARGUMENT.
	_, err := admin.ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: &llmgwv1.Model{Name: "demo", Engine: "foo", Model: "m", Replicas: 1}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "engine:") {
		t.Fatalf("bad model: %v", err)
	}
	// The model policy runs here, at the entry point; Apply does not run it
	// (fsm.validateApplied says why).
	_, err = admin.ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: &llmgwv1.Model{Name: "demo", Engine: "vllm", Model: "m", Replicas: 1, ExtraArgs: []string{"--trust-remote-code"}}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "extra_args[0]: --trust-remote-code") {
		t.Fatalf("remote code without allow_remote_code: %v", err)
	}
	if _, err := admin.DeleteModel(ctx, &llmgwv1.DeleteModelRequest{Name: "nope"}); status.Code(err) != codes.NotFound {
		t.Fatalf("delete unknown: %v", err)
	}
	applied, err := admin.ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: &llmgwv1.Model{Name: "demo", Engine: "sim", Model: "meta-llama/Llama-3.1-8B-Instruct", Replicas: 2}})
	if err != nil {
		t.Fatalf("ApplyModel: %v", err)
	}
	if applied.Model.GetProfile() != "chat" || applied.Revision == 0 {
		t.Fatalf("ApplyModel returned %v", applied)
	}

	// A fake agent with two GPUs attaches and is given both replicas.
	agent, err := llmgwv1.NewAgentServiceClient(r.conn).Attach(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const epoch = 1000
	if err := agent.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Hello{Hello: &llmgwv1.AgentHello{
		Node: &llmgwv1.Node{Id: "n1", Address: "127.0.0.1", Gpus: 2, Version: "test"}, Epoch: epoch,
	}}}); err != nil {
		t.Fatal(err)
	}
	welcome := recvAgent(t, agent).GetWelcome()
	if welcome == nil || welcome.ServerId != "c1" || len(welcome.Servers) != 1 || welcome.Servers[0].GrpcAddr != r.srv.GRPCAddr() {
		t.Fatalf("welcome: %v", welcome)
	}
	var desired *llmgwv1.DesiredReplicas
	for desired == nil || len(desired.Replicas) < 2 {
		m := recvAgent(t, agent)
		if m.GetDesired() == nil {
			t.Fatalf("expected desired replicas, got %v", m)
		}
		desired = m.GetDesired()
	}
	if len(desired.Models) != 1 || desired.Models[0].Name != "demo" {
		t.Fatalf("desired models: %v", desired.Models)
	}
	r0, r1 := desired.Replicas[0], desired.Replicas[1]
	if r0.Id != "demo-0" || r1.Id != "demo-1" || r0.Uid == 0 || r0.Node != "n1" || len(r0.GpuIndices) != 1 || r0.GpuIndices[0] == r1.GpuIndices[0] {
		t.Fatalf("desired replicas: %v", desired.Replicas)
	}

	// Full copy, then a delta; a delta after a gap gets a full-copy request.
	send := func(u *llmgwv1.EphemeralUpdate) {
		t.Helper()
		u.Node, u.Epoch = "n1", epoch
		if err := agent.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Update{Update: u}}); err != nil {
			t.Fatal(err)
		}
	}
	send(&llmgwv1.EphemeralUpdate{Seq: 1, Full: true, Statuses: []*llmgwv1.ReplicaStatus{status1("demo-0", r0.Uid, "9000"), status1("demo-1", r1.Uid, "9001")},
		Kv: []*llmgwv1.KVBlocks{
			{ReplicaId: "demo-0", Uid: r0.Uid, Incarnation: 1, Reset_: true, Stored: []uint64{2, 1}, BlockSize: 16},
			{ReplicaId: "ghost-0", Uid: 1, Incarnation: 1, Reset_: true, Stored: []uint64{7}}, // not this node's: dropped
		}})
	restarted := status1("demo-1", r1.Uid, "9002")
	restarted.Restarts = 1
	send(&llmgwv1.EphemeralUpdate{Seq: 2, Statuses: []*llmgwv1.ReplicaStatus{restarted}})
	send(&llmgwv1.EphemeralUpdate{Seq: 5})
	if m := recvAgent(t, agent); m.GetFullCopyRequest() == nil {
		t.Fatalf("expected a full copy request after a gap, got %v", m)
	}

	// ListReplicas joins desired state with the statuses.
	reps, err := admin.ListReplicas(ctx, &llmgwv1.ListRequest{Consistent: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(reps.Replicas) != 2 || reps.Replicas[1].Status.GetAddress() != "127.0.0.1:9002" || reps.Replicas[0].Status.GetAddress() != "127.0.0.1:9000" {
		t.Fatalf("ListReplicas: %v", reps.Replicas)
	}
	nodes, err := admin.ListNodes(ctx, &llmgwv1.ListRequest{})
	if err != nil || len(nodes.Nodes) != 1 || !nodes.Connected["n1"] || nodes.Nodes[0].State != llmgwv1.NodeState_NODE_STATE_ACTIVE {
		t.Fatalf("ListNodes: %v %v", nodes, err)
	}
	cs, err := admin.ClusterStatus(ctx, &llmgwv1.ClusterStatusRequest{})
	if err != nil || cs.Leader != "c1" || cs.ServerId != "c1" {
		t.Fatalf("ClusterStatus: %v %v", cs, err)
	}

	// A watcher from 0 gets a framed snapshot, the servers, the full copy.
	watch, err := llmgwv1.NewWatchServiceClient(r.conn).Watch(ctx, &llmgwv1.WatchRequest{ClientId: "router-1"})
	if err != nil {
		t.Fatal(err)
	}
	begin := recvWatch(t, watch).GetSnapshotBegin()
	if begin == nil {
		t.Fatal("expected snapshot_begin")
	}
	var models, nodesSeen, replicas, configs int
	for {
		e := recvWatch(t, watch)
		if end := e.GetSnapshotEnd(); end != nil {
			if end.Revision != begin.Revision {
				t.Fatalf("snapshot framing %d..%d", begin.Revision, end.Revision)
			}
			break
		}
		c := e.GetChange()
		if c == nil || c.Op != llmgwv1.ChangeOp_CHANGE_OP_PUT || c.Revision != begin.Revision {
			t.Fatalf("inside a snapshot: %v", e)
		}
		switch {
		case c.GetModel() != nil:
			models++
		case c.GetNode() != nil:
			nodesSeen++
		case c.GetReplica() != nil:
			replicas++
		case c.GetConfig() != nil:
			configs++
		}
	}
	if models != 1 || nodesSeen != 1 || replicas != 2 || configs != 1 {
		t.Fatalf("snapshot had %d models, %d nodes, %d replicas, %d configs", models, nodesSeen, replicas, configs)
	}
	if sl := recvWatch(t, watch).GetServers(); sl == nil || len(sl.Servers) != 1 || !sl.Servers[0].Leader {
		t.Fatalf("expected the servers list, got %v", sl)
	}
	full := recvWatch(t, watch).GetEphemeral()
	if full == nil || !full.Full || full.Node != "n1" || full.Epoch != epoch || full.Seq != 2 || len(full.Statuses) != 2 {
		t.Fatalf("expected the full ephemeral copy at seq 2, got %v", full)
	}
	if len(full.Kv) != 1 || full.Kv[0].ReplicaId != "demo-0" || !full.Kv[0].Reset_ || len(full.Kv[0].Stored) != 2 || full.Kv[0].BlockSize != 16 {
		t.Fatalf("expected demo-0's KV blocks only in the copy, got %v", full.Kv)
	}
	// A live delta arrives as the agent sent it.
	send(&llmgwv1.EphemeralUpdate{Seq: 3, RemovedReplicas: []string{"demo-0"}})
	if d := recvWatch(t, watch).GetEphemeral(); d == nil || d.Full || d.Seq != 3 || d.Epoch != epoch || len(d.RemovedReplicas) != 1 {
		t.Fatalf("expected the delta seq 3, got %v", d)
	}

	// Deleting the model removes its replicas in the same revision; the
	// watcher sees the deletes and a mark; the agent sees an empty set.
	del, err := admin.DeleteModel(ctx, &llmgwv1.DeleteModelRequest{Name: "demo"})
	if err != nil {
		t.Fatal(err)
	}
	var deletes []string
	for {
		e := recvWatch(t, watch)
		if m := e.GetMark(); m != nil {
			if m.Revision < del.Revision {
				t.Fatalf("mark %d before the delete at %d", m.Revision, del.Revision)
			}
			break
		}
		c := e.GetChange()
		if c == nil || c.Op != llmgwv1.ChangeOp_CHANGE_OP_DELETE || c.Revision != del.Revision {
			t.Fatalf("expected deletes at %d, got %v", del.Revision, e)
		}
		switch {
		case c.GetReplica() != nil:
			deletes = append(deletes, c.GetReplica().Id)
		case c.GetModel() != nil:
			deletes = append(deletes, "model "+c.GetModel().Name)
		}
	}
	if strings.Join(deletes, ",") != "demo-0,demo-1,model demo" {
		t.Fatalf("deletes: %v", deletes)
	}
	if d := recvAgent(t, agent).GetDesired(); d == nil || len(d.Replicas) != 0 {
		t.Fatalf("agent expected an empty desired set, got %v", d)
	}
	if reps, _ := admin.ListReplicas(ctx, &llmgwv1.ListRequest{}); len(reps.GetReplicas()) != 0 {
		t.Fatalf("replicas left after delete: %v", reps)
	}

	// A watcher ahead of this server is told to go elsewhere.
	ahead, err := llmgwv1.NewWatchServiceClient(r.conn).Watch(ctx, &llmgwv1.WatchRequest{FromRevision: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ahead.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("watch from the future: %v", err)
	}
	// A watcher that resumes gets only what it missed.
	resume, err := llmgwv1.NewWatchServiceClient(r.conn).Watch(ctx, &llmgwv1.WatchRequest{FromRevision: begin.Revision})
	if err != nil {
		t.Fatal(err)
	}
	if e := recvWatch(t, resume); e.GetChange().GetOp() != llmgwv1.ChangeOp_CHANGE_OP_DELETE {
		t.Fatalf("resume: expected the deletes, got %v", e)
	}

	// HTTP: ready, healthy, metrics from our own registry.
	for _, c := range []struct{ path, want string }{
		{"/readyz", "ready"}, {"/healthz", "ok"},
		{"/metrics", "llmgw_control_raft_has_leader 1"},
		{"/metrics", "llmgw_control_agent_sessions 1"},
		{"/metrics", `llmgw_control_ephemeral_updates_total{verdict="gap"} 1`},
		{"/metrics", "llmgw_control_kv_foreign_total 1"},
		{"/metrics", `llmgw_control_ephemeral_updates_total{verdict="accepted"} 3`},
		{"/metrics", `llmgw_control_placement_decisions_total{action="place",result="ok"} 2`},
	} {
		path, want := c.path, c.want
		resp, err := http.Get("http://" + r.srv.HTTPAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Fatalf("GET %s: %d %q", path, resp.StatusCode, body)
		}
	}

	// Scaling down drains the newest replica first; it is removed once the
	// agent reports its engine stopped.
	waitDesired := func(what string, ok func(d *llmgwv1.DesiredReplicas) bool) *llmgwv1.DesiredReplicas {
		t.Helper()
		for {
			m := recvAgent(t, agent)
			if d := m.GetDesired(); d != nil && ok(d) {
				return d
			}
			if m.GetDesired() == nil {
				t.Fatalf("waiting for %s: got %v", what, m)
			}
		}
	}
	keepModel := &llmgwv1.Model{Name: "keep", Engine: "sim", Model: "m", Replicas: 2}
	if _, err := admin.ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: keepModel}); err != nil {
		t.Fatal(err)
	}
	d := waitDesired("two keep replicas", func(d *llmgwv1.DesiredReplicas) bool { return len(d.Replicas) == 2 })
	k0, k1 := d.Replicas[0], d.Replicas[1]
	send(&llmgwv1.EphemeralUpdate{Seq: 4, Statuses: []*llmgwv1.ReplicaStatus{status1(k0.Id, k0.Uid, "9100"), status1(k1.Id, k1.Uid, "9101")}})
	testkit.Wait(t, "both keep replicas ready", func() bool {
		reps, err := admin.ListReplicas(ctx, &llmgwv1.ListRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return len(reps.Replicas) == 2 && reps.Replicas[1].Status.GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY
	})
	keepModel.Replicas = 1
	keep, err := admin.ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: keepModel})
	if err != nil {
		t.Fatal(err)
	}
	d = waitDesired("keep-1 draining", func(d *llmgwv1.DesiredReplicas) bool { return len(d.Replicas) == 2 && d.Replicas[1].Draining })
	if d.Replicas[1].Id != "keep-1" || d.Replicas[0].Draining {
		t.Fatalf("drained the wrong replica: %v", d.Replicas)
	}
	stopped := status1(k1.Id, k1.Uid, "9101")
	stopped.Phase = llmgwv1.ReplicaPhase_REPLICA_PHASE_STOPPED
	send(&llmgwv1.EphemeralUpdate{Seq: 5, Statuses: []*llmgwv1.ReplicaStatus{stopped}})
	waitDesired("keep-1 removed", func(d *llmgwv1.DesiredReplicas) bool { return len(d.Replicas) == 1 && d.Replicas[0].Id == "keep-0" })
	// Take a Raft snapshot so the restart goes through Restore, then the
	// log entries after it.
	if err := r.srv.store.Raw().Snapshot().Error(); err != nil {
		t.Fatalf("raft snapshot: %v", err)
	}
	if _, err := admin.ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: &llmgwv1.Model{Name: "after", Engine: "sim", Model: "m", Replicas: 1}}); err != nil {
		t.Fatal(err)
	}
	agent.CloseSend()
	cancel()
	r.stop(t)

	// Restart on the same data dir: the state is kept and the node does not
	// bootstrap again.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel2()
	r2 := start(t, testConfig(t, dir, raftAddr))
	defer r2.stop(t)
	admin2 := llmgwv1.NewAdminServiceClient(r2.conn)
	ms, err := admin2.ListModels(ctx2, &llmgwv1.ListRequest{Consistent: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(ms.Models) != 2 || ms.Models[0].Name != "after" || ms.Models[1].Name != "keep" || ms.Revision < keep.Revision {
		t.Fatalf("after restart: %v", ms)
	}
	if ns, _ := admin2.ListNodes(ctx2, &llmgwv1.ListRequest{}); len(ns.GetNodes()) != 1 || ns.Connected["n1"] {
		t.Fatalf("nodes after restart: %v", ns)
	}
	if logs := r2.logs.String(); !strings.Contains(logs, "raft state found") || !strings.Contains(logs, "restored from snapshot") || strings.Contains(logs, "bootstrapped") {
		t.Fatalf("restart bootstrapped again:\n%s", logs)
	}
}

// fakeClock is advanced by the test; the server judges node liveness by it.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// TestLostNodeIsRescheduled: a node without a session is marked DOWN after
// NodeDownAfter, its replicas move after RescheduleAfter, and it is ACTIVE
// again when its agent comes back — all by the injected clock.
func TestLostNodeIsRescheduled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	clock := &fakeClock{now: time.Unix(1_000_000, 0)}
	cfg := testConfig(t, t.TempDir(), freeAddr(t))
	cfg.ReconcileInterval = 20 * time.Millisecond
	cfg.NodeDownAfter = time.Hour
	cfg.RescheduleAfter = 2 * time.Hour
	r := startWith(t, cfg, func(s *Server) { s.now = clock.Now })
	defer r.stop(t)
	admin := llmgwv1.NewAdminServiceClient(r.conn)

	attach := func(id string, epoch uint64) (llmgwv1.AgentService_AttachClient, context.CancelFunc) {
		t.Helper()
		actx, acancel := context.WithCancel(ctx)
		a, err := llmgwv1.NewAgentServiceClient(r.conn).Attach(actx)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Hello{Hello: &llmgwv1.AgentHello{
			Node: &llmgwv1.Node{Id: id, Address: "127.0.0.1", Gpus: 2}, Epoch: epoch,
		}}}); err != nil {
			t.Fatal(err)
		}
		if recvAgent(t, a).GetWelcome() == nil {
			t.Fatal("no welcome")
		}
		return a, acancel
	}
	a1, stop1 := attach("n1", 1)
	_, stop2 := attach("n2", 1)
	defer stop2()
	if _, err := admin.ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: &llmgwv1.Model{Name: "m", Engine: "sim", Model: "x", Replicas: 1}}); err != nil {
		t.Fatal(err)
	}
	for {
		if d := recvAgent(t, a1).GetDesired(); len(d.GetReplicas()) == 1 {
			break // n1 wins the tie on node id
		}
	}
	stop1()

	nodeState := func(id string) llmgwv1.NodeState {
		ns, err := admin.ListNodes(ctx, &llmgwv1.ListRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range ns.Nodes {
			if n.Id == id {
				return n.State
			}
		}
		return llmgwv1.NodeState_NODE_STATE_UNSPECIFIED
	}
	testkit.Wait(t, "n1 detached", func() bool { ns, _ := admin.ListNodes(ctx, &llmgwv1.ListRequest{}); return !ns.GetConnected()["n1"] })
	clock.Advance(59 * time.Minute)
	time.Sleep(100 * time.Millisecond) // several reconcile rounds at 20 ms
	if st := nodeState("n1"); st != llmgwv1.NodeState_NODE_STATE_ACTIVE {
		t.Fatalf("n1 is %v before NodeDownAfter", st)
	}
	clock.Advance(2 * time.Minute)
	testkit.Wait(t, "n1 down", func() bool { return nodeState("n1") == llmgwv1.NodeState_NODE_STATE_DOWN })
	replicaNode := func() string {
		reps, err := admin.ListReplicas(ctx, &llmgwv1.ListRequest{})
		if err != nil || len(reps.Replicas) != 1 {
			return ""
		}
		return reps.Replicas[0].Replica.Node
	}
	if n := replicaNode(); n != "n1" {
		t.Fatalf("replica moved to %q within the reschedule grace", n)
	}
	clock.Advance(3 * time.Hour)
	testkit.Wait(t, "the replica on n2", func() bool { return replicaNode() == "n2" })

	_, stop1 = attach("n1", 2)
	defer stop1()
	testkit.Wait(t, "n1 active again", func() bool { return nodeState("n1") == llmgwv1.NodeState_NODE_STATE_ACTIVE })
}
