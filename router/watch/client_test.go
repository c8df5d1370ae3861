package watch

import (
	"bufio"
	"bytes"
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protodelim"
	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeWatch is a WatchService whose streams send what the test pushes into
// events; hangup ends the current stream.
type fakeWatch struct {
	llmgwv1.UnimplementedWatchServiceServer
	reqs   chan *llmgwv1.WatchRequest
	events chan *llmgwv1.WatchEvent
	hangup chan struct{}
}

func (f *fakeWatch) Watch(req *llmgwv1.WatchRequest, s grpc.ServerStreamingServer[llmgwv1.WatchEvent]) error {
	select {
	case f.reqs <- req:
	case <-s.Context().Done():
		return nil
	}
	for {
		select {
		case ev := <-f.events:
			if err := s.Send(ev); err != nil {
				return err
			}
		case <-f.hangup:
			return nil
		case <-s.Context().Done():
			return nil
		}
	}
}

type harness struct {
	t      *testing.T
	fake   *fakeWatch
	client *Client
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func start(t *testing.T, mutate func(*Config)) *harness {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fake := &fakeWatch{
		reqs:   make(chan *llmgwv1.WatchRequest, 16),
		events: make(chan *llmgwv1.WatchEvent),
		hangup: make(chan struct{}),
	}
	srv := grpc.NewServer()
	llmgwv1.RegisterWatchServiceServer(srv, fake)
	var srvWG sync.WaitGroup
	srvWG.Add(1)
	go func() { defer srvWG.Done(); _ = srv.Serve(ln) }()

	cfg := DefaultConfig()
	cfg.ClientID = "r1"
	cfg.Addrs = []string{ln.Addr().String()}
	cfg.HeartbeatTimeout = 10 * time.Second
	cfg.BackoffMin = time.Millisecond
	cfg.BackoffMax = 5 * time.Millisecond
	cfg.Jitter = func() float64 { return 0 }
	if mutate != nil {
		mutate(&cfg)
	}
	c, err := New(cfg, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, fake: fake, client: c, cancel: cancel}
	h.wg.Add(1)
	go func() { defer h.wg.Done(); _ = c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		h.wg.Wait()
		srv.Stop()
		srvWG.Wait()
	})
	return h
}

func (h *harness) nextRequest() *llmgwv1.WatchRequest {
	h.t.Helper()
	select {
	case r := <-h.fake.reqs:
		return r
	case <-time.After(10 * time.Second):
		h.t.Fatal("no Watch request arrived")
		return nil
	}
}

func (h *harness) send(evs ...*llmgwv1.WatchEvent) {
	h.t.Helper()
	for _, ev := range evs {
		select {
		case h.fake.events <- ev:
		case <-time.After(10 * time.Second):
			h.t.Fatal("the client did not take an event")
		}
	}
}

// waitFor waits until the published state satisfies ok.
func (h *harness) waitFor(what string, ok func(*State) bool) *State {
	h.t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		ch := h.client.Changed()
		if st := h.client.Current(); ok(st) {
			return st
		}
		select {
		case <-ch:
		case <-deadline:
			h.t.Fatalf("state never became: %s", what)
		}
	}
}

func evBegin(r uint64) *llmgwv1.WatchEvent {
	return &llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_SnapshotBegin{SnapshotBegin: &llmgwv1.SnapshotBegin{Revision: r}}}
}
func evEnd(r uint64) *llmgwv1.WatchEvent {
	return &llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_SnapshotEnd{SnapshotEnd: &llmgwv1.SnapshotEnd{Revision: r}}}
}
func evMark(r uint64) *llmgwv1.WatchEvent {
	return &llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Mark{Mark: &llmgwv1.RevisionMark{Revision: r}}}
}
func evModel(r uint64, op llmgwv1.ChangeOp, name string) *llmgwv1.WatchEvent {
	return &llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Change{Change: &llmgwv1.Change{
		Revision: r, Op: op, Object: &llmgwv1.Change_Model{Model: &llmgwv1.Model{Name: name, Engine: "sim"}}}}}
}
func evReplica(r uint64, id, model, node string, uid uint64) *llmgwv1.WatchEvent {
	return &llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Change{Change: &llmgwv1.Change{
		Revision: r, Op: llmgwv1.ChangeOp_CHANGE_OP_PUT,
		Object: &llmgwv1.Change_Replica{Replica: &llmgwv1.Replica{Id: id, Uid: uid, Model: model, Node: node}}}}}
}
func evEph(node string, epoch, seq uint64, full bool, statuses ...*llmgwv1.ReplicaStatus) *llmgwv1.WatchEvent {
	return &llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Ephemeral{Ephemeral: &llmgwv1.EphemeralUpdate{
		Node: node, Epoch: epoch, Seq: seq, Full: full, Statuses: statuses}}}
}
func status(id string, uid uint64, phase llmgwv1.ReplicaPhase, addr string) *llmgwv1.ReplicaStatus {
	return &llmgwv1.ReplicaStatus{ReplicaId: id, Uid: uid, Phase: phase, Address: addr}
}

