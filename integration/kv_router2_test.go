package integration

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Precise prefix routing's exactness under the faults TestKVRouterExactness
// does not reach (issue "Precise prefix routing", "Must show"; design §7.5):
// an agent restarted with its engines left running, the control nodes the
// agent and the routers are attached to killed, an agent that reports
// another node's replica, and a gap the engine's replay buffer cannot
// close. Every router's index must equal each simulator's /sim/blocks
// within kvQuiesceBound of the last request after each.

// kvModelYAML is a sim model with KV events: a cache of 64 blocks of 16
// tokens, so kvTraffic stores, shares and evicts, plus extra engine args.
func kvModelYAML(name string, replicas int, extra ...string) string {
	args := []string{"--sim-decode-ms-per-token", "0", "--sim-prefill-us-per-token", "0",
		"--num-gpu-blocks-override", "64", "--max-model-len", "1024"}
	args = append(args, extra...)
	return fmt.Sprintf("name: %s\nengine: sim\nmodel: org/%s\nreplicas: %d\ngpus_per_replica: 1\nkv_events: true\nextra_args: [\"%s\"]\n",
		name, name, replicas, strings.Join(args, `", "`))
}

// TestKVRouterExactnessFailover: a 3-server cluster, `llmgw agent` as its
// own process (engines outlive it), two routers watching through different
// servers, model kvm on 2 simulators dropping 1 % of their event batches.
// After each fault — the agent's kill -9 and restart (engines re-adopted,
// their listeners caught up by replay of what was published while no one
// listened), the kill -9 of a router's control node (not the agent's, when
// they differ), the kill -9 of the agent's control node, a foreign KV
// report — both routers' indexes equal
// the engines' block sets within 1 s of the last request. LLMGW_SOAK=1
// repeats the faults 10 times.
func TestKVRouterExactnessFailover(t *testing.T) {
	c := startCluster(t, 3)
	c.waitLeader(c.servers, formTimeout)
	c.waitPeers(c.servers, ids(c.servers), formTimeout)
	var addrs []string
	for _, s := range c.servers {
		addrs = append(addrs, s.grpc)
	}
	agent := startAgentProc(t, "n1", addrs)
	r1 := startRouterProc(t, "r1", c.servers[0].grpc, c.servers[1].grpc, c.servers[2].grpc)
	r2 := startRouterProc(t, "r2", c.servers[1].grpc, c.servers[2].grpc, c.servers[0].grpc)
	rs := []*controlServer{r1, r2}
	routers := []string{r1.ops, r2.ops} // the indexes are read on the operations ports
	file := filepath.Join(t.TempDir(), "kvm.yaml")
	writeFile(t, file, kvModelYAML("kvm", 2, "--sim-kv-drop-rate", "0.01"))
	if err := eventuallyErr(30*time.Second, func() error { _, err := ctlAt(c.servers[0].grpc, "model", "apply", "-f", file); return err }); err != nil {
		t.Fatalf("model apply: %v", err)
	}
	waitServing(t, c.servers[0].grpc, "kvm", 2, r1, r2)

	took := map[string][]time.Duration{}
	var steps []string
	round := 0
	check := func(step string) {
		t.Helper()
		if _, ok := took[step]; !ok {
			steps = append(steps, step)
		}
		took[step] = append(took[step], checkKVExactOf(t, liveReplicas(t, c, "kvm"), "kvm", routers, step))
	}
	traffic := func(n int) {
		t.Helper()
		round++
		for _, r := range rs {
			kvTraffic(t, r.http, "kvm", n, round)
		}
	}

	traffic(30)
	check("1% dropped")

	rounds := 1
	if soak() {
		rounds = 10
	}
	for range rounds {
		// The agent's kill -9. The engines keep serving and publishing
		// into the void meanwhile; the restarted agent re-adopts them,
		// binds their endpoints again, and asks each for a replay from
		// seq 0 before the live stream (agent/kv CatchUp).
		agent.kill()
		traffic(15)
		agent.start()
		waitAgentAdopted(t, agent, 2)
		check("agent restart")
		if n, _ := testkit.Scrape(agent.http, "llmgw_agent_kv_replays_total", testkit.Labels{"result": "repaired"}); n < 2 {
			t.Errorf("%v repaired replays after the restart, want a catch-up per engine (2)", n)
		}

		// A router's control node killed, the agent's elsewhere when the
		// placement allows: the router watches through another server and
		// gets a full copy of every node's KV state first.
		agentOn := attachedServer(t, c, agent)
		var s *controlServer
		for _, r := range rs {
			if w := serverByGRPC(c, lastOf(watchAddrs(r))); w != nil && w.running() && (s == nil || s == agentOn) {
				s = w
			}
		}
		if s == nil {
			t.Fatalf("the routers watch through no known server: %v, %v", watchAddrs(r1), watchAddrs(r2))
		}
		step := "router's control node killed"
		if s == agentOn {
			step = "router's and agent's control node killed"
		}
		killControl(t, c, s, agent, rs)
		traffic(15)
		check(step)
		restartControl(t, c, s)

		// The agent's control node killed: the agent attaches elsewhere
		// and sends a full copy; the routers get it over the plane.
		s = attachedServer(t, c, agent)
		killControl(t, c, s, agent, rs)
		traffic(15)
		check("agent's control node killed")
		restartControl(t, c, s)
	}

	// A report for a replica that runs on another node is refused: a
	// client speaking the agent protocol as node "n9" claims kvm's first
	// replica holds three blocks it never stored.
	srv := attachedServer(t, c, agent)
	victim := liveReplicas(t, c, "kvm")[0]
	before, _ := testkit.Scrape(srv.http, "llmgw_control_kv_foreign_total", nil)
	foreignKVReport(t, srv.grpc, "n9", victim)
	if !eventually(10*time.Second, func() bool {
		n, _ := testkit.Scrape(srv.http, "llmgw_control_kv_foreign_total", nil)
		return n >= before+1
	}) {
		t.Fatalf("%s did not count the foreign report in llmgw_control_kv_foreign_total within %v", srv.id, within(10*time.Second))
	}
	check("foreign report refused")

	var lines []string
	for _, step := range steps {
		lines = append(lines, fmt.Sprintf("%s: %s", step, summary(took[step])))
	}
	t.Logf("time from the last request to equal indexes: %s", strings.Join(lines, "; "))
}

