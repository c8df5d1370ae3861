package integration

import (
	"os"
	"slices"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
)

// Failover with real processes (issue "Failover", design §5.3-§5.6, §6): no
// control-node failure or agent restart costs a client request. Each test
// has a short variant; LLMGW_SOAK=1 (make soak) runs the long ones.

func soak() bool { return os.Getenv("LLMGW_SOAK") != "" }

// failoverSetup is a 3-server cluster, an agent running model "chat" with
// 2 sim replicas, and two routers watching through different servers.
type failoverSetup struct {
	c       *cluster
	agent   *controlServer
	routers []*controlServer
}

func startFailoverSetup(t *testing.T) *failoverSetup {
	t.Helper()
	c := startCluster(t, 3)
	c.waitLeader(c.servers, formTimeout)
	c.waitPeers(c.servers, ids(c.servers), formTimeout)
	var addrs []string
	for _, s := range c.servers {
		addrs = append(addrs, s.grpc)
	}
	f := &failoverSetup{c: c, agent: startAgentProc(t, "n1", addrs)}
	f.routers = []*controlServer{
		startRouterProc(t, "r1", c.servers[0].grpc, c.servers[1].grpc, c.servers[2].grpc),
		startRouterProc(t, "r2", c.servers[1].grpc, c.servers[2].grpc, c.servers[0].grpc),
	}
	applyModel(t, c.servers[0].grpc, "chat", 2)
	waitServing(t, c.servers[0].grpc, "chat", 2, f.routers...)
	return f
}

// agentServer is the server the agent is attached to now.
func (f *failoverSetup) agentServer(t *testing.T) *controlServer {
	t.Helper()
	var s *controlServer
	if !eventually(20*time.Second, func() bool {
		s = serverByGRPC(f.c, attachedTo(f.agent))
		ok, _ := testkit.Scrape(f.agent.http, "llmgw_agent_session_attached", nil)
		return s != nil && s.running() && ok == 1
	}) {
		t.Fatalf("agent is not attached to a live server within %v; its log:\n%s", within(20*time.Second), tail(f.agent.output(), 20))
	}
	return s
}

