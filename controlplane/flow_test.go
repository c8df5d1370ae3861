//go:build !llmgw_upgrade_old

package controlplane

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestFlowService (design §7.8): routers' flow-control reports sent to
// different followers reach the one table, the leader's, so each router's
// answer holds the other's queues; FlowStatus asked of a follower is the
// leader's; the followers hold nothing. A new leader starts with an empty
// table and fills again as the routers report.
func TestFlowService(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c := newHACluster(t, 3, "c1", "c2", "c3")
	leader := c.agreedLeader(ctx, 3)
	var followers []string
	for id := range c.nodes {
		if id != leader {
			followers = append(followers, id)
		}
	}
	flowVia := func(id string) llmgwv1.FlowServiceClient { return llmgwv1.NewFlowServiceClient(c.nodes[id].conn) }
	queue := func(class string, rank uint32, queued uint64) *llmgwv1.FlowDepth {
		return &llmgwv1.FlowDepth{Model: "demo", Class: class, Rank: rank, Queued: queued, QueuedBytes: 100 * queued, OldestWaitMs: 40}
	}

	v, err := flowVia(followers[0]).Report(ctx, &llmgwv1.FlowReport{Router: "r1", Session: 1, Depths: []*llmgwv1.FlowDepth{queue("interactive", 0, 3)}})
	if err != nil {
		t.Fatalf("r1's report through follower %s: %v", followers[0], err)
	}
	if len(v.Depths) != 0 || v.ValidMs != 3000 {
		t.Fatalf("r1's view %v: want no other router's queue, valid 3 s", v)
	}
	v, err = flowVia(followers[1]).Report(ctx, &llmgwv1.FlowReport{Router: "r2", Session: 2, Depths: []*llmgwv1.FlowDepth{queue("batch", 1, 5)}})
	if err != nil {
		t.Fatalf("r2's report through follower %s: %v", followers[1], err)
	}
	if len(v.Depths) != 1 || v.Depths[0].Class != "interactive" || v.Depths[0].Queued != 3 || v.Depths[0].Routers != 1 {
		t.Fatalf("r2's view %v: want r1's interactive queue, which reached the leader through another follower", v)
	}

	st, err := c.admin(followers[0]).FlowStatus(ctx, &llmgwv1.FlowStatusRequest{})
	if err != nil {
		t.Fatalf("FlowStatus through follower %s: %v", followers[0], err)
	}
	if len(st.Routers) != 2 || st.Routers[0].Router != "r1" || st.Routers[1].Router != "r2" || len(st.Total) != 2 {
		t.Fatalf("FlowStatus %v: want r1 and r2 and their two queues", st)
	}
	for _, f := range followers {
		if n := c.nodes[f].srv.flows.Live(); n != 0 {
			t.Fatalf("follower %s holds %d routers' reports", f, n)
		}
	}
	if got := testkit.Metric(t, c.nodes[leader].srv.reg, "llmgw_control_flow_routers", nil); got != 2 {
		t.Fatalf("the leader's llmgw_control_flow_routers %v, want 2", got)
	}

	// A new leader: an empty table, then r1's next report.
	to := followers[0]
	if _, err := c.admin(leader).TransferLeadership(ctx, &llmgwv1.TransferLeadershipRequest{To: to}); err != nil {
		t.Fatalf("transfer leadership to %s: %v", to, err)
	}
	testkit.WaitCtx(ctx, t, to+" leads and answers FlowStatus with no report", func() error {
		if !c.nodes[to].srv.store.IsLeader() {
			return fmt.Errorf("%s does not lead yet", to)
		}
		st, err := c.admin(leader).FlowStatus(ctx, &llmgwv1.FlowStatusRequest{})
		if err != nil {
			return err
		}
		if len(st.Routers) != 0 {
			return fmt.Errorf("the new leader's status %v", st)
		}
		return nil
	})
	v, err = flowVia(leader).Report(ctx, &llmgwv1.FlowReport{Router: "r2", Session: 2, Depths: []*llmgwv1.FlowDepth{queue("batch", 1, 5)}})
	if err != nil || len(v.Depths) != 0 {
		t.Fatalf("r2's report to the new leader %s through the old one: %v, %v; want no other router's queue yet", to, v, err)
	}
	st, err = c.admin(to).FlowStatus(ctx, &llmgwv1.FlowStatusRequest{})
	if err != nil || len(st.Routers) != 1 || st.Routers[0].Router != "r2" {
		t.Fatalf("the new leader's status %v, %v: want r2's report", st, err)
	}
}
