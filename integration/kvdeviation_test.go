package integration

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
)

// TestKVDeviatingEngine: two simulators behaving as the vLLM-compatible
// engine of issue 14 — KV batches numbered from 1 (--sim-kv-seq-start 1)
// and a first block's parent_block_hash sent as 0 in the array form
// (--sim-kv-parent-zero) — stay trusted: each engine start shows as a gap
// whose replay is the engine's whole history (llmgw_agent_kv_replays_total
// {result="complete"}), not one that "cannot close". The router's index
// equals the engines' caches within 1 s of quiescence (checkKVExact), at
// the start and after an engine's kill -9 (its successor numbers from 1
// again), and tier 2 decides with hits. The router observes the event lag.
func TestKVDeviatingEngine(t *testing.T) {
	agentHTTP := freeAddr(t)
	d := startDev(t, "--port-range", freePortRange(t, 20), "--agent-http-addr", agentHTTP)
	file := filepath.Join(t.TempDir(), "kvd.yaml")
	writeFile(t, file, kvModelYAML("kvd", 2, "--sim-kv-events-encoding", "array",
		"--sim-kv-seq-start", "1", "--sim-kv-parent-zero"))
	if out, err := d.ctl("model", "apply", "-f", file); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	d.waitReady("kvd", 2, 60*time.Second)

	trusted := func(step string, wantComplete float64) {
		t.Helper()
		if n, _ := testkit.Scrape(agentHTTP, "llmgw_agent_kv_untrusted_replicas", nil); n != 0 {
			t.Errorf("%s: agent counts %v untrusted replicas, want 0", step, n)
		}
		for _, r := range []string{"unrepairable", "failed"} {
			if n, _ := testkit.Scrape(agentHTTP, "llmgw_agent_kv_replays_total", testkit.Labels{"result": r}); n != 0 {
				t.Errorf("%s: %v replays %s, want 0", step, n, r)
			}
		}
		if n, _ := testkit.Scrape(agentHTTP, "llmgw_agent_kv_replays_total", testkit.Labels{"result": "complete"}); n < wantComplete {
			t.Errorf("%s: %v replays complete (the engine's whole history), want at least %v", step, n, wantComplete)
		}
	}

	kvTraffic(t, d.http, "kvd", 60, 0)
	took := checkKVExact(t, d, "kvd", []string{d.ops}, "batches from 1, parent 0")
	trusted("start", 2)
	hits, _ := testkit.Scrape(d.ops, "llmgw_kv_decisions_total", testkit.Labels{"decision": "hit"})
	if hits == 0 {
		t.Error("no tier-2 hit decisions for the deviating engines")
	}

	// kill -9: the successor is a new process that numbers from 1 again.
	killEngineAndWait(t, d, "kvd")
	kvTraffic(t, d.http, "kvd", 30, 1)
	tookRestart := checkKVExact(t, d, "kvd", []string{d.ops}, "engine restart, batches from 1 again")
	trusted("restart", 3)

	if n, ok := testkit.Scrape(d.ops, "llmgw_router_kv_event_lag_seconds", testkit.Labels{"edge": "oldest"}); !ok || n == 0 {
		t.Errorf("router observed no KV event lag (%v, %v)", n, ok)
	}
	t.Logf("index equal to the engines' caches %v after the last request at start, %v after the restart",
		took.Round(time.Millisecond), tookRestart.Round(time.Millisecond))
}
