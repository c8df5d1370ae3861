package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The engine boundary for external engines (issue 27, part 2; design §6
// "External engines", §7.5): real processes — a control server, an agent, a
// router and `llmgw sim serve` engines llmgw did not start — in the four
// cases where the index used to be silently wrong.

// kvStreamTimeout is the agent's --kv-stream-timeout here: the stated time
// within which a replica whose event stream never formed is untrusted.
const kvStreamTimeout = 3 * time.Second

// startExternalWith starts an engine like startExternalEngine, its
// publisher at pub (a wildcard-marked address binds, a plain one connects
// out, by vLLM's rule) and without dropped batches; extra are more flags.
func startExternalWith(t *testing.T, id, model, pub string, extra ...string) *externalEngine {
	t.Helper()
	e := &externalEngine{http: freeAddr(t), pub: freeAddr(t), replay: freeAddr(t)}
	port := func(addr string) string { return addr[strings.LastIndexByte(addr, ':')+1:] }
	if pub == "" {
		pub = "tcp://[::ffff:127.0.0.1]:" + port(e.pub)
	}
	kvCfg, _ := json.Marshal(map[string]any{"enable_kv_cache_events": true, "publisher": "zmq",
		"endpoint": pub, "replay_endpoint": "tcp://[::ffff:127.0.0.1]:" + port(e.replay), "topic": ""})
	args := append([]string{"sim", "serve", "org/" + model, "--host", "127.0.0.1", "--port", port(e.http), "--served-model-name", model,
		"--enable-prompt-tokens-details", "--block-size", "16", "--prefix-caching-hash-algo", "sha256_cbor",
		"--kv-events-config", string(kvCfg), "--sim-decode-ms-per-token", "0", "--sim-prefill-us-per-token", "0",
		"--num-gpu-blocks-override", "64", "--max-model-len", "1024"}, extra...)
	e.proc = llmgwProcess(t, id, args...)
	e.proc.args = e.proc.args[:len(e.proc.args)-2] // no --data-dir: vLLM's flags only
	e.proc.start()
	e.waitUp(t)
	return e
}

// applyExternal applies a one-endpoint external model over e with kv
// events and the extra YAML lines.
func applyExternal(t *testing.T, control, model string, e *externalEngine, extra string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), model+".yaml")
	writeFile(t, file, fmt.Sprintf("name: %s\nengine: external\nendpoints: [\"http://%s\"]\nkv_events: true\nblock_size: 16\nhash_seed: \"0\"\n%s",
		model, e.http, extra))
	if err := eventuallyErr(30*time.Second, func() error { _, err := ctlAt(control, "model", "apply", "-f", file); return err }); err != nil {
		t.Fatalf("model apply %s: %v", model, err)
	}
}

// kvColumn is the KV column of the model's replica in `llmgwctl replica
// list`, and the replica's id.
func kvColumn(t *testing.T, control, model string) (kv, id string) {
	t.Helper()
	out, err := ctlAt(control, "replica", "list")
	if err != nil {
		return "", ""
	}
	lines := strings.Split(out, "\n")
	col := strings.Index(lines[0], "KV")
	for _, l := range lines[1:] {
		if f := strings.Fields(l); len(f) > 1 && f[1] == model && col >= 0 && len(l) > col {
			return strings.TrimSpace(l[col:]), f[0]
		}
	}
	return "", ""
}

// waitKVColumn waits until the model's KV column satisfies ok.
func waitKVColumn(t *testing.T, control, model, what string, timeout time.Duration, ok func(string) bool) (string, time.Duration) {
	t.Helper()
	began := time.Now()
	var last string
	if !eventually(timeout, func() bool { last, _ = kvColumn(t, control, model); return ok(last) }) {
		t.Fatalf("%s: not within %v; KV column %q", what, within(timeout), last)
	}
	return last, time.Since(began)
}

func untrustedCol(s string) bool { return strings.HasPrefix(s, "untrusted") }
func trustedCol(s string) bool   { return strings.HasSuffix(s, " blocks") }