const put = llmgwv1.ChangeOp_CHANGE_OP_PUT

func TestSnapshotIsSwappedInAtomically(t *testing.T) {
	h := start(t, nil)
	if r := h.nextRequest(); r.GetFromRevision() != 0 || r.GetClientId() != "r1" {
		t.Fatalf("first request = %v, want from_revision 0 and client r1", r)
	}
	h.send(evBegin(10), evModel(10, put, "demo"), evReplica(10, "demo-0", "demo", "n1", 7))
	// An ephemeral copy arriving mid-snapshot is published at once; the
	// half-built snapshot must not be.
	h.send(evEph("n1", 5, 1, true, status("demo-0", 7, llmgwv1.ReplicaPhase_REPLICA_PHASE_READY, "127.0.0.1:9000")))
	st := h.waitFor("ephemeral applied", func(s *State) bool { return s.Ephemeral["n1"] != nil })
	if len(st.Models) != 0 || st.Revision != 0 || st.Synced {
		t.Fatalf("half a snapshot is visible: models=%v revision=%d synced=%v", st.Models, st.Revision, st.Synced)
	}
	h.send(evEnd(10))
	st = h.waitFor("snapshot swapped in", func(s *State) bool { return s.Revision == 10 })
	if st.Models["demo"] == nil || st.Replicas["demo-0"] == nil || !st.Synced {
		t.Fatalf("snapshot incomplete: %+v", st)
	}
	if got := st.Status(st.Replicas["demo-0"]); got.GetAddress() != "127.0.0.1:9000" {
		t.Fatalf("ephemeral data lost in the swap: %v", got)
	}
}

func TestChangesNeverMoveBackwards(t *testing.T) {
	h := start(t, nil)
	h.nextRequest()
	h.send(evBegin(10), evModel(10, put, "a"), evEnd(10))
	h.waitFor("snapshot", func(s *State) bool { return s.Revision == 10 })

	h.send(evModel(14, put, "b"), evMark(14))
	h.waitFor("change at 14", func(s *State) bool { return s.Models["b"] != nil && s.Revision == 14 })

	// A change at or before the held revision is a duplicate; a lower mark
	// does not move the revision back; an older snapshot is dropped whole.
	h.send(evModel(12, llmgwv1.ChangeOp_CHANGE_OP_DELETE, "a"), evMark(12))
	h.send(evBegin(11), evModel(11, put, "old"), evEnd(11))
	h.send(evModel(20, put, "c"), evMark(20))
	st := h.waitFor("change at 20", func(s *State) bool { return s.Revision == 20 })
	if st.Models["a"] == nil || st.Models["old"] != nil || st.Models["c"] == nil {
		t.Fatalf("models = %v, want a, b, c", st.Models)
	}
}

// One command (deleting a model with its replicas) changes several objects
// at one revision: every one of them must be applied, not just the first.
func TestChangesSharingARevisionAllApply(t *testing.T) {
	h := start(t, nil)
	h.nextRequest()
	h.send(evBegin(10), evModel(10, put, "a"), evReplica(10, "a-0", "a", "n1", 9), evEnd(10))
	h.waitFor("snapshot", func(s *State) bool { return s.Revision == 10 })

	del := llmgwv1.ChangeOp_CHANGE_OP_DELETE
	replicaGone := &llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Change{Change: &llmgwv1.Change{
		Revision: 11, Op: del, Object: &llmgwv1.Change_Replica{Replica: &llmgwv1.Replica{Id: "a-0"}}}}}
	h.send(replicaGone, evModel(11, del, "a"), evMark(11))
	st := h.waitFor("revision 11", func(s *State) bool { return s.Revision == 11 })
	if st.Models["a"] != nil || st.Replicas["a-0"] != nil {
		t.Fatalf("after deleting model a with its replica: models=%v replicas=%v", st.Models, st.Replicas)
	}
}

