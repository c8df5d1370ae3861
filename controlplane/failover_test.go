package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// fakeAgent is an agent session over real gRPC: hello, then numbered
// updates the test sends.
type fakeAgent struct {
	t      *testing.T
	stream llmgwv1.AgentService_AttachClient
	cancel context.CancelFunc
	node   string
	epoch  uint64
	seq    uint64
}

func attachAgent(ctx context.Context, t *testing.T, r *running, node string, gpus uint32, epoch uint64) *fakeAgent {
	t.Helper()
	actx, cancel := context.WithCancel(ctx)
	st, err := llmgwv1.NewAgentServiceClient(r.conn).Attach(actx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Hello{Hello: &llmgwv1.AgentHello{
		Node: &llmgwv1.Node{Id: node, Address: "127.0.0.1", Gpus: gpus}, Epoch: epoch,
	}}}); err != nil {
		t.Fatal(err)
	}
	if recvAgent(t, st).GetWelcome() == nil {
		t.Fatal("no welcome")
	}
	return &fakeAgent{t: t, stream: st, cancel: cancel, node: node, epoch: epoch}
}

// send sends the next update: the first of a session is a full copy.
func (a *fakeAgent) send(statuses ...*llmgwv1.ReplicaStatus) uint64 {
	a.t.Helper()
	a.seq++
	u := &llmgwv1.EphemeralUpdate{Node: a.node, Epoch: a.epoch, Seq: a.seq, Full: a.seq == 1, Statuses: statuses}
	if err := a.stream.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Update{Update: u}}); err != nil {
		a.t.Fatalf("agent send: %v", err)
	}
	return a.seq
}

func phase(id string, uid, inc uint64, p llmgwv1.ReplicaPhase) *llmgwv1.ReplicaStatus {
	return &llmgwv1.ReplicaStatus{ReplicaId: id, Uid: uid, Incarnation: inc, Node: "n1", Phase: p}
}

func heldBy(r *running, node string) (uint64, uint64) {
	e, s, _ := r.srv.eph.Held(node)
	return e, s
}

func wantHeld(ctx context.Context, t *testing.T, r *running, node string, epoch, seq uint64) {
	t.Helper()
	testkit.WaitCtx(ctx, t, fmt.Sprintf("%s holds %s at %d/%d", r.srv.cfg.NodeID, node, epoch, seq), func() error {
		if e, s := heldBy(r, node); e != epoch || s != seq {
			return fmt.Errorf("holds %d/%d", e, s)
		}
		return nil
	})
}