// TestExternalEngineBoundary (issue 27): an external engine's KV events are
// either true or marked untrusted, never silently wrong.
//   - Its publisher connects out (vLLM with a plain address): the agent
//     listens (kv_events_listen, open to the engine's host only) and tier 2
//     hits, the index equal to the engine's cache within 1 s.
//   - Its publisher cannot be reached: untrusted within --kv-stream-timeout,
//     shown by replica list with the reason, and routed by tier 1.
//   - Killed and restarted within one health interval (no health check
//     noticed): the index equals the new process's cache within 1 s of its
//     traffic.
//   - Its replay buffer has wrapped: untrusted, then exact after the
//     engine's next reset.
func TestExternalEngineBoundary(t *testing.T) {
	t.Setenv("PYTHONHASHSEED", "0")
	c1 := newServer(t, "c1", serverOpts{expect: 1})
	c1.start()
	(&cluster{t: t, servers: []*controlServer{c1}}).waitLeader([]*controlServer{c1}, 30*time.Second)
	// One probe every 5 s and three misses to UNHEALTHY: an engine back
	// within a few seconds is a restart no health check sees.
	startAgentProc(t, "n1", []string{c1.grpc}, "--probe-interval", "5s", "--kv-stream-timeout", kvStreamTimeout.String())
	r := startRouterProc(t, "r1", c1.grpc)
	exact := func(model, step string) {
		t.Helper()
		list, err := clusterReplicas(c1.grpc)
		if err != nil {
			t.Fatal(err)
		}
		var mine []replicaView
		for _, v := range list {
			if v.Replica.Model == model {
				mine = append(mine, v)
			}
		}
		checkKVExactOf(t, mine, model, []string{r.ops}, step)
	}

	// 1. A publisher that connects out, to the agent's listening socket.
	listen := freeAddr(t)
	out := startExternalWith(t, "e-out", "ext-out", "tcp://"+listen)
	applyExternal(t, c1.grpc, "ext-out", out, fmt.Sprintf("kv_events_listen: [\"tcp://%s\"]\nkv_events_replay: [\"tcp://%s\"]\n", listen, out.replay))
	waitExternal(t, c1.grpc, "ext-out", []*externalEngine{out}, "ext-out READY", readyAt)
	waitRouterServes(t, r.http, "ext-out")
	hits := kvDecisions(r.ops)["hit"]
	kvTraffic(t, r.http, "ext-out", 40, 0)
	exact("ext-out", "publisher connecting out")
	if got := kvDecisions(r.ops)["hit"] - hits; got < 1 {
		t.Errorf("tier-2 hits %v for a publisher connecting out; want some", got)
	}
	if kv, _ := kvColumn(t, c1.grpc, "ext-out"); !trustedCol(kv) {
		t.Errorf("replica list KV %q; want its blocks", kv)
	}

	// 2. A publisher no one can reach (the model names a port where nothing
	// publishes): untrusted within the stream timeout, with the reason.
	dead := startExternalWith(t, "e-dead", "ext-dead", "")
	applyExternal(t, c1.grpc, "ext-dead", dead, fmt.Sprintf("kv_events_publishers: [\"tcp://%s\"]\nkv_events_replay: [\"tcp://%s\"]\n", freeAddr(t), dead.replay))
	waitExternal(t, c1.grpc, "ext-dead", []*externalEngine{dead}, "ext-dead READY", readyAt)
	kv, took := waitKVColumn(t, c1.grpc, "ext-dead", "the unreachable stream untrusted", kvStreamTimeout+20*time.Second, untrustedCol)
	t.Logf("unreachable publisher: %q shown %v after READY (stream timeout %v)", kv, took.Round(100*time.Millisecond), kvStreamTimeout)
	if !strings.Contains(kv, "did not connect within "+kvStreamTimeout.String()) {
		t.Errorf("KV column %q; want the reason", kv)
	}
	waitRouterServes(t, r.http, "ext-dead")
	untrusted := kvDecisions(r.ops)["untrusted"]
	kvTraffic(t, r.http, "ext-dead", 10, 0) // every request a 200
	if got := kvDecisions(r.ops)["untrusted"] - untrusted; got < 10 {
		t.Errorf("tier-2 untrusted decisions %v for 10 requests; want each placed by tier 1", got)
	}

	// 3. The connecting-out engine killed and restarted at once: its
	// replica stays READY with the same incarnation (no probe failed three
	// times), and the index follows the new process.
	was := waitExternal(t, c1.grpc, "ext-out", []*externalEngine{out}, "ext-out READY", readyAt)[out.http]
	out.proc.kill()
	out.proc.start()
	out.waitUp(t)
	now := waitExternal(t, c1.grpc, "ext-out", []*externalEngine{out}, "ext-out READY", readyAt)[out.http]
	if now.Status.Incarnation != was.Status.Incarnation {
		t.Logf("a health check saw the restart (incarnation %v -> %v); the engine's own signals were not needed", was.Status.Incarnation, now.Status.Incarnation)
	}
	kvTraffic(t, r.http, "ext-out", 30, 1)
	exact("ext-out", "engine restarted within a health interval")

	// 4. A replay buffer that wrapped before the agent attached: 20
	// requests to an engine holding 8 batches, then the model applied.
	wrap := startExternalWith(t, "e-wrap", "ext-wrap", "", "--sim-kv-buffer-steps", "8")
	for i := range 20 {
		body := fmt.Sprintf(`{"model":"ext-wrap","prompt":"before anyone listened %d: %s","max_tokens":1}`, i, strings.Repeat("hot prompt. ", 20))
		resp, err := chatClient.Post("http://"+wrap.http+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	applyExternal(t, c1.grpc, "ext-wrap", wrap, fmt.Sprintf("kv_events_publishers: [\"tcp://%s\"]\nkv_events_replay: [\"tcp://%s\"]\nkv_events_buffer_steps: 8\n", wrap.pub, wrap.replay))
	waitExternal(t, c1.grpc, "ext-wrap", []*externalEngine{wrap}, "ext-wrap READY", readyAt)
	kv, _ = waitKVColumn(t, c1.grpc, "ext-wrap", "the wrapped replay untrusted", 30*time.Second, untrustedCol)
	t.Logf("wrapped replay buffer: %q", kv)
	resp, err := chatClient.Post("http://"+wrap.http+"/reset_prefix_cache", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("reset_prefix_cache: %d", resp.StatusCode)
	}
	waitKVColumn(t, c1.grpc, "ext-wrap", "trusted again after the engine's reset", 30*time.Second, trustedCol)
	waitRouterServes(t, r.http, "ext-wrap")
	kvTraffic(t, r.http, "ext-wrap", 30, 2)
	exact("ext-wrap", "after the reset")
}