func TestEphemeralRules(t *testing.T) {
	h := start(t, nil)
	h.nextRequest()
	h.send(evBegin(3), evEnd(3))
	ready := llmgwv1.ReplicaPhase_REPLICA_PHASE_READY
	starting := llmgwv1.ReplicaPhase_REPLICA_PHASE_STARTING

	h.send(evEph("n1", 100, 1, true, status("m-0", 1, starting, "")))
	h.send(evEph("n1", 100, 2, false, status("m-0", 1, ready, "127.0.0.1:1")))
	h.waitFor("delta seq 2", func(s *State) bool { return s.Ephemeral["n1"] != nil && s.Ephemeral["n1"].Seq == 2 })

	// Stale: a duplicate seq, and a full copy of an older epoch (an old
	// session's late data). Both are dropped without a reconnect.
	h.send(evEph("n1", 100, 2, false, status("m-0", 1, starting, "")))
	h.send(evEph("n1", 99, 50, true, status("m-0", 1, starting, "")))
	h.send(evEph("n2", 1, 1, true)) // a marker that the above were processed
	st := h.waitFor("n2 copy", func(s *State) bool { return s.Ephemeral["n2"] != nil })
	if got := st.Ephemeral["n1"].Statuses["m-0"]; got.GetPhase() != ready || st.Ephemeral["n1"].Seq != 2 {
		t.Fatalf("stale data was applied: %v seq %d", got, st.Ephemeral["n1"].Seq)
	}
	select {
	case r := <-h.fake.reqs:
		t.Fatalf("reconnected on stale data: %v", r)
	default:
	}

	// A gap (seq 4 after 2) is dropped and forces a new stream, resumed from
	// the held revision so the server sends full copies.
	h.send(evEph("n1", 100, 4, false, status("m-0", 1, starting, "")))
	if r := h.nextRequest(); r.GetFromRevision() != 3 {
		t.Fatalf("resumed from %d, want 3", r.GetFromRevision())
	}
	if got := h.client.Current().Ephemeral["n1"]; got.Seq != 2 || got.Statuses["m-0"].GetPhase() != ready {
		t.Fatalf("out-of-order delta applied: %+v", got)
	}
	// The new session's full copy of a newer epoch replaces the node's data;
	// a replica absent from it is unknown.
	h.send(evEph("n1", 200, 1, true, status("m-1", 2, ready, "127.0.0.1:2")))
	st = h.waitFor("epoch 200", func(s *State) bool { return s.Ephemeral["n1"].Epoch == 200 })
	if _, ok := st.Ephemeral["n1"].Statuses["m-0"]; ok {
		t.Fatal("a full copy kept a replica it does not list")
	}
}

func TestSilentServerIsLeft(t *testing.T) {
	h := start(t, func(c *Config) { c.HeartbeatTimeout = 100 * time.Millisecond })
	h.nextRequest()
	h.send(evBegin(5), evEnd(5))
	// No heartbeats follow: the client must give up on the stream and ask
	// again from revision 5.
	if r := h.nextRequest(); r.GetFromRevision() != 5 {
		t.Fatalf("resumed from %d, want 5", r.GetFromRevision())
	}
}

func TestReconnectAfterHangup(t *testing.T) {
	h := start(t, nil)
	h.nextRequest()
	h.send(evBegin(5), evModel(5, put, "a"))
	h.fake.hangup <- struct{}{} // the stream ends mid-snapshot
	r := h.nextRequest()
	if r.GetFromRevision() != 0 {
		t.Fatalf("resumed from %d, want 0: the snapshot never completed", r.GetFromRevision())
	}
	h.send(evBegin(6), evModel(6, put, "b"), evEnd(6))
	st := h.waitFor("second snapshot", func(s *State) bool { return s.Revision == 6 })
	if st.Models["a"] != nil {
		t.Fatal("half of the abandoned snapshot leaked into the new one")
	}
}