// TestEphemeralPlane: an agent's updates on one server reach a watcher on
// another with the agent's epoch and seq; a lost forward is repaired by
// the gap's full-copy request, a lost last delta by the push/pull digest;
// the agent moving to another server with a newer epoch supersedes its old
// session everywhere, and the old session is closed (design §5.4).
func TestEphemeralPlane(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var dropTo atomic.Value
	dropTo.Store("")
	c := newHAClusterWith(t, 3, nil, func(s *Server) {
		s.dropForward = func(peer string, _ []byte) bool { return peer == dropTo.Load().(string) }
	}, "c1", "c2", "c3")
	c.agreedLeader(ctx, 3)
	c1, c2, c3 := c.nodes["c1"], c.nodes["c2"], c.nodes["c3"]

	watch, err := llmgwv1.NewWatchServiceClient(c2.conn).Watch(ctx, &llmgwv1.WatchRequest{ClientId: "test"})
	if err != nil {
		t.Fatal(err)
	}
	// The watcher's ephemeral events for n1, in order, as (epoch, seq).
	var mu sync.Mutex
	var seen [][2]uint64
	var wg sync.WaitGroup
	wctx, stopWatch := context.WithCancel(ctx)
	defer func() { stopWatch(); wg.Wait() }()
	wg.Go(func() {
		for {
			e, err := watch.Recv()
			if err != nil || wctx.Err() != nil {
				return
			}
			if u := e.GetEphemeral(); u.GetNode() == "n1" {
				mu.Lock()
				seen = append(seen, [2]uint64{u.Epoch, u.Seq})
				mu.Unlock()
			}
		}
	})
	go func() { <-wctx.Done(); watch.CloseSend() }()

	a := attachAgent(ctx, t, c1, "n1", 1, 100)
	a.send(phase("m-0", 1, 1, llmgwv1.ReplicaPhase_REPLICA_PHASE_STARTING))
	a.send(phase("m-0", 1, 1, llmgwv1.ReplicaPhase_REPLICA_PHASE_READY))
	a.send(phase("m-0", 1, 1, llmgwv1.ReplicaPhase_REPLICA_PHASE_READY))
	for _, r := range []*running{c1, c2, c3} {
		wantHeld(ctx, t, r, "n1", 100, 3)
	}
	testkit.WaitCtx(ctx, t, "the watcher on c2 sees 100/3", func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(seen) == 0 || seen[len(seen)-1] != [2]uint64{100, 3} {
			return fmt.Errorf("seen %v", seen)
		}
		return nil
	})
	testkit.WaitCtx(ctx, t, "c3 sees n1 attached", func() error {
		ns, err := c.admin("c3").ListNodes(ctx, &llmgwv1.ListRequest{})
		if err != nil || !ns.Connected["n1"] {
			return fmt.Errorf("connected %v, %w", ns.GetConnected(), err)
		}
		return nil
	})

	// A forward to c3 is lost; the next delta reveals the gap.
	dropTo.Store("c3")
	a.send(phase("m-0", 1, 2, llmgwv1.ReplicaPhase_REPLICA_PHASE_STARTING))
	wantHeld(ctx, t, c2, "n1", 100, 4)
	dropTo.Store("")
	a.send(phase("m-0", 1, 2, llmgwv1.ReplicaPhase_REPLICA_PHASE_READY))
	wantHeld(ctx, t, c3, "n1", 100, 5)

	// The last delta to c3 is lost: nothing follows it, so only the digest
	// (push/pull every second here) reveals it.
	dropTo.Store("c3")
	a.send(phase("m-0", 1, 3, llmgwv1.ReplicaPhase_REPLICA_PHASE_READY))
	wantHeld(ctx, t, c2, "n1", 100, 6)
	time.Sleep(200 * time.Millisecond) // let the lost batch go; not a timing assertion
	dropTo.Store("")
	wantHeld(ctx, t, c3, "n1", 100, 6)

	// The agent moves to c2 with a newer epoch.
	b := attachAgent(ctx, t, c2, "n1", 1, 200)
	b.send(phase("m-0", 1, 3, llmgwv1.ReplicaPhase_REPLICA_PHASE_READY))
	for _, r := range []*running{c1, c2, c3} {
		wantHeld(ctx, t, r, "n1", 200, 1)
	}
	// The old session's late delta is dropped everywhere, and c1 closes it.
	// c1 may have closed it already, when the newer epoch reached it first:
	// then the send sees the closed stream (io.EOF) and Recv has the status.
	a.seq++
	late := &llmgwv1.EphemeralUpdate{Node: a.node, Epoch: a.epoch, Seq: a.seq,
		Statuses: []*llmgwv1.ReplicaStatus{phase("m-0", 1, 9, llmgwv1.ReplicaPhase_REPLICA_PHASE_FAILED)}}
	if err := a.stream.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Update{Update: late}}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("agent send: %v", err)
	}
	for {
		_, err := a.stream.Recv()
		if err != nil {
			if status.Code(err) != codes.Aborted {
				t.Fatalf("old session ended with %v, want ABORTED (superseded)", err)
			}
			break
		}
	}
	time.Sleep(300 * time.Millisecond) // several ticks for a wrong forward to land; not a timing assertion
	for _, r := range []*running{c1, c2, c3} {
		wantHeld(ctx, t, r, "n1", 200, 1)
	}
	testkit.WaitCtx(ctx, t, "the watcher on c2 sees 200/1", func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(seen) == 0 || seen[len(seen)-1] != [2]uint64{200, 1} {
			return fmt.Errorf("seen %v", seen)
		}
		return nil
	})
	mu.Lock()
	for i := 1; i < len(seen); i++ {
		if seen[i][0] < seen[i-1][0] || (seen[i][0] == seen[i-1][0] && seen[i][1] <= seen[i-1][1]) {
			t.Errorf("the watcher went backwards: %v", seen)
		}
	}
	mu.Unlock()
	a.cancel()
	b.cancel()
}

