package controlplane

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestEnsureAdapterQueue: with every slot busy, calls that ask to queue
// wait on the leader instead of answering busy; the slot an idle adapter
// frees goes to the call whose requests have waited longest, whatever the
// order the calls came in; a call without the queue is answered busy while
// others wait; a queued call whose wait ends says no slot freed (design
// §7.6).
func TestEnsureAdapterQueue(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	cfg := testConfig(t, t.TempDir(), freeAddr(t))
	cfg.AdapterMinIdle = 0
	cfg.AdapterRetryAfter = 750 * time.Millisecond
	r := start(t, cfg)
	defer r.stop(t)
	adapters := llmgwv1.NewAdapterServiceClient(r.conn)
	agent := startLoraModel(ctx, t, r, "hot", "warm", "young", "old", "late")
	defer agent.stop()
	ensure := func(req *llmgwv1.EnsureAdapterRequest) (*llmgwv1.EnsureAdapterResponse, error) {
		if req.TimeoutMs == 0 {
			req.TimeoutMs = 20000
		}
		return adapters.EnsureAdapter(ctx, req)
	}
	// Fill both slots and keep them busy.
	on := map[string]string{}
	for _, a := range []string{"hot", "warm"} {
		resp, err := ensure(&llmgwv1.EnsureAdapterRequest{Adapter: a})
		if err != nil || resp.State != llmgwv1.AdapterState_ADAPTER_STATE_LOADED {
			t.Fatalf("%s: %v, %v", a, resp, err)
		}
		on[a] = resp.LoadedOn[0]
		agent.setActive(t, a, 1)
	}
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

	// young's call comes first, old's second; old's requests have waited
	// longer (their router says so).
	now := time.Now()
	type answer struct {
		resp *llmgwv1.EnsureAdapterResponse
		err  error
	}
	queued := func(adapter string, since time.Time) chan answer {
		ch := make(chan answer, 1)
		go func() {
			resp, err := ensure(&llmgwv1.EnsureAdapterRequest{Adapter: adapter, Queue: true, Waiting: 3, WaitingSinceUnixNano: since.UnixNano()})
			ch <- answer{resp, err}
		}()
		return ch
	}
	young := queued("young", now.Add(-time.Second))
	testkit.WaitMetric(t, r.srv.reg, "llmgw_control_adapter_queued_calls", nil, 1)
	old := queued("old", now.Add(-5*time.Second))
	testkit.WaitMetric(t, r.srv.reg, "llmgw_control_adapter_queued_calls", nil, 2)

	// A caller that does not queue is answered busy at once, behind them.
	resp, err := ensure(&llmgwv1.EnsureAdapterRequest{Adapter: "late"})
	if err != nil || resp.State != llmgwv1.AdapterState_ADAPTER_STATE_UNSPECIFIED || resp.RetryAfterMs != 750 {
		t.Fatalf("late, not queuing: %v, %v; want busy", resp, err)
	}

	// warm goes idle: its slot goes to old, the longest waiting (busy
	// once loaded, so young does not take it next).
	agent.setActive(t, "old", 1)
	agent.setActive(t, "warm", 0)
	a := <-old
	if a.err != nil || a.resp.State != llmgwv1.AdapterState_ADAPTER_STATE_LOADED || !slices.Equal(a.resp.LoadedOn, []string{on["warm"]}) || !a.resp.Queued {
		t.Fatalf("old: %v, %v; want LOADED on %s, queued", a.resp, a.err, on["warm"])
	}
	if _, ok := r.srv.fsm.AdapterPlacement("young"); ok {
		t.Fatal("young placed before old, which waited longer")
	}
	if p, _ := r.srv.fsm.AdapterPlacement("hot"); !slices.Equal(p.GetReplicas(), []string{on["hot"]}) {
		t.Fatalf("busy hot moved: %v", p)
	}

	// A queued call whose wait ends unplaced says so.
	resp, err = ensure(&llmgwv1.EnsureAdapterRequest{Adapter: "late", Queue: true, TimeoutMs: 300})
	if err != nil || resp.State != llmgwv1.AdapterState_ADAPTER_STATE_LOADING || !resp.Queued || !strings.Contains(resp.Reason, "no slot") {
		t.Fatalf("late, queued, 300 ms: %v, %v; want LOADING, queued, no slot", resp, err)
	}

	// hot goes idle: young is next.
	agent.setActive(t, "hot", 0)
	a = <-young
	if a.err != nil || a.resp.State != llmgwv1.AdapterState_ADAPTER_STATE_LOADED || !slices.Equal(a.resp.LoadedOn, []string{on["hot"]}) {
		t.Fatalf("young: %v, %v; want LOADED on %s", a.resp, a.err, on["hot"])
	}
	testkit.WaitMetric(t, r.srv.reg, "llmgw_control_adapter_queued_calls", nil, 0)
}
