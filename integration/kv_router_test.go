package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Precise prefix routing end to end (design §7.5 tier 2; issue "Precise
// prefix routing", "Exactness"): simulated engines publish KV events, the
// agent mirrors them, the control plane forwards them, and every router's
// index must equal each engine's real block set (/sim/blocks) within 1 s of
// quiescence — in both encodings and both hash forms, with 1 % of event
// batches dropped (repaired by replay), after an engine's kill -9 and after
// a router's kill -9 and restart.

// kvQuiesceBound is the bound: identical within 1 s of the last
// request (the agent batches every 250 ms, then two gRPC hops). It is a
// bound for a machine that is not overloaded: checkKVExactOf holds the
// indexes to within(kvQuiesceBound), the same bound on an idle machine and
// a scaled one on a loaded machine, where a process may wait a second for
// a CPU, and logs the figure either way.
const kvQuiesceBound = time.Second

func TestKVRouterExactness(t *testing.T) {
	tests := []struct {
		name, encoding, intHashes string
		// restarts: also kill -9 an engine and a second router, and check
		// again after each.
		restarts bool
	}{
		{"map-ints", "map", "1", true},
		{"map-bytes", "map", "0", false},
		{"array-ints", "array", "1", false},
		{"array-bytes", "array", "0", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// The agent hands its environment to the engines it starts.
			t.Setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", tc.intHashes)
			d := startDev(t, "--port-range", freePortRange(t, 20))
			file := filepath.Join(t.TempDir(), "kvm.yaml")
			// A cache of 64 blocks of 16 tokens: the traffic below stores,
			// shares and evicts.
			writeFile(t, file, "name: kvm\nengine: sim\nmodel: org/kvm\nreplicas: 2\ngpus_per_replica: 1\nkv_events: true\n"+
				"extra_args: [\"--sim-decode-ms-per-token\", \"0\", \"--sim-prefill-us-per-token\", \"0\", \"--num-gpu-blocks-override\", \"64\", \"--max-model-len\", \"1024\","+
				" \"--sim-kv-events-encoding\", \""+tc.encoding+"\", \"--sim-kv-drop-rate\", \"0.01\"]\n")
			if out, err := d.ctl("model", "apply", "-f", file); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			d.waitReady("kvm", 2, 60*time.Second)
			routers := []string{d.ops} // the indexes are read on the operations ports
			var r2 *controlServer
			if tc.restarts {
				r2 = startRouterProc(t, "r2", d.grpc)
				routers = append(routers, r2.ops)
				waitRouterServes(t, r2.http, "kvm")
			}

			kvTraffic(t, d.http, "kvm", 60, 0)
			checkKVExact(t, d, "kvm", routers, "1% dropped")

			if !tc.restarts {
				return
			}
			// An engine's kill -9: the agent restarts it as a new
			// incarnation, whose first batch is a reset.
			killEngineAndWait(t, d, "kvm")
			kvTraffic(t, d.http, "kvm", 30, 1)
			checkKVExact(t, d, "kvm", routers, "engine restart")

			// A router's kill -9 and restart: its index comes back from the
			// full copies the control plane sends a (re)connected watcher.
			// Known to fail at times (reported): the router restores each
			// node's ephemeral epoch/seq from its data dir, judges the
			// control plane's full copy at the same seq stale and drops it,
			// so the KV index, which is not persisted, gets deltas without
			// a base ("no kv state for replica").
			r2.kill()
			kvTraffic(t, d.http, "kvm", 20, 2)
			// Debug: its refusals of KV updates are logged, for a failure.
			r2.args = append(r2.args, "--log-level", "debug")
			r2.start()
			waitRouterServes(t, r2.http, "kvm")
			checkKVExact(t, d, "kvm", routers, "router restart")
		})
	}
}

// waitRouterServes waits until a router answers a chat for model.
func waitRouterServes(t *testing.T, addr, model string) {
	t.Helper()
	if !eventually(60*time.Second, func() bool { code, _ := chat(addr, model); return code == http.StatusOK }) {
		t.Fatalf("router %s does not serve %s within %v", addr, model, within(60*time.Second))
	}
}