// TestKVRouterUntrusted: with 20 % of event batches dropped and a replay
// buffer of one batch (--sim-kv-buffer-steps 1, since the agent writes
// --kv-events-config itself; and kv_events_buffer_steps 1, so the agent
// knows: told 10,000, it took a one-batch replay after a publisher's
// handshake for the engine's whole history and trusted the replica again
// before the second router saw it untrusted), a gap cannot be closed: the agent marks the
// replica untrusted (llmgw_agent_kv_untrusted_replicas), the router's
// index says so (/debug/kvindex), and requests for it fall back to tier 1,
// counted as llmgw_kv_decisions_total{decision="untrusted"}. A cache reset
// on the engine makes it trusted and exact again.
func TestKVRouterUntrusted(t *testing.T) {
	agentHTTP := freeAddr(t)
	d := startDev(t, "--port-range", freePortRange(t, 20), "--agent-http-addr", agentHTTP)
	file := filepath.Join(t.TempDir(), "kvu.yaml")
	writeFile(t, file, kvModelYAML("kvu", 1, "--sim-kv-drop-rate", "0.2", "--sim-kv-buffer-steps", "1")+"kv_events_buffer_steps: 1\n")
	if out, err := d.ctl("model", "apply", "-f", file); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	rep := d.waitReady("kvu", 1, 60*time.Second)[0]
	// The requests counted below go through a second router whose
	// /tokenize budget is generous: with the default 20 ms, a loaded
	// machine's request falls back as tokenize_timeout before the index is
	// asked, and is not counted untrusted.
	r2 := startRouterWith(t, "r2", []string{d.grpc}, "--tokenize-budget", within(2*time.Second).String())
	waitRouterServes(t, r2.http, "kvu")

	// Enough batches that a drop is certain (0.8^40 ≈ 1e-4 per round).
	var view kvIndexView
	for round := 0; ; round++ {
		kvTraffic(t, d.http, "kvu", 40, round)
		if eventually(3*time.Second, func() bool {
			n, _ := testkit.Scrape(agentHTTP, "llmgw_agent_kv_untrusted_replicas", nil)
			return n == 1 && getJSON("http://"+d.ops+"/debug/kvindex?replica="+rep.Replica.ID, &view) == nil && view.Untrusted
		}) {
			break
		}
		if round == 3 {
			n, _ := testkit.Scrape(agentHTTP, "llmgw_agent_kv_untrusted_replicas", nil)
			t.Fatalf("replica %s not untrusted after %d rounds: agent gauge %v, router says untrusted=%v", rep.Replica.ID, round+1, n, view.Untrusted)
		}
	}
	unrepairable, _ := testkit.Scrape(agentHTTP, "llmgw_agent_kv_replays_total", testkit.Labels{"result": "unrepairable"})
	if unrepairable < 1 {
		t.Errorf("replica untrusted, yet no replay counted unrepairable (%v)", unrepairable)
	}
	if !eventually(10*time.Second, func() bool {
		return getJSON("http://"+r2.ops+"/debug/kvindex?replica="+rep.Replica.ID, &view) == nil && view.Untrusted
	}) {
		t.Fatalf("the second router does not call %s untrusted within %v", rep.Replica.ID, within(10*time.Second))
	}

	before := kvDecisions(r2.ops)
	const n = 12
	kvTraffic(t, r2.http, "kvu", n, 99)
	after := kvDecisions(r2.ops)
	if got := after["untrusted"] - before["untrusted"]; got != n {
		t.Errorf("llmgw_kv_decisions_total{decision=\"untrusted\"} rose by %v over %d requests for the untrusted replica, want %d (all decisions before %v, after %v)", got, n, n, before, after)
	}

	// Trust comes back only with a known set: the engine's cache cleared
	// (AllBlocksCleared), with the drops off so that batch arrives.
	for _, path := range []string{"/sim/faults", "/reset_prefix_cache"} {
		resp, err := chatClient.Post("http://"+rep.Status.Address+path, "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST %s: %d", path, resp.StatusCode)
		}
	}
	checkKVExact(t, d, "kvu", []string{d.ops}, "trusted again after a cache reset")
	if n, _ := testkit.Scrape(agentHTTP, "llmgw_agent_kv_untrusted_replicas", nil); n != 0 {
		t.Errorf("agent still counts %v untrusted replicas after the reset", n)
	}

	hits, _ := testkit.Scrape(d.ops, "llmgw_kv_decisions_total", testkit.Labels{"decision": "hit"})
	timeouts, _ := testkit.Scrape(d.ops, "llmgw_router_tokenize_total", testkit.Labels{"result": "timeout"})
	t.Logf("replica %s untrusted (%v unrepairable replays); then %v of %d requests counted untrusted; %v tier-2 hits before the gap; the dev router (default /tokenize budget): decisions %v, %v tokenizations over budget",
		rep.Replica.ID, unrepairable, after["untrusted"]-before["untrusted"], n, hits, kvDecisions(d.ops), timeouts)
}