// TestFailoverGrace: the leader is stopped; a node attached to a follower
// is never counted down, a node whose only session was on the stopped
// leader is not counted down within the grace after the new leader's
// election, and once past it (no session anywhere) it is marked down and
// its replica rescheduled with a new uid (design §5.4, §5.5). Time is the
// injected clock, shared by the servers.
func TestFailoverGrace(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	clock := &fakeClock{now: time.Unix(1_000_000, 0)}
	c := newHAClusterWith(t, 3, func(cfg *Config) {
		cfg.ReconcileInterval = 20 * time.Millisecond
		cfg.NodeDownAfter = time.Hour
		cfg.RescheduleAfter = 2 * time.Hour
	}, func(s *Server) { s.now = clock.Now }, "c1", "c2", "c3")
	leader := c.agreedLeader(ctx, 3)
	f := c.follower(leader)
	a1 := attachAgent(ctx, t, c.nodes[f], "n1", 2, 1)
	defer a1.cancel()
	a2 := attachAgent(ctx, t, c.nodes[leader], "n2", 1, 1)
	defer a2.cancel()
	if _, err := c.admin(f).ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: &llmgwv1.Model{Name: "m", Engine: "sim", Model: "x", Replicas: 2}}); err != nil {
		t.Fatal(err)
	}
	replicaOn := func(via, node string) *llmgwv1.Replica {
		reps, err := c.admin(via).ListReplicas(ctx, &llmgwv1.ListRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range reps.Replicas {
			if v.Replica.Node == node {
				return v.Replica
			}
		}
		return nil
	}
	testkit.WaitCtx(ctx, t, "a replica on each node", func() error {
		if replicaOn(f, "n1") == nil || replicaOn(f, "n2") == nil {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	onN2 := replicaOn(f, "n2")
	for id := range c.nodes {
		testkit.WaitCtx(ctx, t, id+" sees both agents attached", func() error {
			ns, err := c.admin(id).ListNodes(ctx, &llmgwv1.ListRequest{})
			if err != nil || !ns.Connected["n1"] || !ns.Connected["n2"] {
				return fmt.Errorf("connected %v, %w", ns.GetConnected(), err)
			}
			return nil
		})
	}

	c.stop(leader)
	newLeader := c.agreedLeader(ctx, 3)
	testkit.WaitCtx(ctx, t, "the new leader past its barrier", func() error {
		if !c.nodes[newLeader].srv.store.LeaderReady() {
			return fmt.Errorf("not ready")
		}
		return nil
	})
	// The new leader learns of n1's session on the follower some time
	// after its election (later on a loaded machine); the injected clock
	// jumps an hour in a moment, so the test waits for that first, as the
	// grace would in real time.
	testkit.WaitCtx(ctx, t, "the new leader to see n1's session on a follower", func() error {
		ns, err := c.admin(newLeader).ListNodes(ctx, &llmgwv1.ListRequest{})
		if err != nil || !ns.Connected["n1"] {
			return fmt.Errorf("connected %v, %w", ns.GetConnected(), err)
		}
		return nil
	})
	time.Sleep(200 * time.Millisecond) // its first reconcile rounds; not a timing assertion
	state := func(id string) llmgwv1.NodeState {
		ns, err := c.admin(newLeader).ListNodes(ctx, &llmgwv1.ListRequest{})
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
	clock.Advance(59 * time.Minute)
	time.Sleep(200 * time.Millisecond) // several reconcile rounds at 20 ms; not a timing assertion
	for _, n := range []string{"n1", "n2"} {
		if st := state(n); st != llmgwv1.NodeState_NODE_STATE_ACTIVE {
			t.Fatalf("%s is %v within the grace after the election", n, st)
		}
	}
	clock.Advance(2 * time.Minute)
	testkit.WaitCtx(ctx, t, "n2 down", func() error {
		if st := state("n2"); st != llmgwv1.NodeState_NODE_STATE_DOWN {
			return fmt.Errorf("n2 is %v", st)
		}
		return nil
	})
	if st := state("n1"); st != llmgwv1.NodeState_NODE_STATE_ACTIVE {
		t.Fatalf("n1, attached to a live follower, is %v", st)
	}
	clock.Advance(3 * time.Hour)
	testkit.WaitCtx(ctx, t, "n2's replica rescheduled on n1", func() error {
		reps, err := c.admin(newLeader).ListReplicas(ctx, &llmgwv1.ListRequest{})
		if err != nil {
			return err
		}
		onN1 := 0
		for _, v := range reps.Replicas {
			if v.Replica.Node == "n2" {
				return fmt.Errorf("still on n2: %v", v.Replica)
			}
			if v.Replica.Node == "n1" {
				onN1++
				if v.Replica.Uid == onN2.Uid {
					return fmt.Errorf("rescheduled with the old uid %d", onN2.Uid)
				}
			}
		}
		if onN1 != 2 {
			return fmt.Errorf("%d on n1", onN1)
		}
		return nil
	})
}