func TestJudgeEphemeral(t *testing.T) {
	held := &NodeEphemeral{Epoch: 10, Seq: 5}
	tests := []struct {
		name string
		held *NodeEphemeral
		full bool
		e, s uint64
		want ephemeralVerdict
	}{
		{"full, nothing held", nil, true, 1, 1, accept},
		{"full, newer epoch", held, true, 11, 1, accept},
		{"full, same epoch higher seq", held, true, 10, 6, accept},
		{"full, same epoch same seq (a refresh)", held, true, 10, 5, accept},
		{"full, older epoch", held, true, 9, 100, stale},
		{"delta, next seq", held, false, 10, 6, accept},
		{"delta, duplicate", held, false, 10, 5, stale},
		{"delta, old seq", held, false, 10, 2, stale},
		{"delta, older epoch", held, false, 9, 6, stale},
		{"delta, gap", held, false, 10, 7, gap},
		{"delta, newer epoch", held, false, 11, 1, gap},
		{"delta, nothing held", nil, false, 10, 6, gap},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := &llmgwv1.EphemeralUpdate{Node: "n", Epoch: tt.e, Seq: tt.s, Full: tt.full}
			if got := judgeEphemeral(tt.held, u); got != tt.want {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestSavedStateRoundTrip(t *testing.T) {
	st := emptyState()
	st.Revision = 42
	st.Synced = true
	st.Models["demo"] = &llmgwv1.Model{Name: "demo", Engine: "sim", Replicas: 1}
	st.Replicas["demo-0"] = &llmgwv1.Replica{Id: "demo-0", Uid: 41, Model: "demo", Node: "n1"}
	st.Nodes["n1"] = &llmgwv1.Node{Id: "n1", Address: "127.0.0.1"}
	st.Config = &llmgwv1.ClusterConfig{DefaultBlockSize: 16}
	st.Servers = []*llmgwv1.ControlServer{{Id: "c1", GrpcAddr: "127.0.0.1:7400"}}
	st.applyEphemeral(&llmgwv1.EphemeralUpdate{Node: "n1", Epoch: 9, Seq: 3, Full: true,
		Statuses: []*llmgwv1.ReplicaStatus{status("demo-0", 41, llmgwv1.ReplicaPhase_REPLICA_PHASE_READY, "127.0.0.1:9")}})

	path := filepath.Join(t.TempDir(), "state")
	if err := saveState(path, st); err != nil {
		t.Fatal(err)
	}
	got, err := loadState(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Revision != 42 || !got.Synced || !proto.Equal(got.Models["demo"], st.Models["demo"]) ||
		!proto.Equal(got.Replicas["demo-0"], st.Replicas["demo-0"]) || !proto.Equal(got.Config, st.Config) ||
		len(got.Servers) != 1 || got.Ephemeral["n1"].Seq != 3 ||
		got.Ephemeral["n1"].Statuses["demo-0"].GetAddress() != "127.0.0.1:9" {
		t.Fatalf("round trip lost data: %+v", got)
	}

	// A router started on that file with no control server answering serves
	// the saved state at once.
	h := start(t, func(c *Config) { c.StatePath = path; c.Addrs = []string{"127.0.0.1:1"} })
	if cur := h.client.Current(); cur.Revision != 42 || cur.Models["demo"] == nil {
		t.Fatalf("saved state not served: %+v", cur)
	}

	if none, err := loadState(filepath.Join(t.TempDir(), "missing")); none != nil || err != nil {
		t.Fatalf("missing file: got %v, %v; want nothing and no error", none, err)
	}
}

func TestDecodeStateRefusesDamage(t *testing.T) {
	enc := func(evs ...*llmgwv1.WatchEvent) []byte {
		var b bytes.Buffer
		for _, ev := range evs {
			if _, err := protodelim.MarshalTo(&b, ev); err != nil {
				t.Fatal(err)
			}
		}
		return b.Bytes()
	}
	tests := []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"cut short", enc(evBegin(3), evModel(3, put, "a"))},
		{"mismatched end", enc(evBegin(3), evEnd(4))},
		{"change outside", enc(evModel(3, put, "a"), evBegin(3), evEnd(3))},
		{"delta", enc(evBegin(3), evEnd(3), evEph("n", 1, 2, false))},
		{"garbage", []byte{0xff, 0xff, 0xff, 0x01, 0x02}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if st, err := decodeState(bufio.NewReader(bytes.NewReader(tt.data))); err == nil {
				t.Fatalf("accepted damaged data: %+v", st)
			}
		})
	}
}

func FuzzDecodeState(f *testing.F) {
	var b bytes.Buffer
	for _, ev := range []*llmgwv1.WatchEvent{evBegin(3), evModel(3, put, "a"), evKey(3, put, "k", "s"), evEnd(3),
		evEph("n", 1, 1, true, status("a-0", 1, llmgwv1.ReplicaPhase_REPLICA_PHASE_READY, "x:1"))} {
		_, _ = protodelim.MarshalTo(&b, ev)
	}
	f.Add(b.Bytes())
	f.Add([]byte{})
	f.Add([]byte{0x05, 0x0a, 0x02, 0x08, 0x03})
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := decodeState(bufio.NewReader(bytes.NewReader(data)))
		if err == nil && (st == nil || !st.Synced) {
			t.Fatal("accepted state must be complete")
		}
	})
}
