package integration

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
)

// TestLoRAQueue (issue 16, design §7.6): `llmgw dev` plus a second
// `llmgw router` with --adapter-wait 15s; model lora: 2 sim replicas,
// max_loaded_adapters 2, 6 adapters, 10 ms a token, 200 ms a load. Every
// request for an adapter no replica can take now waits in its router's
// queue for a slot instead of failing.
//
//   - burst: the case through the dev's router — 90 requests in
//     bursts of 10, one burst a second, adapters drawn by Zipf, 30 s
//     client timeout: every one answered 200 (before the queue, 9 × 503).
//   - fairness: through the second router, one adapter takes 80 % of 150
//     requests at 10 a second; the coldest adapter's longest wait (the
//     router's own figure, from its log) stays within --adapter-wait, and
//     every request is answered 200.
//   - no engine unloads an adapter with requests for it, and the plane
//     evicts none while an engine has requests for it (sampled; before
//     the routers reported their requests in flight, issue 27, 2 to 5
//     of each run's evictions were decided on the agents' readings, a
//     second old, while the engine still had requests).
//
// Both report TTFT p50/p99 and the longest waits.
func TestLoRAQueue(t *testing.T) {
	d := startDev(t, "--replicas", "2")
	const adapterWait = 15 * time.Second
	r2 := startRouterWith(t, "r2", []string{d.grpc}, "--adapter-wait", adapterWait.String())
	ready := applyLoRAModel(t, d, `["--sim-decode-ms-per-token", "10", "--sim-lora-load-delay", "200ms"]`)
	if !eventually(30*time.Second, func() bool {
		code, _ := postTo(t, "http://"+r2.http+"/v1/chat/completions", `{"model":"lora","messages":[{"role":"user","content":"x"}],"max_tokens":1}`)
		return code == 200
	}) {
		t.Fatalf("the second router did not serve the base model within %v", within(30*time.Second))
	}
	watch := startAdapterWatch(ready)

	t.Run("burst", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(16, 1))
		zipf := rand.NewZipf(rng, 1.1, 1, 5)
		var seq []string
		for range 90 {
			seq = append(seq, string(rune('a'+zipf.Uint64())))
		}
		res := sendPaced(t, "http://"+d.http, seq, 10, time.Second, 30*time.Second)
		report(t, "burst (dev router)", res)
		if n := failures(res); n != 0 {
			t.Errorf("%d of %d requests failed: %v", n, len(res), statusCounts(res))
		}
		t.Logf("served after waiting in the queue: %v of %d", testkit.MustScrape(t, d.ops, "llmgw_router_adapter_queue_requests_total", testkit.Labels{"model": "lora", "result": "served_after_wait"}), len(res))
	})

	t.Run("fairness", func(t *testing.T) {
		counts := map[string]int{"a": 120, "b": 10, "c": 8, "d": 6, "e": 4, "f": 2} // a: 80 %
		var seq []string
		for _, a := range []string{"a", "b", "c", "d", "e", "f"} {
			for range counts[a] {
				seq = append(seq, a)
			}
		}
		rng := rand.New(rand.NewPCG(16, 2))
		rng.Shuffle(len(seq), func(i, j int) { seq[i], seq[j] = seq[j], seq[i] })
		res := sendPaced(t, "http://"+r2.http, seq, 1, 100*time.Millisecond, 2*adapterWait)
		report(t, "fairness (a: 80 %)", res)
		if n := failures(res); n != 0 {
			t.Errorf("%d of %d requests failed: %v", n, len(res), statusCounts(res))
		}
		b, err := os.ReadFile(r2.logPath)
		if err != nil {
			t.Fatal(err)
		}
		waits := routerWaits(t, string(b))
		coldest := "f"
		if len(waits[coldest]) == 0 {
			t.Fatalf("the router logged no wait for the coldest adapter %s (waits: %v)", coldest, waits)
		}
		for _, a := range []string{"a", "b", "c", "d", "e", "f"} {
			t.Logf("adapter %s: %d requests, %d waited in the queue, longest wait %v", a, counts[a], len(waits[a]), slices.Max(append(waits[a], 0)))
		}
		if longest := slices.Max(waits[coldest]); longest >= adapterWait {
			t.Errorf("the coldest adapter %s waited %v, not within --adapter-wait %v", coldest, longest, adapterWait)
		}
	})

	watch.stop()
	for _, r := range ready {
		if rep := simAdapters(t, r.Status.Address); rep.MaxHeld > 2 {
			t.Errorf("%s held %d adapters at once, want at most 2", r.Replica.ID, rep.MaxHeld)
		}
	}
	// The engines never unload an adapter with requests running or
	// waiting (the agent reads the engine again just before), and the
	// plane never evicts one an engine has requests for: the routers
	// report theirs in flight, and send a request for an adapter not used
	// lately only once the leader has acknowledged it (design §7.6).
	if err := d.stop(); err != nil {
		t.Errorf("stopping dev: %v", err)
	}
	// The dev's router served only the burst: its longest wait.
	var longest time.Duration
	waited := 0
	for _, ws := range routerWaits(t, d.log.String()) {
		waited += len(ws)
		longest = max(longest, slices.Max(ws))
	}
	t.Logf("burst: %d requests waited in the dev router's queue, the longest %v", waited, longest)
	checkEvictions(t, watch, evictionDecisions(t, d.log.String()), 1)
}

