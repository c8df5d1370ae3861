package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// limitedServer starts a single-server cluster with extra config-file
// settings (the per-address caps have no flag) and waits for its leader.
func limitedServer(t *testing.T, config string) *controlServer {
	t.Helper()
	path := filepath.Join(t.TempDir(), "control.yaml")
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	s := newServer(t, "c1", serverOpts{extra: []string{"--bootstrap", "--config", path}})
	s.start()
	c := &cluster{t: t, servers: []*controlServer{s}}
	c.waitLeader(c.servers, formTimeout)
	return s
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// openWatch opens a watch stream and reads until its first heartbeat: the
// stream is served. It returns the stream, the ephemeral copies it got
// before the heartbeat, and the error that ended it if it did not get one.
func openWatch(ctx context.Context, conn *grpc.ClientConn) (llmgwv1.WatchService_WatchClient, []*llmgwv1.EphemeralUpdate, error) {
	w, err := llmgwv1.NewWatchServiceClient(conn).Watch(ctx, &llmgwv1.WatchRequest{})
	if err != nil {
		return nil, nil, err
	}
	var copies []*llmgwv1.EphemeralUpdate
	for {
		ev, err := w.Recv()
		if err != nil {
			return nil, copies, err
		}
		if e := ev.GetEphemeral(); e != nil {
			copies = append(copies, e)
		}
		if ev.GetHeartbeat() != nil {
			return w, copies, nil
		}
	}
}

// TestWatchStreamCapPerCaller: one plain-text caller opens watch streams
// up to max_watch_streams_per_address; the next is refused with
// RESOURCE_EXHAUSTED naming the setting, the open ones keep being served,
// and a closed stream frees its slot.
func TestWatchStreamCapPerCaller(t *testing.T) {
	const maxStreams = 8
	s := limitedServer(t, fmt.Sprintf("max_watch_streams_per_address: %d\n", maxStreams))
	conn := dial(t, s.grpc)
	ctx, cancel := context.WithTimeout(context.Background(), within(60*time.Second))
	defer cancel()

	cancels := make([]context.CancelFunc, maxStreams)
	streams := make([]llmgwv1.WatchService_WatchClient, maxStreams)
	for i := range maxStreams {
		sctx, c := context.WithCancel(ctx)
		cancels[i] = c
		w, _, err := openWatch(sctx, conn)
		if err != nil {
			t.Fatalf("watch %d of %d refused: %v", i+1, maxStreams, err)
		}
		streams[i] = w
	}
	_, _, err := openWatch(ctx, conn)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "max_watch_streams_per_address") {
		t.Fatalf("watch %d: got %v, want RESOURCE_EXHAUSTED naming max_watch_streams_per_address", maxStreams+1, err)
	}
	// The streams under the cap are still served: each gets its next
	// heartbeat.
	for i, w := range streams {
		for {
			ev, err := w.Recv()
			if err != nil {
				t.Fatalf("watch %d ended after the refusal: %v", i+1, err)
			}
			if ev.GetHeartbeat() != nil {
				break
			}
		}
	}
	if v, _ := metric(s.http, "llmgw_control_streams_refused_total"); v < 1 {
		t.Errorf("llmgw_control_streams_refused_total = %v, want at least 1", v)
	}
	// Closing one frees its slot (the server sees the cancel shortly).
	cancels[0]()
	if !eventually(10*time.Second, func() bool {
		_, _, err := openWatch(ctx, conn)
		return err == nil
	}) {
		t.Fatal("no watch accepted after one of the capped streams was closed")
	}
	for _, c := range cancels {
		c()
	}
}

// floodSession runs one anonymous agent session for node and sends it
// updates; it returns the error that ended the session and how many
// updates went out before it did.
func floodSession(ctx context.Context, conn *grpc.ClientConn, node string, epoch uint64, updates func(seq uint64) *llmgwv1.EphemeralUpdate, n int) (error, int) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := llmgwv1.NewAgentServiceClient(conn).Attach(ctx)
	if err != nil {
		return err, 0
	}
	if err := st.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Hello{Hello: &llmgwv1.AgentHello{
		Node: &llmgwv1.Node{Id: node, Address: "127.0.0.1"}, Epoch: epoch,
	}}}); err != nil {
		return err, 0
	}
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := st.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()
	sent := 0
	for seq := uint64(1); sent < n; seq++ {
		if err := st.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Update{Update: updates(seq)}}); err != nil {
			break // the server ended the stream; Recv has why
		}
		sent++
	}
	select {
	case err := <-ended:
		return err, sent
	case <-time.After(within(20 * time.Second)):
		return errors.New("the session was not ended"), sent
	}
}

// statuses is an update of n statuses with ids from offset.
func statuses(node string, epoch, seq uint64, full bool, offset, n int) *llmgwv1.EphemeralUpdate {
	u := &llmgwv1.EphemeralUpdate{Node: node, Epoch: epoch, Seq: seq, Full: full}
	for i := range n {
		u.Statuses = append(u.Statuses, &llmgwv1.ReplicaStatus{
			ReplicaId: fmt.Sprintf("flood-%07d", offset+i), Uid: uint64(offset + i), Node: node, Model: "org/flood",
			Phase: llmgwv1.ReplicaPhase_REPLICA_PHASE_READY, Address: "127.0.0.1:1",
		})
	}
	return u
}

