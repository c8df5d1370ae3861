package integration

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
)

// Precise prefix routing's exactness per tier (issue 32, "Must show": the
// index equals the engine's cache per tier after kill -9, agent restart and
// replay; design §7.5 "Offload tiers", §8 "KV offload"). The simulators
// have a CPU tier (--kv-offloading-size) beside a GPU cache of 64 blocks,
// so the traffic evicts GPU blocks that stay in the CPU tier and, the tier
// being small too, evicts CPU blocks; every router's index must equal each
// simulator's /sim/blocks in the GPU set, the CPU set and the (empty)
// storage set after each fault, with checkKVExactOf's bound.

// kvTierCPUBlocks is the CPU tier's size in blocks: larger than the GPU
// cache (64), so blocks the GPU evicted stay offloaded, and smaller than
// what the traffic stores on a replica, so the tier evicts too.
const kvTierCPUBlocks = 96

// kvTierArgs are the simulator flags of an engine with a CPU tier of
// kvTierCPUBlocks blocks. The tier's size is in GiB and a block's bytes
// come from the model's shape, which needs --sim-gpu (GPU timing): Qwen2.5-
// 0.5B's block of 16 tokens is 2 (K, V) × 24 layers × 2 KV heads × 64 × 2 B
// × 16 = 192 KiB. --sim-load-scale 0 starts an engine at once.
func kvTierArgs() []string {
	const blockBytes = 2 * 24 * 2 * 64 * 2 * 16
	return []string{"--sim-gpu", "h100-sxm", "--sim-model-shape", "qwen2.5-0.5b", "--sim-load-scale", "0",
		"--kv-offloading-size", fmt.Sprint(float64(kvTierCPUBlocks*blockBytes) / (1 << 30))}
}

// TestKVRouterExactnessTiers: a 1-server control plane, `llmgw agent` as
// its own process (engines outlive it), two routers, model kvt on 2
// simulators with a CPU tier dropping 1 % of their event batches (repaired
// by the agent's replay). After the traffic, and after each fault — an
// engine's kill -9 (the agent restarts it: every tier starts empty), the
// agent's kill -9 and restart (engines re-adopted, their tiers rebuilt from
// a replay from seq 0), the control server's kill -9 and restart (the
// agent re-sends its mirror's tiers in a full copy, the routers re-sync
// from it), a router's kill -9 and restart (its index comes back from the
// control plane's full copy) — both routers' indexes equal each engine's
// GPU and CPU sets exactly. In both event encodings and both hash forms
// (the CPU tier's BlockStored carries no tokens and no parent, so its
// hashes are decoded and mapped apart from the GPU's). LLMGW_SOAK=1
// repeats the faults 5 times.
func TestKVRouterExactnessTiers(t *testing.T) {
	tests := []struct{ name, encoding, intHashes string }{
		{"map-ints", "map", "1"},
		{"array-bytes", "array", "0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// The agent hands its environment to the engines it starts.
			t.Setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", tc.intHashes)
			kvTiersExact(t, tc.encoding)
		})
	}
}

