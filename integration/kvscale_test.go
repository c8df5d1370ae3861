package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/chunking"
	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// kvScaleNode is the fake agent's node in TestKVScale.
const kvScaleNode = "kvnode"

// kvScaleBlocks is the KV blocks a replica of TestKVScale holds: 250 k (2 M
// over 8 replicas, the warm node) by default; LLMGW_KVSCALE_BLOCKS
// sets another count.
func kvScaleBlocks(t *testing.T) int {
	if v := os.Getenv("LLMGW_KVSCALE_BLOCKS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("LLMGW_KVSCALE_BLOCKS=%q: want a positive count", v)
		}
		return n
	}
	return 250_000
}

// kvFullCopy is the node's full copy: a ready status and blocks hashes for
// each of its replicas, as an agent's mirror reports them.
func kvFullCopy(epoch uint64, replicas []*llmgwv1.Replica, blocks int) *llmgwv1.EphemeralUpdate {
	u := &llmgwv1.EphemeralUpdate{Node: kvScaleNode, Epoch: epoch, Seq: 1, Full: true}
	for i, r := range replicas {
		u.Statuses = append(u.Statuses, &llmgwv1.ReplicaStatus{ReplicaId: r.Id, Uid: r.Uid, Incarnation: 1, Model: r.Model,
			Node: kvScaleNode, Phase: llmgwv1.ReplicaPhase_REPLICA_PHASE_READY, Address: fmt.Sprintf("127.0.0.1:%d", 40000+i)})
		kv := &llmgwv1.KVBlocks{ReplicaId: r.Id, Uid: r.Uid, Incarnation: 1, Reset_: true, BlockSize: 16, Stored: make([]uint64, blocks)}
		// Uniform, as vLLM's (the low 64 bits of a sha256), and the same
		// for a replica in every session.
		rng := rand.New(rand.NewPCG(uint64(i), 0x6b76))
		for j := range kv.Stored {
			kv.Stored[j] = rng.Uint64()
		}
		u.Kv = append(u.Kv, kv)
	}
	return u
}

// kvAgent is one session of an agent speaking the real AgentService, as
// the fleet's agents do, with the node's whole KV set.
type kvAgent struct {
	welcome  *llmgwv1.Welcome
	replicas []*llmgwv1.Replica
	// sendStart is when the full copy's first chunk went out, sent when
	// the last did.
	sendStart, sent time.Time
	chunks, bytes   int
	ended           chan error
	cancel          context.CancelFunc
}

// drainStatus reads st until it ends and returns how it ended (at most
// 1,000 messages: a server that keeps sending is reported as such).
func drainStatus(st grpc.BidiStreamingClient[llmgwv1.AgentMessage, llmgwv1.ControlMessage]) error {
	for range 1000 {
		if _, err := st.Recv(); err != nil {
			return err
		}
	}
	return errors.New("the stream did not end after 1,000 messages")
}

// attachKV opens a session on conn, waits for the node's desired set to
// hold want replicas, and sends the full copy — in chunks of the welcome's
// budget — with a heartbeat every half second after it.
func attachKV(ctx context.Context, conn *grpc.ClientConn, epoch uint64, want, blocks int) (*kvAgent, error) {
	ctx, cancel := context.WithCancel(ctx)
	st, err := llmgwv1.NewAgentServiceClient(conn).Attach(ctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("attach: %w", err)
	}
	if err := st.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Hello{Hello: &llmgwv1.AgentHello{
		Node: &llmgwv1.Node{Id: kvScaleNode, Address: "127.0.0.1", Gpus: uint32(want), Version: "dev"}, Epoch: epoch,
	}}}); err != nil {
		cancel()
		return nil, fmt.Errorf("hello: %w", err)
	}
	a := &kvAgent{ended: make(chan error, 1), cancel: cancel}
	for a.welcome == nil || len(a.replicas) < want {
		m, err := st.Recv()
		if err != nil {
			cancel()
			return nil, fmt.Errorf("session before the full copy (welcome %v, %d of %d replicas): %w", a.welcome != nil, len(a.replicas), want, err)
		}
		switch b := m.Body.(type) {
		case *llmgwv1.ControlMessage_Welcome:
			a.welcome = b.Welcome
		case *llmgwv1.ControlMessage_Desired:
			a.replicas = b.Desired.GetReplicas()
		}
	}
	if a.welcome.GetMaxChunkBytes() == 0 {
		cancel()
		return nil, errors.New("the welcome offers no chunk budget")
	}
	full := kvFullCopy(epoch, a.replicas, blocks)
	a.sendStart = time.Now()
	parts := chunking.Split(full, int(a.welcome.GetMaxChunkBytes()))
	for _, p := range parts {
		if err := st.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Update{Update: p}}); err != nil {
			// Send says only that the stream ended; the server's status
			// comes after whatever it sent before.
			rerr := drainStatus(st)
			cancel()
			return nil, fmt.Errorf("sending the full copy: %w (the server: %w)", err, rerr)
		}
	}
	a.sent, a.chunks, a.bytes = time.Now(), len(parts), proto.Size(full)
	go func() {
		for {
			if _, err := st.Recv(); err != nil {
				a.ended <- err
				return
			}
		}
	}()
	go func() {
		tk := time.NewTicker(500 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
				if st.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Heartbeat{Heartbeat: &llmgwv1.Heartbeat{UnixNano: time.Now().UnixNano()}}}) != nil {
					return
				}
			}
		}
	}()
	return a, nil
}