// killAndTime kills s with -9 and returns the time until the agent's next
// welcome (llmgw_agent_sessions_total counts up), polled every 10 ms.
func (f *failoverSetup) killAndTime(t *testing.T, s *controlServer) time.Duration {
	t.Helper()
	before, _ := testkit.Scrape(f.agent.http, "llmgw_agent_sessions_total", nil)
	killed := time.Now()
	s.kill()
	var took time.Duration
	limit := within(30 * time.Second)
	for {
		if n, ok := testkit.Scrape(f.agent.http, "llmgw_agent_sessions_total", nil); ok && n > before {
			took = time.Since(killed)
			break
		}
		if time.Since(killed) > limit {
			t.Fatalf("agent did not reattach within %v of killing %s; its log:\n%s", limit, s.id, tail(f.agent.output(), 20))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if s2 := f.agentServer(t); s2 == s {
		t.Errorf("agent reattached to the killed server %s", s.id)
	}
	return took
}

// TestFailoverLeaderKill: kill -9 the leader, which the agent is attached
// to, while two routers carry a steady chat load: no client request fails
// and the agent reattaches elsewhere. The reattach time is reported (plan
// target ≤ 3 s); LLMGW_SOAK=1 repeats it 20 times.
func TestFailoverLeaderKill(t *testing.T) {
	f := startFailoverSetup(t)
	kills := 1
	if soak() {
		kills = 20
	}
	var times []time.Duration
	l := startLoad("chat", 2, f.routers...)
	for i := 0; i < kills; i++ {
		target := f.agentServer(t)
		// Make the agent's server the leader, so one kill takes both.
		if err := eventuallyErr(20*time.Second, func() error {
			if ld := f.c.waitLeader(f.c.live(), formTimeout); ld == target {
				return nil
			}
			_, err := target.ctl("raft", "transfer-leadership", "--to", target.id)
			if err == nil {
				err = errRetry
			}
			return err
		}); err != nil {
			t.Fatalf("making %s the leader: %v", target.id, err)
		}
		times = append(times, f.killAndTime(t, target))
		l.carry(t, 500*time.Millisecond, 20, "the new leader's term") // traffic through it
		target.start()
		f.c.waitLeader(f.c.servers, formTimeout)
		f.c.waitPeers(f.c.servers, ids(f.c.servers), formTimeout)
	}
	l.checkNoFailures(t, 50)
	t.Logf("reattach after leader kill -9 (kill to welcome): %s", summary(times))
	if slices.Max(times) > 3*time.Second {
		t.Logf("reattach above the 3 s target: %v", times)
	}
}

// TestFailoverFollowerKill: kill -9 a follower that has the agent and a
// router attached: no client request fails.
func TestFailoverFollowerKill(t *testing.T) {
	f := startFailoverSetup(t)
	target := f.agentServer(t)
	if ld := f.c.waitLeader(f.c.servers, formTimeout); ld == target {
		other := without(f.c.servers, target)[0]
		if _, err := target.ctl("raft", "transfer-leadership", "--to", other.id); err != nil {
			t.Fatal(err)
		}
		if ld := f.c.waitLeader(f.c.servers, formTimeout); ld == target {
			t.Fatalf("%s still leads after transfer", target.id)
		}
	}
	// A router that watches through the follower first.
	r3 := startRouterProc(t, "r3", target.grpc, without(f.c.servers, target)[0].grpc)
	waitServing(t, f.c.servers[0].grpc, "chat", 2, r3)
	l := startLoad("chat", 2, append(f.routers, r3)...)
	l.carry(t, time.Second, 20, "before the kill")
	took := f.killAndTime(t, target)
	l.carry(t, 2*time.Second, 40, "after the kill")
	l.checkNoFailures(t, 50)
	t.Logf("reattach after follower kill -9: %v", took)
}

// TestFailoverAgentRestartReadopts: kill -9 the agent process under load
// and start it again: the same engine pids are re-adopted, the replicas
// stay READY under the same uids, and no client request fails (design §6).
func TestFailoverAgentRestartReadopts(t *testing.T) {
	f := startFailoverSetup(t)
	before := waitServing(t, f.c.servers[0].grpc, "chat", 2)
	pids := recordedEngines(f.agent)
	if len(pids) != 2 {
		t.Fatalf("agent records engines %v, want 2", pids)
	}
	l := startLoad("chat", 2, f.routers...)
	l.carry(t, time.Second, 20, "before the agent's kill")
	f.agent.kill()
	l.carry(t, time.Second, 20, "with no agent running") // serving with no agent at all
	f.agent.start()
	if !eventually(30*time.Second, func() bool {
		n, ok := testkit.Scrape(f.agent.http, "llmgw_agent_engine_adoptions_total", nil)
		return ok && n == 2
	}) {
		t.Fatalf("agent did not re-adopt 2 engines within %v; its log:\n%s", within(30*time.Second), tail(f.agent.output(), 30))
	}
	after := waitServing(t, f.c.servers[0].grpc, "chat", 2)
	l.carry(t, 2*time.Second, 40, "after the agent's restart")
	l.checkNoFailures(t, 50)
	if got := recordedEngines(f.agent); !slices.Equal(got, pids) {
		t.Errorf("engine pids %v after the restart, want the same %v", got, pids)
	}
	for i := range before {
		if before[i].Replica.UID != after[i].Replica.UID || before[i].Status.PID != after[i].Status.PID ||
			before[i].Status.Incarnation != after[i].Status.Incarnation {
			t.Errorf("replica %s: uid/pid/incarnation %s/%d/%s before, %s/%d/%s after", before[i].Replica.ID,
				before[i].Replica.UID, before[i].Status.PID, before[i].Status.Incarnation,
				after[i].Replica.UID, after[i].Status.PID, after[i].Status.Incarnation)
		}
	}
}