// kvTraffic sends n chats through a router from 4 clients: five system
// prompts of ~200 words shared by many requests, each with its own
// question, so blocks are shared, stored and evicted.
func kvTraffic(t *testing.T, addr, model string, n, round int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan string, n)
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				sys := strings.Repeat(fmt.Sprintf("rule %d of the house is to be kind. ", i%5), 25)
				body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 4, "messages": []map[string]string{
					{"role": "system", "content": sys},
					{"role": "user", "content": fmt.Sprintf("question %d of round %d: %s", i, round, strings.Repeat("why ", i%7))},
				}})
				resp, err := chatClient.Post("http://"+addr+"/v1/chat/completions", "application/json", bytes.NewReader(body))
				if err != nil {
					errs <- err.Error()
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					errs <- fmt.Sprintf("%d %s", resp.StatusCode, b)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Errorf("chat: %s", e)
	}
}

// kvIndexView is GET /debug/kvindex?replica=ID on a router's operations
// port: one page of the hashes, Next the last of them when more follow.
type kvIndexView struct {
	ID          string
	Incarnation uint64
	Untrusted   bool
	Hashes      []uint64 `json:"hashes"`
	Next        *uint64  `json:"next"`
}

// routerKVIndexTier is every page of a router's index for replica in one
// tier (gpu, cpu or storage: design §7.5 "Offload tiers"), read on its
// operations port ops, with all the hashes.
func routerKVIndexTier(ops, replica, tier string) (kvIndexView, error) {
	var all kvIndexView
	after := ""
	for {
		var page kvIndexView
		if err := getJSON("http://"+ops+"/debug/kvindex?replica="+replica+"&tier="+tier+after, &page); err != nil {
			return all, err
		}
		hashes := append(all.Hashes, page.Hashes...)
		all, all.Hashes = page, hashes
		if page.Next == nil {
			return all, nil
		}
		after = fmt.Sprintf("&after=%d", *page.Next)
	}
}

// hashDiff says how got differs from want, both sorted: the hashes
// missing from got and those it has extra, at most 8 of each listed.
func hashDiff(want, got []uint64) string {
	var missing, extra []uint64
	i, j := 0, 0
	for i < len(want) || j < len(got) {
		switch {
		case j == len(got) || (i < len(want) && want[i] < got[j]):
			missing = append(missing, want[i])
			i++
		case i == len(want) || got[j] < want[i]:
			extra = append(extra, got[j])
			j++
		default:
			i++
			j++
		}
	}
	list := func(hs []uint64) string {
		if len(hs) > 8 {
			return fmt.Sprintf("%v …", hs[:8])
		}
		return fmt.Sprint(hs)
	}
	return fmt.Sprintf("%d missing %s, %d extra %s", len(missing), list(missing), len(extra), list(extra))
}