// kvWatcher is a router's watch stream on one server, reduced to when it
// first held the node's whole KV set of one epoch.
type kvWatcher struct {
	mu      sync.Mutex
	whole   map[uint64]time.Time // epoch -> when its full copy was whole
	largest int                  // largest ephemeral message, marshaled
	err     error
}

func watchKV(ctx context.Context, t *testing.T, conn *grpc.ClientConn, total int) *kvWatcher {
	t.Helper()
	w := &kvWatcher{whole: map[uint64]time.Time{}}
	st, err := llmgwv1.NewWatchServiceClient(conn).Watch(ctx, &llmgwv1.WatchRequest{ClientId: "kvscale", MaxChunkBytes: 4 << 20})
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	go func() {
		asm := chunking.NewAssembler(0)
		for {
			ev, err := st.Recv()
			if err != nil {
				w.mu.Lock()
				w.err = err
				w.mu.Unlock()
				return
			}
			e := ev.GetEphemeral()
			if e == nil || e.Node != kvScaleNode {
				continue
			}
			size := proto.Size(e)
			u, err := asm.Add(e)
			w.mu.Lock()
			w.largest = max(w.largest, size)
			if err != nil {
				w.err = err
			}
			if u != nil && u.Full {
				n := 0
				for _, k := range u.Kv {
					n += len(k.Stored)
				}
				if _, seen := w.whole[u.Epoch]; n == total && !seen {
					w.whole[u.Epoch] = time.Now()
				}
			}
			w.mu.Unlock()
		}
	}()
	return w
}

// wholeAt waits for the watcher to hold epoch's whole set and returns when
// it did.
func (w *kvWatcher) wholeAt(t *testing.T, who string, epoch uint64, timeout time.Duration) time.Time {
	t.Helper()
	var at time.Time
	if !eventually(timeout, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		var ok bool
		at, ok = w.whole[epoch]
		return ok
	}) {
		w.mu.Lock()
		defer w.mu.Unlock()
		t.Fatalf("%s: no whole KV set of epoch %d within %v (stream: %v)", who, epoch, within(timeout), w.err)
	}
	return at
}

