package controlplane

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// loraAgent runs whatever it is given at once: every desired replica READY,
// every placed adapter LOADED (FAILED for the names in fail), with the
// activity the test sets. Each report is a full copy.
type loraAgent struct {
	a  *fakeAgent
	wg sync.WaitGroup

	mu      sync.Mutex
	desired *llmgwv1.DesiredReplicas
	active  map[string]uint32 // adapter -> requests running
	fail    map[string]bool
}

func startLoraAgent(ctx context.Context, t *testing.T, r *running, node string, gpus uint32) *loraAgent {
	t.Helper()
	l := &loraAgent{a: attachAgent(ctx, t, r, node, gpus, 1), active: map[string]uint32{}, fail: map[string]bool{}}
	l.wg.Go(func() {
		for {
			m, err := l.a.stream.Recv()
			if err != nil {
				return
			}
			if d := m.GetDesired(); d != nil {
				l.mu.Lock()
				l.desired = d
				l.mu.Unlock()
				if l.report() != nil {
					return
				}
			}
		}
	})
	return l
}

func (l *loraAgent) report() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.desired == nil {
		return nil
	}
	l.a.seq++
	u := &llmgwv1.EphemeralUpdate{Node: l.a.node, Epoch: l.a.epoch, Seq: l.a.seq, Full: true}
	uids := map[string]uint64{}
	for _, rep := range l.desired.Replicas {
		uids[rep.Id] = rep.Uid
		u.Statuses = append(u.Statuses, &llmgwv1.ReplicaStatus{ReplicaId: rep.Id, Uid: rep.Uid, Incarnation: 1, Model: rep.Model, Node: l.a.node, Phase: llmgwv1.ReplicaPhase_REPLICA_PHASE_READY})
	}
	for _, p := range l.desired.Adapters {
		for _, id := range p.Replicas {
			uid, ok := uids[id]
			if !ok {
				continue
			}
			st := &llmgwv1.AdapterStatus{ReplicaId: id, Uid: uid, Incarnation: 1, Adapter: p.Adapter, State: llmgwv1.AdapterState_ADAPTER_STATE_LOADED,
				Active: l.active[p.Adapter], LastActiveUnixNano: 1}
			if l.fail[p.Adapter] {
				st.State, st.Reason = llmgwv1.AdapterState_ADAPTER_STATE_FAILED, "no such directory"
			}
			u.Adapters = append(u.Adapters, st)
		}
	}
	return l.a.stream.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Update{Update: u}})
}

func (l *loraAgent) setActive(t *testing.T, adapter string, n uint32) {
	t.Helper()
	l.mu.Lock()
	l.active[adapter] = n
	l.mu.Unlock()
	if err := l.report(); err != nil {
		t.Fatal(err)
	}
}

func (l *loraAgent) stop() { l.a.cancel(); l.wg.Wait() }

// modelReplicas is the model's replicas by id, as s has applied them.
func modelReplicas(s *Server, model string) map[string]*llmgwv1.Replica {
	out := map[string]*llmgwv1.Replica{}
	for _, r := range s.fsm.State().Replicas {
		if r.Model == model {
			out[r.Id] = r
		}
	}
	return out
}

// replicaReady: READY for this uid, and not draining, as s knows it.
func replicaReady(s *Server, r *llmgwv1.Replica) bool {
	return !r.Draining && s.eph.StatusOf(r).GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY
}

// adapterPuts counts the committed placements that put adapter on a
// replica it was not on before.
func adapterPuts(s *Server, adapter string) int {
	ch, _ := s.fsm.ChangesSince(0)
	n := 0
	var prev []string
	for _, c := range ch {
		p := c.GetAdapterPlacement()
		if p.GetAdapter() != adapter {
			continue
		}
		if c.Op == llmgwv1.ChangeOp_CHANGE_OP_DELETE {
			prev = nil
			continue
		}
		for _, id := range p.Replicas {
			if !slices.Contains(prev, id) {
				n++
			}
		}
		prev = p.Replicas
	}
	return n
}

// startLoraModel applies model lora (2 replicas, max_loaded_adapters 1,
// the adapters named) on r, attaches a loraAgent for it and waits until
// both replicas are ready.
func startLoraModel(ctx context.Context, t *testing.T, r *running, names ...string) *loraAgent {
	t.Helper()
	admin := llmgwv1.NewAdminServiceClient(r.conn)
	model := &llmgwv1.Model{Name: "lora", Engine: "sim", Model: "m", Replicas: 2, MaxLoadedAdapters: 1}
	for _, a := range names {
		model.Adapters = append(model.Adapters, &llmgwv1.Adapter{Name: a, Path: "/adapters/" + a})
	}
	if _, err := admin.ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: model}); err != nil {
		t.Fatal(err)
	}
	agent := startLoraAgent(ctx, t, r, "n1", 2)
	testkit.WaitCtx(ctx, t, "both replicas ready", func() error {
		reps := modelReplicas(r.srv, "lora")
		for _, rep := range reps {
			if !replicaReady(r.srv, rep) {
				return status.Errorf(codes.Unavailable, "%s not ready", rep.Id)
			}
		}
		if len(reps) != 2 {
			return status.Error(codes.Unavailable, "not placed")
		}
		return nil
	})
	return agent
}