var kvDecisionRE = regexp.MustCompile(`^llmgw_kv_decisions_total\{.*?decision="([^"]+)".*\} (\S+)$`)

// kvDecisions is a router's llmgw_kv_decisions_total by decision (summed
// over any other labels), read on its operations port addr; empty if it
// could not be read.
func kvDecisions(addr string) map[string]float64 {
	out := map[string]float64{}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if m := kvDecisionRE.FindStringSubmatch(sc.Text()); m != nil {
			if v, err := strconv.ParseFloat(m[2], 64); err == nil {
				out[m[1]] += v
			}
		}
	}
	return out
}

// waitAgentAdopted waits until a restarted agent has re-adopted n
// running engines and attached to the control plane.
func waitAgentAdopted(t *testing.T, agent *controlServer, n float64) {
	t.Helper()
	if !eventually(30*time.Second, func() bool {
		got, ok := testkit.Scrape(agent.http, "llmgw_agent_engine_adoptions_total", nil)
		a, _ := testkit.Scrape(agent.http, "llmgw_agent_session_attached", nil)
		return ok && got == n && a == 1
	}) {
		t.Fatalf("agent did not re-adopt %v engines and attach within %v; its log:\n%s", n, within(30*time.Second), tail(agent.output(), 30))
	}
}

// liveReplicas is the model's replicas as any running server lists them.
func liveReplicas(t *testing.T, c *cluster, model string) []replicaView {
	t.Helper()
	var out []replicaView
	err := eventuallyErr(20*time.Second, func() error {
		var last error
		for _, s := range c.live() {
			list, err := clusterReplicas(s.grpc)
			if err != nil {
				last = err
				continue
			}
			out = out[:0]
			for _, r := range list {
				if r.Replica.Model == model {
					out = append(out, r)
				}
			}
			return nil
		}
		if last == nil {
			last = errRetry
		}
		return last
	})
	if err != nil {
		t.Fatalf("replica list: %v", err)
	}
	return out
}