// TestAgentFloodIsCut is the attack of issue #12: an anonymous session
// reporting 300 k statuses once left 562 MB on the control node's heap, and
// the 46 MB it made of the state ended every new router's watch. Now each
// flooding session — many small deltas, huge full copies, a message over
// the gRPC limit — is ended with RESOURCE_EXHAUSTED, its reports are
// dropped, the heap does not keep them, and a new watch still works and
// carries no more than the node's budget.
func TestAgentFloodIsCut(t *testing.T) {
	s := limitedServer(t, "")
	conn := dial(t, s.grpc)
	ctx, cancel := context.WithTimeout(context.Background(), within(240*time.Second))
	defer cancel()
	heap := func() float64 {
		v, ok := metric(s.http, "go_memstats_heap_inuse_bytes")
		if !ok {
			t.Fatal("go_memstats_heap_inuse_bytes not on the control node's /metrics")
		}
		return v
	}
	before := heap()
	epoch := uint64(time.Now().UnixNano())
	const node = "flood"

	// 300 k statuses in deltas of 10 k, after a small full copy.
	err, sent := floodSession(ctx, conn, node, epoch, func(seq uint64) *llmgwv1.EphemeralUpdate {
		if seq == 1 {
			return statuses(node, epoch, 1, true, 0, 1)
		}
		return statuses(node, epoch, seq, false, int(seq)*10000, 10000)
	}, 31)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "agent_replica_slack") {
		t.Fatalf("delta flood: session ended with %v, want RESOURCE_EXHAUSTED naming agent_replica_slack", err)
	}
	t.Logf("delta flood: cut after %d of 31 updates: %v", sent, err)

	// Huge full copies, each under the 4 MiB message limit, each a new
	// session as a reconnecting attacker would make.
	peak := before
	for i := range 20 {
		epoch++
		err, _ := floodSession(ctx, conn, node, epoch, func(seq uint64) *llmgwv1.EphemeralUpdate {
			return statuses(node, epoch, seq, true, 0, 50000)
		}, 1)
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("full-copy flood %d: session ended with %v, want RESOURCE_EXHAUSTED", i, err)
		}
		peak = max(peak, heap())
	}
	// One message over grpc_max_recv_bytes.
	epoch++
	err, _ = floodSession(ctx, conn, node, epoch, func(seq uint64) *llmgwv1.EphemeralUpdate {
		return statuses(node, epoch, seq, true, 0, 300000)
	}, 1)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("oversized message: session ended with %v, want RESOURCE_EXHAUSTED", err)
	}
	if v, _ := metric(s.http, "llmgw_control_agent_sessions_cut_total"); v < 10 {
		t.Errorf("llmgw_control_agent_sessions_cut_total = %v, want at least 10", v)
	}

	// Twenty sessions of 50 k statuses each did not add up: held, they
	// would be a million statuses (the 300 k of the attack held 562 MB).
	if peak > before+96<<20 {
		t.Errorf("heap in use reached %.1f MiB during the floods, from %.1f MiB: the floods' reports were kept", peak/(1<<20), before/(1<<20))
	}
	// The heap returns: nothing of the floods is kept. The garbage goes at
	// the server's next GC, which an idle Go process runs at least every
	// two minutes.
	const margin = 8 << 20
	var after float64
	floodEnd := time.Now()
	if !eventually(150*time.Second, func() bool {
		after = heap()
		return after < before+margin
	}) {
		t.Errorf("heap in use %.1f MiB after the floods, was %.1f MiB before: their reports were kept", after/(1<<20), before/(1<<20))
	}
	t.Logf("heap in use: before %.1f MiB, peak seen %.1f MiB, after %.1f MiB (%s after the last flood)", before/(1<<20), peak/(1<<20), after/(1<<20), time.Since(floodEnd).Round(time.Second))

	// A new watch (a new router) is served, and what it gets of the node
	// is within the budget (8 slack replicas; no desired ones).
	_, copies, err := openWatch(ctx, conn)
	if err != nil {
		t.Fatalf("a new watch after the floods: %v", err)
	}
	for _, c := range copies {
		if c.Node == node && len(c.Statuses) > 9 {
			t.Errorf("the watch carries %d statuses of the flooding node", len(c.Statuses))
		}
	}
	// An honest session for the node is still accepted.
	epoch++
	err, sent = floodSession(ctx, conn, node, epoch, func(seq uint64) *llmgwv1.EphemeralUpdate {
		return statuses(node, epoch, seq, seq == 1, 0, 2)
	}, 3)
	if sent != 3 || status.Code(err) == codes.ResourceExhausted {
		t.Errorf("an honest session after the floods: %d of 3 updates sent, ended with %v", sent, err)
	}
}
