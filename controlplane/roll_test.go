package controlplane

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// autoAgent is an agent that runs whatever it is given at once: every
// desired replica is reported READY, a draining one STOPPED.
func autoAgent(ctx context.Context, t *testing.T, r *running, node string, gpus uint32) (stop func()) {
	t.Helper()
	a := attachAgent(ctx, t, r, node, gpus, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		var seq uint64
		for {
			m, err := a.stream.Recv()
			if err != nil {
				return
			}
			d := m.GetDesired()
			if d == nil {
				continue
			}
			seq++
			u := &llmgwv1.EphemeralUpdate{Node: node, Epoch: 1, Seq: seq, Full: true}
			for _, rep := range d.Replicas {
				p := llmgwv1.ReplicaPhase_REPLICA_PHASE_READY
				if rep.Draining {
					p = llmgwv1.ReplicaPhase_REPLICA_PHASE_STOPPED
				}
				u.Statuses = append(u.Statuses, &llmgwv1.ReplicaStatus{ReplicaId: rep.Id, Uid: rep.Uid, Incarnation: 1, Model: rep.Model, Node: node, Phase: p})
			}
			if a.stream.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Update{Update: u}}) != nil {
				return
			}
		}
	})
	return func() { a.cancel(); wg.Wait() }
}

// TestDrainAndRoll: a node that attaches after the model was placed gets
// its share (the spread rule), draining a node moves its replicas off one
// at a time, and re-applying a model with a changed spec rolls its
// replicas one at a time; a watcher never sees the model with fewer than
// its count serving or more than one extra (design §4 "Changes roll",
// §5.5).
func TestDrainAndRoll(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := testConfig(t, t.TempDir(), freeAddr(t))
	cfg.ReconcileInterval = 20 * time.Millisecond
	r := start(t, cfg)
	defer r.stop(t)
	admin := llmgwv1.NewAdminServiceClient(r.conn)

	stop1 := autoAgent(ctx, t, r, "n1", 2)
	defer stop1()
	model := &llmgwv1.Model{Name: "m", Engine: "sim", Model: "x", Replicas: 2}
	if _, err := admin.ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: model}); err != nil {
		t.Fatal(err)
	}
	replicas := func() []*llmgwv1.ReplicaView {
		reps, err := admin.ListReplicas(ctx, &llmgwv1.ListRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return reps.Replicas
	}
	// settled waits for two ready replicas that each pass ok and, when
	// nodes are given, sit one on each of them.
	settled := func(what string, ok func(*llmgwv1.Replica) bool, nodes ...string) {
		t.Helper()
		testkit.WaitCtx(ctx, t, what, func() error {
			rs := replicas()
			if len(rs) != 2 {
				return fmt.Errorf("%d replicas", len(rs))
			}
			if len(nodes) > 0 && !(rs[0].Replica.Node != rs[1].Replica.Node &&
				slices.Contains(nodes, rs[0].Replica.Node) && slices.Contains(nodes, rs[1].Replica.Node)) {
				return fmt.Errorf("replicas on %s and %s, want one on each of %v", rs[0].Replica.Node, rs[1].Replica.Node, nodes)
			}
			for _, v := range rs {
				if !ok(v.Replica) || v.Replica.Draining || v.Status.GetPhase() != llmgwv1.ReplicaPhase_REPLICA_PHASE_READY {
					return fmt.Errorf("%v %v", v.Replica, v.Status)
				}
			}
			return nil
		})
	}
	settled("two ready replicas on n1", func(r *llmgwv1.Replica) bool { return r.Node == "n1" })
	stop2 := autoAgent(ctx, t, r, "n2", 2)
	defer stop2()
	settled("the spread: one replica on each node", func(*llmgwv1.Replica) bool { return true }, "n1", "n2")

	// The watcher checks every revision it is brought to.
	watch, err := llmgwv1.NewWatchServiceClient(r.conn).Watch(ctx, &llmgwv1.WatchRequest{ClientId: "roll"})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var violations []string
	wctx, stopWatch := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stopWatch(); wg.Wait() }()
	wg.Go(func() {
		held := map[string]*llmgwv1.Replica{}
		check := func(rev uint64) {
			serving := 0
			for _, r := range held {
				if !r.Draining {
					serving++
				}
			}
			if serving > 3 || serving < 2 {
				mu.Lock()
				violations = append(violations, fmt.Sprintf("revision %d: %d serving", rev, serving))
				mu.Unlock()
			}
		}
		for {
			e, err := watch.Recv()
			if err != nil || wctx.Err() != nil {
				return
			}
			switch {
			case e.GetSnapshotBegin() != nil:
				held = map[string]*llmgwv1.Replica{}
			case e.GetChange().GetReplica() != nil:
				c := e.GetChange()
				if c.Op == llmgwv1.ChangeOp_CHANGE_OP_DELETE {
					delete(held, c.GetReplica().Id)
				} else {
					held[c.GetReplica().Id] = c.GetReplica()
				}
			case e.GetSnapshotEnd() != nil:
				check(e.GetSnapshotEnd().Revision)
			case e.GetMark() != nil:
				check(e.GetMark().Revision)
			}
		}
	})
	go func() { <-wctx.Done(); watch.CloseSend() }()

	before := map[uint64]bool{}
	for _, v := range replicas() {
		before[v.Replica.Uid] = true
	}
	if _, err := admin.DrainNode(ctx, &llmgwv1.DrainNodeRequest{Id: "n1"}); err != nil {
		t.Fatalf("drain: %v", err)
	}
	settled("both replicas on n2", func(r *llmgwv1.Replica) bool { return r.Node == "n2" })
	if _, err := admin.DrainNode(ctx, &llmgwv1.DrainNodeRequest{Id: "n1", Undrain: true}); err != nil {
		t.Fatalf("undrain: %v", err)
	}
	ns, err := admin.ListNodes(ctx, &llmgwv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns.Nodes {
		if n.State != llmgwv1.NodeState_NODE_STATE_ACTIVE {
			t.Fatalf("after undrain: %v", n)
		}
	}
	if _, err := admin.DrainNode(ctx, &llmgwv1.DrainNodeRequest{Id: "nope"}); err == nil {
		t.Fatal("drained an unknown node")
	}
	settled("the spread again after the undrain", func(*llmgwv1.Replica) bool { return true }, "n1", "n2")

	// Re-apply with a changed spec: every replica is replaced.
	before = map[uint64]bool{}
	for _, v := range replicas() {
		before[v.Replica.Uid] = true
	}
	model.ExtraArgs = []string{"--max-model-len", "4096"}
	applied, err := admin.ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: model})
	if err != nil {
		t.Fatal(err)
	}
	rev := applied.Model.Revision
	settled("both replicas rolled", func(r *llmgwv1.Replica) bool { return r.ModelRevision == rev && !before[r.Uid] }, "n1", "n2")

	// A routing change alone restarts nothing.
	before = map[uint64]bool{}
	for _, v := range replicas() {
		before[v.Replica.Uid] = true
	}
	model.Profile = "batch"
	if _, err := admin.ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: model}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // several reconcile rounds; not a timing assertion
	for _, v := range replicas() {
		if !before[v.Replica.Uid] {
			t.Fatalf("a routing change replaced %v", v.Replica)
		}
	}

	stopWatch()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(violations) > 0 {
		t.Fatalf("capacity left its bounds during the moves: %v", violations)
	}
}
