package integration

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
)

// The spread test of issue 13 (design §5.5, docs/architecture.md "The
// spread rule"): a model whose replicas all landed on the first agent to
// attach gets one of them moved to an agent that attaches later, by the
// rolling move (a replacement ready before the old one drains), under a
// chat load that loses no request.

// TestSpreadLateAgent: one control server; agent a attaches alone and a
// 2-replica sim model is applied, so both replicas land on a (2 GPUs);
// then agent b attaches. Within a deadline the model has one serving
// replica on a and one on b and nothing else, never fewer than 2 served
// during the move, one replacement started, one placement drained (by its
// agent once idle, not by the drain timeout), and no client request
// through the router failed. The times taken are logged.
func TestSpreadLateAgent(t *testing.T) {
	s := newServer(t, "c1", serverOpts{extra: []string{"--bootstrap"}})
	s.start()
	c := &cluster{t: t, servers: []*controlServer{s}}
	c.waitLeader(c.servers, formTimeout)
	a := startAgentProc(t, "a", []string{s.grpc})
	r := startRouterProc(t, "r1", s.grpc)
	applyModel(t, s.grpc, "chat", 2)
	for _, v := range waitServing(t, s.grpc, "chat", 2, r) {
		if v.Replica.Node != "a" {
			t.Fatalf("replica %s on %s before b attached, want a", v.Replica.ID, v.Replica.Node)
		}
	}

	l := startLoad("chat", 2, r)
	smp := sampleRoll(s.grpc, "chat")
	defer smp.stop()
	l.carry(t, time.Second, 20, "before b attaches")
	smp.reset()
	attachStart := time.Now()
	b := startAgentProc(t, "b", []string{s.grpc})
	if !eventually(30*time.Second, func() bool { return nodeActive(s.grpc, "b") }) {
		t.Fatalf("b not registered active within %v", within(30*time.Second))
	}
	registered := time.Since(attachStart)

	var last []rollView
	spread := func() bool {
		list, err := rollReplicas(s.grpc, "chat")
		if err != nil {
			return false
		}
		last = list
		var nodes []string
		for _, v := range list {
			if !v.serving() {
				return false
			}
			nodes = append(nodes, v.Node)
		}
		slices.Sort(nodes)
		return slices.Equal(nodes, []string{"a", "b"})
	}
	if !eventually(60*time.Second, spread) {
		t.Fatalf("chat not spread over a and b within %v of b's registration: %+v", within(60*time.Second), last)
	}
	took := time.Since(attachStart)
	smp.settle(t)
	samples, minServing, maxDraining, maxStarting := smp.phase()
	drains := smp.drains(attachStart)
	l.carry(t, time.Second, 20, "after the spread")
	served := l.ok.Load()
	l.checkNoFailures(t, 50)

	t.Logf("spread: b registered %s after its start; replicas on a and b %s after it (%d samples, min serving %d, max draining %d, max starting %d); drain mark → removed: %s; %d requests served",
		registered.Round(10*time.Millisecond), (took - registered).Round(10*time.Millisecond), samples, minServing, maxDraining, maxStarting, strings.Join(drains, ", "), served)
	if minServing < 2 || maxStarting > 1 || len(drains) != 1 {
		t.Errorf("spread: min serving %d (want 2), replacements starting at once %d (want at most 1), %d placements drained before removal (want 1)",
			minServing, maxStarting, len(drains))
	}
	if d, _ := testkit.Scrape(a.http, "llmgw_agent_drains_total", nil); d != 1 {
		t.Errorf("agent a stopped %v draining engines, want 1", d)
	}
	if strings.Contains(a.output(), "still busy at the drain timeout") {
		t.Errorf("a stopped its draining engine at the timeout rather than idle")
	}
	if !strings.Contains(s.output(), "spreading replicas") {
		t.Errorf("the leader did not log the spread move")
	}
	if n := len(recordedEngines(b)); n != 1 {
		t.Errorf("agent b records %d engines, want 1", n)
	}
}

// nodeActive: `llmgwctl node list` lists the node as active.
func nodeActive(addr, id string) bool {
	out, err := ctlAt(addr, "node", "list", "-o", "json")
	if err != nil {
		return false
	}
	var v []struct {
		ID    string `json:"id"`
		State string `json:"state"`
	}
	if json.Unmarshal([]byte(out), &v) != nil {
		return false
	}
	for _, n := range v {
		if n.ID == id {
			return n.State == "active"
		}
	}
	return false
}