// kvTiersExact is TestKVRouterExactnessTiers with engines publishing in
// encoding (map or array).
func kvTiersExact(t *testing.T, encoding string) {
	c1 := newServer(t, "c1", serverOpts{expect: 1})
	c1.start()
	c := &cluster{t: t, servers: []*controlServer{c1}}
	c.waitLeader(c.servers, formTimeout)
	agent := startAgentProc(t, "n1", []string{c1.grpc})
	r1 := startRouterProc(t, "r1", c1.grpc)
	r2 := startRouterProc(t, "r2", c1.grpc)
	routers := []string{r1.ops, r2.ops} // the indexes are read on the operations ports
	file := filepath.Join(t.TempDir(), "kvt.yaml")
	writeFile(t, file, kvModelYAML("kvt", 2, append(kvTierArgs(), "--sim-kv-drop-rate", "0.01", "--sim-kv-events-encoding", encoding)...))
	if err := eventuallyErr(30*time.Second, func() error { _, err := ctlAt(c1.grpc, "model", "apply", "-f", file); return err }); err != nil {
		t.Fatalf("model apply: %v", err)
	}
	waitServing(t, c1.grpc, "kvt", 2, r1, r2)

	took := map[string][]time.Duration{}
	var steps []string
	round := 0
	traffic := func(n int) {
		t.Helper()
		round++
		kvTraffic(t, r1.http, "kvt", n, round)
	}
	check := func(step string) {
		t.Helper()
		if _, ok := took[step]; !ok {
			steps = append(steps, step)
		}
		replicas := liveReplicas(t, c, "kvt")
		took[step] = append(took[step], checkKVExactOf(t, replicas, "kvt", routers, step))
		t.Logf("%s: %s", step, engineTiers(t, replicas))
	}

	traffic(60)
	check("offload, 1% dropped")

	rounds := 1
	if soak() {
		rounds = 5
	}
	replicas := func() []replicaView { return liveReplicas(t, c, "kvt") }
	for range rounds {
		killEngineOf(t, replicas)
		waitServing(t, c1.grpc, "kvt", 2, r1, r2)
		traffic(30)
		check("engine kill -9")

		// The engines keep serving and publishing into the void while the
		// agent is down; the restarted agent re-adopts them and replays
		// from seq 0.
		agent.kill()
		traffic(20)
		agent.start()
		waitAgentAdopted(t, agent, 2)
		check("agent kill -9 + restart")

		// An engine killed while its agent is down: the restarted agent
		// finds it gone and starts it again, as a new incarnation whose
		// tiers start empty; the other engine is re-adopted.
		victim := readyEngine(t, replicas)
		agent.kill()
		killGroup(victim.Status.PID)
		_ = syscall.Kill(victim.Status.PID, syscall.SIGKILL)
		agent.start()
		waitNewIncarnation(t, replicas, victim)
		waitServing(t, c1.grpc, "kvt", 2, r1, r2)
		traffic(20)
		check("agent and an engine kill -9")

		// The control plane's KV state is not persisted: the restarted
		// server knows only what the agent's new session sends, a full
		// copy of its mirror, and each router's new watch stream starts
		// with it.
		sessions, _ := testkit.Scrape(agent.http, "llmgw_agent_sessions_total", nil)
		killed := time.Now()
		c1.kill()
		traffic(20)
		c1.start()
		c.waitLeader(c.servers, formTimeout)
		if !eventually(30*time.Second, func() bool {
			n, _ := testkit.Scrape(agent.http, "llmgw_agent_sessions_total", nil)
			a, _ := testkit.Scrape(agent.http, "llmgw_agent_session_attached", nil)
			return n > sessions && a == 1 && lastWatchOpen(r1).After(killed) && lastWatchOpen(r2).After(killed)
		}) {
			t.Fatalf("after the control server's restart the agent did not attach again (sessions %v before) or a router did not open a new watch stream within %v; agent log:\n%s",
				sessions, within(30*time.Second), tail(agent.output(), 20))
		}
		check("control server kill -9 + restart")

		r2.kill()
		traffic(20)
		r2.start()
		waitRouterServes(t, r2.http, "kvt")
		check("router kill -9 + restart")
	}

	var lines []string
	for _, step := range steps {
		lines = append(lines, fmt.Sprintf("%s: %s", step, summary(took[step])))
	}
	t.Logf("time from the last request to equal indexes in every tier: %s", strings.Join(lines, "; "))
}

// engineTiers reads each ready engine's /sim/blocks and says what its
// tiers hold: GPU blocks, CPU blocks, and of those the ones offloaded only
// (evicted from the GPU, kept in the CPU tier). The test fails when no
// engine holds a block in the CPU tier alone: then the step did not show
// the offload tier apart from the GPU's.
func engineTiers(t *testing.T, replicas []replicaView) string {
	t.Helper()
	var out []string
	cpuOnly := 0
	for _, e := range replicas {
		if !e.ready() {
			continue
		}
		var b struct {
			BlockHashes    []uint64 `json:"block_hashes"`
			CPUBlockHashes []uint64 `json:"cpu_block_hashes"`
		}
		if err := getJSON("http://"+e.Status.Address+"/sim/blocks", &b); err != nil {
			t.Fatalf("engine %s: %v", e.Replica.ID, err)
		}
		gpu := map[uint64]bool{}
		for _, h := range b.BlockHashes {
			gpu[h] = true
		}
		only := 0
		for _, h := range b.CPUBlockHashes {
			if !gpu[h] {
				only++
			}
		}
		cpuOnly += only
		out = append(out, fmt.Sprintf("%s GPU %d, CPU %d of %d (%d CPU only)", e.Replica.ID, len(b.BlockHashes), len(b.CPUBlockHashes), kvTierCPUBlocks, only))
	}
	if cpuOnly == 0 {
		t.Errorf("no engine holds a block in its CPU tier alone (%s): the traffic did not evict GPU blocks to the CPU tier", strings.Join(out, "; "))
	}
	return strings.Join(out, "; ")
}