// TestEnsureAdapter: concurrent EnsureAdapter calls for one cold adapter
// commit one placement and all return LOADED once the agent reports it; a
// second adapter takes the free slot; with every loaded adapter busy the
// answer is a retry-after; an idle one is evicted (removed from the
// placement first); a failed load answers FAILED with its reason; unknown
// names are NOT_FOUND (design §7.6).
func TestEnsureAdapter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	cfg := testConfig(t, t.TempDir(), freeAddr(t))
	cfg.AdapterMinIdle = 0
	cfg.AdapterRetryAfter = 750 * time.Millisecond
	r := start(t, cfg)
	defer r.stop(t)
	adapters := llmgwv1.NewAdapterServiceClient(r.conn)
	agent := startLoraModel(ctx, t, r, "sql", "legal", "chat", "broken")
	defer agent.stop()

	ensure := func(name string) (*llmgwv1.EnsureAdapterResponse, error) {
		return adapters.EnsureAdapter(ctx, &llmgwv1.EnsureAdapterRequest{Adapter: name, TimeoutMs: 10000})
	}

	// Eight concurrent calls for one cold adapter: one placement.
	var wg sync.WaitGroup
	resps := make([]*llmgwv1.EnsureAdapterResponse, 8)
	errs := make([]error, 8)
	for i := range resps {
		wg.Go(func() { resps[i], errs[i] = ensure("sql") })
	}
	wg.Wait()
	for i := range resps {
		if errs[i] != nil || resps[i].State != llmgwv1.AdapterState_ADAPTER_STATE_LOADED || len(resps[i].LoadedOn) != 1 {
			t.Fatalf("call %d: %v, %v", i, resps[i], errs[i])
		}
	}
	if n := adapterPuts(r.srv, "sql"); n != 1 {
		t.Fatalf("sql placed %d times, want once", n)
	}
	sqlOn := resps[0].LoadedOn[0]
	// Idempotent: asking again places nothing.
	if resp, err := ensure("sql"); err != nil || resp.State != llmgwv1.AdapterState_ADAPTER_STATE_LOADED || adapterPuts(r.srv, "sql") != 1 {
		t.Fatalf("again: %v, %v", resp, err)
	}

	// The free slot is the other replica.
	resp, err := ensure("legal")
	if err != nil || resp.State != llmgwv1.AdapterState_ADAPTER_STATE_LOADED || resp.LoadedOn[0] == sqlOn {
		t.Fatalf("legal: %v, %v (sql on %s)", resp, err, sqlOn)
	}
	legalOn := resp.LoadedOn[0]

	// Both loaded adapters busy: nothing is evicted, the caller retries.
	agent.setActive(t, "sql", 1)
	agent.setActive(t, "legal", 2)
	testkit.WaitCtx(ctx, t, "activity reported", func() error {
		for _, rep := range modelReplicas(r.srv, "lora") {
			for _, st := range r.srv.eph.AdaptersOf(rep) {
				if st.Active == 0 {
					return status.Error(codes.Unavailable, "not yet")
				}
			}
		}
		return nil
	})
	resp, err = ensure("chat")
	if err != nil || resp.State != llmgwv1.AdapterState_ADAPTER_STATE_UNSPECIFIED || resp.RetryAfterMs != 750 {
		t.Fatalf("all busy: %v, %v", resp, err)
	}
	if _, ok := r.srv.fsm.AdapterPlacement("chat"); ok {
		t.Fatal("chat placed while every slot is busy")
	}

	// legal goes idle: it is the one evicted, and chat takes its replica.
	agent.setActive(t, "legal", 0)
	testkit.WaitCtx(ctx, t, "legal idle", func() error {
		for _, st := range r.srv.eph.AdaptersOf(modelReplicas(r.srv, "lora")[legalOn]) {
			if st.Active != 0 {
				return status.Error(codes.Unavailable, "not yet")
			}
		}
		return nil
	})
	resp, err = ensure("chat")
	if err != nil || resp.State != llmgwv1.AdapterState_ADAPTER_STATE_LOADED || !slices.Equal(resp.LoadedOn, []string{legalOn}) {
		t.Fatalf("chat after legal idle: %v, %v", resp, err)
	}
	if p, ok := r.srv.fsm.AdapterPlacement("legal"); ok {
		t.Fatalf("evicted legal still placed: %v", p)
	}
	if p, _ := r.srv.fsm.AdapterPlacement("sql"); !slices.Equal(p.GetReplicas(), []string{sqlOn}) {
		t.Fatalf("busy sql moved: %v", p)
	}
	// Never more than max_loaded_adapters on a replica.
	for _, d := range []*llmgwv1.DesiredReplicas{r.srv.fsm.NodeDesired("n1")} {
		count := map[string]int{}
		for _, p := range d.Adapters {
			for _, id := range p.Replicas {
				count[id]++
			}
		}
		for id, n := range count {
			if n > 1 {
				t.Fatalf("replica %s holds %d adapters", id, n)
			}
		}
	}

	// A load that fails answers FAILED with the agent's reason, without
	// waiting for the timeout.
	agent.setActive(t, "chat", 0)
	agent.mu.Lock()
	agent.fail["broken"] = true
	agent.mu.Unlock()
	resp, err = ensure("broken")
	if err != nil || resp.State != llmgwv1.AdapterState_ADAPTER_STATE_FAILED || resp.Reason == "" {
		t.Fatalf("broken: %v, %v", resp, err)
	}
	if resp, err = ensure("broken"); err != nil || resp.State != llmgwv1.AdapterState_ADAPTER_STATE_FAILED || adapterPuts(r.srv, "broken") != 1 {
		t.Fatalf("broken again (must not be placed again): %v, %v", resp, err)
	}

	for name, code := range map[string]codes.Code{"nope": codes.NotFound, "": codes.InvalidArgument} {
		if _, err := ensure(name); status.Code(err) != code {
			t.Fatalf("EnsureAdapter(%q): %v, want %s", name, err, code)
		}
	}
}