// applyLoRAModel applies model lora (2 sim replicas, max_loaded_adapters
// 2, adapters a–f in temporary directories, extraArgs as its extra_args)
// and waits for both replicas.
func applyLoRAModel(t *testing.T, d *devProcess, extraArgs string) []replicaView {
	t.Helper()
	root := t.TempDir()
	yaml := "name: lora\nengine: sim\nmodel: org/base\nreplicas: 2\ngpus_per_replica: 1\nmax_loaded_adapters: 2\nmax_lora_rank: 16\nadapters:\n"
	for _, n := range []string{"a", "b", "c", "d", "e", "f"} {
		if err := os.Mkdir(filepath.Join(root, n), 0o755); err != nil {
			t.Fatal(err)
		}
		yaml += fmt.Sprintf("  - {name: %s, path: %s}\n", n, filepath.Join(root, n))
	}
	yaml += "extra_args: " + extraArgs + "\n"
	file := filepath.Join(t.TempDir(), "lora.yaml")
	writeFile(t, file, yaml)
	if out, err := d.ctl("model", "apply", "-f", file); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return d.waitReady("lora", 2, 60*time.Second)
}

// queueResult is one request's outcome: status 0 for a transport error
// (the client's timeout included), ttft to the first streamed chunk.
type queueResult struct {
	adapter string
	status  int
	ttft    time.Duration
	err     error
}

// sendPaced sends seq's requests (streamed chat, 16 tokens) to router in
// groups of burst, one group every gap without waiting for the previous,
// each with the client timeout, and returns every outcome.
func sendPaced(t *testing.T, router string, seq []string, burst int, gap, timeout time.Duration) []queueResult {
	t.Helper()
	client := &http.Client{Timeout: timeout}
	out := make([]queueResult, len(seq))
	var wg sync.WaitGroup
	tick := time.NewTicker(gap)
	defer tick.Stop()
	for i := 0; i < len(seq); i += burst {
		if i > 0 {
			<-tick.C
		}
		for j := i; j < min(i+burst, len(seq)); j++ {
			wg.Go(func() { out[j] = streamChat(client, router, seq[j]) })
		}
	}
	wg.Wait()
	return out
}

func streamChat(client *http.Client, router, adapter string) queueResult {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"select 1"}],"max_tokens":16,"stream":true}`, adapter)
	start := time.Now()
	resp, err := client.Post(router+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return queueResult{adapter: adapter, err: err}
	}
	defer resp.Body.Close()
	r := queueResult{adapter: adapter, status: resp.StatusCode}
	if resp.StatusCode == 503 && resp.Header.Get("Retry-After") == "" {
		r.err = fmt.Errorf("503 without Retry-After")
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data:") {
			if r.ttft == 0 {
				r.ttft = time.Since(start)
			}
		}
	}
	if err := sc.Err(); err != nil && r.err == nil {
		r.err = err
	}
	return r
}

func failures(res []queueResult) int {
	n := 0
	for _, r := range res {
		if r.status != 200 || r.err != nil {
			n++
		}
	}
	return n
}

func statusCounts(res []queueResult) map[string]int {
	out := map[string]int{}
	for _, r := range res {
		k := strconv.Itoa(r.status)
		if r.err != nil {
			k += " (" + r.err.Error() + ")"
		}
		out[k]++
	}
	return out
}

// report logs the TTFT p50/p99 and longest of the answered requests.
func report(t *testing.T, name string, res []queueResult) {
	t.Helper()
	var ttfts []time.Duration
	for _, r := range res {
		if r.status == 200 && r.ttft > 0 {
			ttfts = append(ttfts, r.ttft)
		}
	}
	if len(ttfts) == 0 {
		t.Logf("%s: no request answered (%v)", name, statusCounts(res))
		return
	}
	slices.Sort(ttfts)
	q := func(p float64) time.Duration { return ttfts[min(len(ttfts)-1, int(p*float64(len(ttfts))))] }
	t.Logf("%s: %d requests, %v; TTFT p50 %v, p99 %v, max %v", name, len(res), statusCounts(res),
		q(0.5).Round(time.Millisecond), q(0.99).Round(time.Millisecond), ttfts[len(ttfts)-1].Round(time.Millisecond))
}

var waitLine = regexp.MustCompile(`msg="router: adapter wait ended".* result=(\S+) waited_ms=(\d+)`)
var adapterAttr = regexp.MustCompile(` adapter=(\S+)`)

// routerWaits reads a router's log: the queue waits per adapter.
func routerWaits(t *testing.T, log string) map[string][]time.Duration {
	t.Helper()
	out := map[string][]time.Duration{}
	for line := range strings.SplitSeq(log, "\n") {
		m := waitLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		a := adapterAttr.FindStringSubmatch(line)
		if a == nil {
			t.Fatalf("wait line without an adapter: %s", line)
		}
		ms, _ := strconv.Atoi(m[2])
		out[a[1]] = append(out[a[1]], time.Duration(ms)*time.Millisecond)
	}
	return out
}