// attachedServer is the running server the agent's session is on now.
func attachedServer(t *testing.T, c *cluster, agent *controlServer) *controlServer {
	t.Helper()
	var s *controlServer
	if !eventually(20*time.Second, func() bool {
		s = serverByGRPC(c, attachedTo(agent))
		a, _ := testkit.Scrape(agent.http, "llmgw_agent_session_attached", nil)
		return s != nil && s.running() && a == 1
	}) {
		t.Fatalf("agent is not attached to a live server within %v; its log:\n%s", within(20*time.Second), tail(agent.output(), 20))
	}
	return s
}

// killControl kills s with -9 and waits until the agent and every router
// that was using s have moved: the agent's next welcome, and a watch
// stream opened after the kill.
func killControl(t *testing.T, c *cluster, s *controlServer, agent *controlServer, routers []*controlServer) {
	t.Helper()
	sessions, _ := testkit.Scrape(agent.http, "llmgw_agent_sessions_total", nil)
	agentOn := attachedTo(agent) == s.grpc
	var moving []*controlServer
	for _, r := range routers {
		if lastOf(watchAddrs(r)) == s.grpc {
			moving = append(moving, r)
		}
	}
	killed := time.Now()
	s.kill()
	if !eventually(30*time.Second, func() bool {
		if n, _ := testkit.Scrape(agent.http, "llmgw_agent_sessions_total", nil); agentOn && n <= sessions {
			return false
		}
		for _, r := range moving {
			if !lastWatchOpen(r).After(killed) {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("after killing %s: agent (attached there: %v) or routers %v did not move within %v", s.id, agentOn, ids(moving), within(30*time.Second))
	}
	t.Logf("killed %s (agent there: %v, routers there: %v); they moved in %v", s.id, agentOn, ids(moving), time.Since(killed).Round(time.Millisecond))
}

// restartControl starts a killed server again and waits for the full
// cluster, so the next fault starts from three voters.
func restartControl(t *testing.T, c *cluster, s *controlServer) {
	t.Helper()
	s.start()
	c.waitLeader(c.servers, formTimeout)
	c.waitPeers(c.servers, ids(c.servers), formTimeout)
}

func lastOf(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[len(s)-1]
}

// foreignKVReport attaches to addr as node (with no GPUs, so nothing is
// placed on it) and reports KV blocks for victim, which runs elsewhere;
// the session ends when the report has been sent.
func foreignKVReport(t *testing.T, addr, node string, victim replicaView) {
	t.Helper()
	uid, err := strconv.ParseUint(string(victim.Replica.UID), 10, 64)
	if err != nil {
		t.Fatalf("replica uid %q: %v", victim.Replica.UID, err)
	}
	inc, err := strconv.ParseUint(string(victim.Status.Incarnation), 10, 64)
	if err != nil {
		t.Fatalf("replica incarnation %q: %v", victim.Status.Incarnation, err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), within(20*time.Second))
	defer cancel()
	stream, err := llmgwv1.NewAgentServiceClient(conn).Attach(ctx)
	if err != nil {
		t.Fatal(err)
	}
	epoch := uint64(time.Now().UnixNano())
	if err := stream.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Hello{Hello: &llmgwv1.AgentHello{
		Node: &llmgwv1.Node{Id: node, Address: "127.0.0.1"}, Epoch: epoch}}}); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := stream.Recv()
		if err != nil {
			t.Fatalf("attach as %s: %v", node, err)
		}
		if m.GetWelcome() != nil {
			break
		}
	}
	if err := stream.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Update{Update: &llmgwv1.EphemeralUpdate{
		Node: node, Epoch: epoch, Seq: 1, Full: true,
		Kv: []*llmgwv1.KVBlocks{{ReplicaId: victim.Replica.ID, Uid: uid, Incarnation: inc, Reset_: true,
			Stored: []uint64{1, 2, 3}, BlockSize: 16}},
	}}}); err != nil {
		t.Fatal(err)
	}
	// A heartbeat after the update: the server reads in order, so once it
	// is sent the update has left this process.
	if err := stream.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Heartbeat{Heartbeat: &llmgwv1.Heartbeat{UnixNano: time.Now().UnixNano()}}}); err != nil {
		t.Fatal(err)
	}
	// Closing our side ends the session once the server has read it all.
	_ = stream.CloseSend()
	for {
		if _, err := stream.Recv(); err != nil {
			return
		}
	}
}