func getJSON(url string, v any) error {
	resp, err := chatClient.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// checkKVExact ends the traffic's fault injection, reveals any gap at the
// tail (a dropped last batch shows only when the next one arrives) with one
// request straight to each engine, and then polls until every router's
// index equals every engine's block set: within within(kvQuiesceBound) of
// that last request, or the test fails (after within(10 s) more, to tell
// slow from wrong). routers are the routers' operations ports, where their
// indexes are read.
func checkKVExact(t *testing.T, d *devProcess, model string, routers []string, step string) time.Duration {
	t.Helper()
	return checkKVExactOf(t, d.modelReplicas(model), model, routers, step)
}

// checkKVExactOf is checkKVExact over a replica list read by the caller
// (from whichever control node is up), and returns the time from the last
// request to equality.
func checkKVExactOf(t *testing.T, replicas []replicaView, model string, routers []string, step string) time.Duration {
	t.Helper()
	var engines []replicaView
	for _, r := range replicas {
		if r.ready() {
			engines = append(engines, r)
		}
	}
	for _, e := range engines {
		resp, err := chatClient.Post("http://"+e.Status.Address+"/sim/faults", "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	for i, e := range engines {
		// Long enough to fill blocks, so every engine holds some.
		body := fmt.Sprintf(`{"model":%q,"prompt":"the last word %d on %s: %s","max_tokens":1}`, model, i, step, strings.Repeat("quiet now. ", 30))
		resp, err := chatClient.Post("http://"+e.Status.Address+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	quiet := time.Now()
	var diff string
	same := func() bool {
		for _, e := range engines {
			var want struct {
				BlockHashes    []uint64 `json:"block_hashes"`
				CPUBlockHashes []uint64 `json:"cpu_block_hashes"`
			}
			if err := getJSON("http://"+e.Status.Address+"/sim/blocks", &want); err != nil {
				diff = err.Error()
				return false
			}
			if len(want.BlockHashes) == 0 {
				diff = "engine " + e.Replica.ID + " holds no blocks"
				return false
			}
			// Every tier, each against the engine's own set: an engine
			// without --kv-offloading-size holds no CPU blocks, and the
			// simulator has no storage tier, so theirs must be empty too.
			for _, tier := range []struct {
				name string
				want []uint64
			}{{"gpu", want.BlockHashes}, {"cpu", want.CPUBlockHashes}, {"storage", nil}} {
				for _, r := range routers {
					got, err := routerKVIndexTier(r, e.Replica.ID, tier.name)
					if err != nil {
						diff = err.Error()
						return false
					}
					if got.Untrusted || !slices.Equal(got.Hashes, tier.want) {
						diff = fmt.Sprintf("router %s replica %s tier %s: untrusted %v, %d hashes against the engine's %d: %s", r, e.Replica.ID,
							tier.name, got.Untrusted, len(got.Hashes), len(tier.want), hashDiff(tier.want, got.Hashes))
						return false
					}
				}
			}
		}
		return true
	}
	bound := within(kvQuiesceBound)
	for !same() {
		if time.Since(quiet) > bound+within(10*time.Second) {
			t.Fatalf("%s: indexes never matched the engines within %v: %s", step, bound+within(10*time.Second), diff)
		}
		time.Sleep(50 * time.Millisecond)
	}
	took := time.Since(quiet)
	t.Logf("%s: %d routers match %d engines %v after the last request", step, len(routers), len(engines), took.Round(time.Millisecond))
	if took > bound {
		t.Errorf("%s: indexes matched only %v after the last request (bound %v, the issue's %v scaled for load); before: %s", step, took, bound, kvQuiesceBound, diff)
	}
	return took
}

// killEngineAndWait kill -9s one of model's two ready engines and waits
// until its replica is ready again as a new incarnation, and both are.
func killEngineAndWait(t *testing.T, d *devProcess, model string) {
	t.Helper()
	d.waitReady(model, 2, 10*time.Second)
	killEngineOf(t, func() []replicaView { return d.modelReplicas(model) })
	d.waitReady(model, 2, 30*time.Second)
}

// killEngineOf kill -9s the first ready engine of the replicas list
// returns (a model's, read from any control node) and waits until its
// replica is ready again as a new incarnation.
func killEngineOf(t *testing.T, list func() []replicaView) {
	t.Helper()
	victim := readyEngine(t, list)
	killGroup(victim.Status.PID)
	_ = syscall.Kill(victim.Status.PID, syscall.SIGKILL)
	waitNewIncarnation(t, list, victim)
}

// readyEngine is the first ready replica with an engine pid that list
// returns.
func readyEngine(t *testing.T, list func() []replicaView) replicaView {
	t.Helper()
	var victim replicaView
	if !eventually(10*time.Second, func() bool {
		for _, r := range list() {
			if r.ready() && r.Status.PID > 0 {
				victim = r
				return true
			}
		}
		return false
	}) {
		t.Fatalf("no ready engine with a pid within %v", within(10*time.Second))
	}
	return victim
}

// waitNewIncarnation waits until killed's replica is ready again as a new
// incarnation.
func waitNewIncarnation(t *testing.T, list func() []replicaView, killed replicaView) {
	t.Helper()
	if !eventually(60*time.Second, func() bool {
		for _, r := range list() {
			if r.Replica.ID == killed.Replica.ID && r.ready() && r.Status.Incarnation != killed.Status.Incarnation {
				return true
			}
		}
		return false
	}) {
		t.Fatalf("replica %s (pid %d killed) not back as a new incarnation within %v", killed.Replica.ID, killed.Status.PID, within(60*time.Second))
	}
}