// TestKVScale is issue #13's "no message-size cliffs": a node with 2 M
// cached blocks over 8 replicas — a full copy of 16 MB, four times the
// servers' 4 MiB receive limit — attaches to a 3-server cluster, its
// server is killed, it moves, and a new router joins. Every full copy
// travels in chunks of ephemeral_chunk_bytes (agent → server, server →
// server, server → router): no session is cut for size, every server and
// router gets the whole set, and each full copy is whole within 2 s (the
// issue's bound, scaled by within). The figures are logged for
// docs/benchmarks.md "Large KV caches".
//
// The agent and the watchers are this test's own code, encoding and
// decoding the 16 MB copies in process: under -race (make test) that share
// of each figure runs several times slower than in an llmgw binary, so
// the bound is doubled there (under load it reached 6.3 s against the
// 6 s of CI's scaling).
func TestKVScale(t *testing.T) {
	const replicas = 8
	blocks := kvScaleBlocks(t)
	total := replicas * blocks
	bound := within(2 * time.Second)
	if raceBuild {
		bound *= 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), within(120*time.Second))
	defer cancel()

	// This test's agent builds its 16 MB full copy between the desired set
	// and the first chunk, sending nothing meanwhile (an agent's heartbeats
	// run beside its work; this one's do not): under -race on a loaded
	// machine that took longer than the default agent_timeout (1.5 s), and
	// the session was ended for silence before the copy went out.
	cfg := filepath.Join(t.TempDir(), "control.yaml")
	writeFile(t, cfg, "agent_timeout: 30s\n")
	c := &cluster{t: t}
	for i := 1; i <= 3; i++ {
		c.servers = append(c.servers, newServer(t, fmt.Sprintf("c%d", i), serverOpts{extra: []string{"--config", cfg}}))
	}
	c.startJoined()
	leader := c.waitLeader(c.servers, formTimeout)
	adm, closeAdm := admin(t, leader.grpc)
	defer closeAdm()
	if _, err := adm.ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: &llmgwv1.Model{
		Name: "kv", Engine: "sim", Model: "llmgw/kv", Replicas: replicas, GpusPerReplica: 1}}); err != nil {
		t.Fatalf("apply model: %v", err)
	}
	// The agent attaches to a follower; each server has a watcher (a
	// router) from the start.
	var home *controlServer
	for _, s := range c.servers {
		if s != leader {
			home = s
			break
		}
	}
	conns := map[*controlServer]*grpc.ClientConn{}
	watchers := map[*controlServer]*kvWatcher{}
	for _, s := range c.servers {
		conns[s] = dial(t, s.grpc)
		watchers[s] = watchKV(ctx, t, conns[s], total)
	}

	var figures []string
	report := func(what string, d time.Duration) {
		figures = append(figures, fmt.Sprintf("%s %v", what, d.Round(time.Millisecond)))
		if d > bound {
			t.Errorf("%s took %v, above the %v bound", what, d.Round(time.Millisecond), bound)
		}
	}
	epoch := uint64(time.Now().UnixNano())
	a, err := attachKV(ctx, conns[home], epoch, replicas, blocks)
	if err != nil {
		t.Fatal(err)
	}
	defer a.cancel()
	t.Logf("full copy of %d blocks (%d MB) sent to %s in %d chunks of ≤ %d bytes in %v",
		total, a.bytes>>20, home.id, a.chunks, a.welcome.GetMaxChunkBytes(), a.sent.Sub(a.sendStart).Round(time.Millisecond))
	for _, s := range c.servers {
		role := "peer"
		if s == home {
			role = "own"
		}
		report(fmt.Sprintf("attach: agent → %s (%s) → watcher", s.id, role), watchers[s].wholeAt(t, s.id, epoch, 30*time.Second).Sub(a.sendStart))
	}
	for _, s := range c.servers {
		if v, ok := testkit.Scrape(s.http, "llmgw_control_agent_sessions_cut_total", nil); ok && v != 0 {
			t.Errorf("%s cut %v agent sessions", s.id, v)
		}
	}

	// The agent's server is killed; the agent moves to another with a new
	// session (a new epoch) and sends its full copy again.
	home.kill()
	select {
	case err := <-a.ended:
		t.Logf("the agent's session on %s ended: %v", home.id, err)
	case <-time.After(within(10 * time.Second)):
		t.Fatalf("the agent's session did not end when %s was killed", home.id)
	}
	a.cancel()
	rest := without(c.servers, home)
	next := rest[0]
	epoch++
	var b *kvAgent
	if err := eventuallyErr(30*time.Second, func() error {
		// Until the others see home gone, the leader may still be
		// electing; a refused hello is retried, as an agent does.
		var err error
		b, err = attachKV(ctx, conns[next], epoch, replicas, blocks)
		return err
	}); err != nil {
		t.Fatalf("the agent could not re-attach to %s: %v", next.id, err)
	}
	defer b.cancel()
	for _, s := range rest {
		role := "peer"
		if s == next {
			role = "own"
		}
		report(fmt.Sprintf("move: agent → %s (%s) → watcher", s.id, role), watchers[s].wholeAt(t, s.id, epoch, 30*time.Second).Sub(b.sendStart))
	}

	// A new router joins: a real `llmgw router` and a watch stream, each
	// must get the whole set.
	joined := time.Now()
	nw := watchKV(ctx, t, dial(t, rest[1].grpc), total)
	report(fmt.Sprintf("new watcher on %s: watch → whole set", rest[1].id), nw.wholeAt(t, "new watcher", epoch, 30*time.Second).Sub(joined))
	start := time.Now()
	r := startRouterProc(t, "r1", rest[1].grpc)
	var entries float64
	if !eventually(30*time.Second, func() bool {
		entries, _ = testkit.Scrape(r.ops, "llmgw_router_kvindex_entries", nil)
		return entries == float64(total)
	}) {
		t.Fatalf("the new router's KV index holds %v entries, want %d", entries, total)
	}
	filled := time.Now()
	figures = append(figures, fmt.Sprintf("new llmgw router: process start → %d entries in its KV index %v", total, filled.Sub(start).Round(time.Millisecond)))
	if m := streamOpenRE.FindStringSubmatch(r.output()); m != nil {
		if at, err := time.Parse(time.RFC3339Nano, m[1]); err == nil {
			report("new llmgw router: watch open → KV index whole", filled.Sub(at))
		}
	}

	for _, s := range rest {
		if v, ok := testkit.Scrape(s.http, "llmgw_control_agent_sessions_cut_total", nil); ok && v != 0 {
			t.Errorf("%s cut %v agent sessions", s.id, v)
		}
	}
	for s, w := range watchers {
		w.mu.Lock()
		if w.largest > 4<<20 {
			t.Errorf("%s sent a %d-byte ephemeral message to its watcher", s.id, w.largest)
		}
		w.mu.Unlock()
	}
	for _, f := range figures {
		t.Log(f)
	}
}
