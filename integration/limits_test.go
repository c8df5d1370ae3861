package integration

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/internal/testkit"
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
	if v, _ := testkit.Scrape(s.http, "llmgw_control_streams_refused_total", nil); v < 1 {
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
// updates; it returns how many updates went out and the error that ended
// the session.
func floodSession(ctx context.Context, conn *grpc.ClientConn, node string, epoch uint64, updates func(seq uint64) *llmgwv1.EphemeralUpdate, n int) (int, error) {
	// Built before the hello: a slow (race-instrumented) build of a huge
	// update must not look like a silent agent.
	first := updates(1)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := llmgwv1.NewAgentServiceClient(conn).Attach(ctx)
	if err != nil {
		return 0, err
	}
	if err := st.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Hello{Hello: &llmgwv1.AgentHello{
		Node: &llmgwv1.Node{Id: node, Address: "127.0.0.1"}, Epoch: epoch,
	}}}); err != nil {
		return 0, err
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
		u := first
		if seq > 1 {
			u = updates(seq)
		}
		if err := st.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Update{Update: u}}); err != nil {
			break // the server ended the stream; Recv has why
		}
		sent++
	}
	select {
	case err := <-ended:
		return sent, err
	case <-time.After(within(20 * time.Second)):
		return sent, errors.New("the session was not ended")
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
	// A 3 MB full copy can take longer than the default 1.5 s agent
	// timeout to build and send under -race on a loaded machine; the
	// session must end for its size, not for silence.
	s := limitedServer(t, "agent_timeout: 30s\n")
	conn := dial(t, s.grpc)
	ctx, cancel := context.WithTimeout(context.Background(), within(240*time.Second))
	defer cancel()
	heap := func() float64 {
		v, ok := testkit.Scrape(s.http, "go_memstats_heap_inuse_bytes", nil)
		if !ok {
			t.Fatal("go_memstats_heap_inuse_bytes not on the control node's /metrics")
		}
		return v
	}
	before := heap()
	epoch := uint64(time.Now().UnixNano())
	const node = "flood"

	// 300 k statuses in deltas of 10 k, after a small full copy.
	sent, err := floodSession(ctx, conn, node, epoch, func(seq uint64) *llmgwv1.EphemeralUpdate {
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
		_, err := floodSession(ctx, conn, node, epoch, func(seq uint64) *llmgwv1.EphemeralUpdate {
			return statuses(node, epoch, seq, true, 0, 50000)
		}, 1)
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("full-copy flood %d: session ended with %v, want RESOURCE_EXHAUSTED", i, err)
		}
		peak = max(peak, heap())
	}
	// One message over grpc_max_recv_bytes (100 k statuses are 6 MB).
	epoch++
	_, err = floodSession(ctx, conn, node, epoch, func(seq uint64) *llmgwv1.EphemeralUpdate {
		return statuses(node, epoch, seq, true, 0, 100000)
	}, 1)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("oversized message: session ended with %v, want RESOURCE_EXHAUSTED", err)
	}
	if v, _ := testkit.Scrape(s.http, "llmgw_control_agent_sessions_cut_total", nil); v < 10 {
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
	sent, err = floodSession(ctx, conn, node, epoch, func(seq uint64) *llmgwv1.EphemeralUpdate {
		return statuses(node, epoch, seq, seq == 1, 0, 2)
	}, 3)
	if sent != 3 || status.Code(err) == codes.ResourceExhausted {
		t.Errorf("an honest session after the floods: %d of 3 updates sent, ended with %v", sent, err)
	}
}

// zmtpGreeting is a ZMTP 3.0 NULL-mechanism greeting, as a peer sends it.
func zmtpGreeting() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xFF, 0x7F, 3, 0
	copy(g[12:32], "NULL")
	return g
}

// zmtpReadyPub is a READY command announcing a PUB socket.
func zmtpReadyPub() []byte {
	body := append([]byte{5}, "READY"...)
	body = append(body, 11)
	body = append(body, "Socket-Type"...)
	body = binary.BigEndian.AppendUint32(body, 3)
	body = append(body, "PUB"...)
	return append([]byte{0x04, byte(len(body))}, body...)
}

// TestKVSocketOversizedFrame: a peer on an engine's KV-event socket of a
// real `llmgw agent` claims frames larger than --kv-max-frame-bytes — past
// any allocation, and just over the flag's 1 MiB (under the 16 MiB
// default, so the flag is what refuses it). Each costs the peer its
// connection: the agent keeps running, counts the refusals, and the
// replica keeps serving.
func TestKVSocketOversizedFrame(t *testing.T) {
	s := limitedServer(t, "")
	// Loopback TCP (the fallback): a peer of the agent's own user (this
	// test runs as the agent does) passes the socket's user check and is
	// left to the frame bound, which is what this test is about.
	a := startAgentProc(t, "n1", []string{s.grpc}, "--kv-max-frame-bytes", "1048576", "--kv-events-tcp")
	file := filepath.Join(t.TempDir(), "kvx.yaml")
	writeFile(t, file, kvModelYAML("kvx", 1))
	if out, err := s.ctl("model", "apply", "-f", file); err != nil {
		t.Fatalf("model apply: %v: %s", err, out)
	}
	rep := waitServing(t, s.grpc, "kvx", 1)[0]
	b, err := os.ReadFile(filepath.Join(a.dataDir, "ports.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ports map[string]int
	if err := json.Unmarshal(b, &ports); err != nil {
		t.Fatal(err)
	}
	port, ok := ports[rep.Replica.ID+"/kv-events"]
	if !ok {
		t.Fatalf("no kv-events port for %s in the agent's ports file: %v", rep.Replica.ID, ports)
	}
	huge := binary.BigEndian.AppendUint64([]byte{0x02}, 1<<62)
	overFlag := binary.BigEndian.AppendUint64([]byte{0x02}, 1<<20+1)
	for i, frame := range [][]byte{huge, overFlag} {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range [][]byte{zmtpGreeting(), zmtpReadyPub(), frame} {
			if _, err := c.Write(p); err != nil {
				break // closed on us part way
			}
		}
		_ = c.SetReadDeadline(time.Now().Add(within(10 * time.Second)))
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Fatalf("attack %d: the agent did not close the connection: %v", i, err)
		}
		c.Close()
		if !eventually(10*time.Second, func() bool {
			v, _ := testkit.Scrape(a.http, "llmgw_agent_kv_frames_refused_total", nil)
			return v >= float64(i+1)
		}) {
			v, _ := testkit.Scrape(a.http, "llmgw_agent_kv_frames_refused_total", nil)
			t.Fatalf("attack %d: llmgw_agent_kv_frames_refused_total = %v, want %d", i, v, i+1)
		}
	}
	if !a.running() {
		t.Fatal("the agent exited")
	}
	resp, err := http.Get("http://" + a.http + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("agent /healthz after the attacks: %v %v", resp, err)
	}
	resp.Body.Close()
	waitServing(t, s.grpc, "kvx", 1)
}
