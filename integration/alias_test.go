//go:build !llmgw_upgrade_old

package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
)

// TestModelAliases (issue 31) runs `llmgw dev` with three sim models —
// demo (2 replicas), canary (1) and next (2) — and a second router started
// once the alias exists (so it learns it from its first snapshot, the
// first router from a change), all real processes:
//   - an alias 90/10 over demo and canary splits N requests (default
//     2,000; LLMGW_ALIAS_REQUESTS sets it, 20,000 for the benchmark) within
//     five standard deviations of 90 % — ±3.4 points at 2,000, ±1.1 at
//     20,000 — each answer naming the model that served it;
//   - sticky by session, every request of a session goes to one target;
//   - cutting the alias to next under load fails no request, and each
//     router serves next within a second of the commit (measured from the
//     start of `llmgwctl alias apply`, an upper bound);
//   - with every replica of next killed, the fallback canary absorbs the
//     load with under 0.1 % errors until next is back;
//   - /v1/models lists the alias.
func TestModelAliases(t *testing.T) {
	d := startDev(t, "--sim-decode-ms-per-token", "1")
	applyModel(t, d.grpc, "canary", 1)
	applyModel(t, d.grpc, "next", 2)
	d.waitReady("canary", 1, 60*time.Second)
	d.waitReady("next", 2, 60*time.Second)

	dir := t.TempDir()
	applyAlias := func(body string) time.Duration {
		t.Helper()
		file := filepath.Join(dir, fmt.Sprintf("alias-%d.yaml", time.Now().UnixNano()))
		writeFile(t, file, body)
		start := time.Now()
		if out, err := d.ctl("alias", "apply", "-f", file); err != nil || !strings.Contains(out, "applied at revision") {
			t.Fatalf("alias apply: %v %s", err, out)
		}
		return time.Since(start)
	}
	applyAlias("name: prod\ntargets:\n  - {target: demo, weight: 90}\n  - {target: canary, weight: 10}\nfallbacks: [next]\n")
	r2 := startRouterWith(t, "r2", []string{d.grpc})
	routers := []string{d.http, r2.http}
	for _, addr := range routers {
		if !eventually(30*time.Second, func() bool { c, _ := aliasChat(addr, "prod", ""); return c == http.StatusOK }) {
			t.Fatalf("router %s does not serve the alias within %v", addr, within(30*time.Second))
		}
	}

	t.Run("90/10 split", func(t *testing.T) {
		n := 2000
		if v, err := strconv.Atoi(os.Getenv("LLMGW_ALIAS_REQUESTS")); err == nil && v > 0 {
			n = v
		}
		counts, failed, elapsed := aliasLoad(routers, n, 16, func(int) string { return "" })
		if failed > 0 {
			t.Errorf("%d of %d requests failed", failed, n)
		}
		share := 100 * float64(counts["demo"]) / float64(n)
		sigma := 100 * math.Sqrt(0.9*0.1/float64(n))
		t.Logf("alias 90/10 over %d requests in %v through 2 routers: demo %d (%.2f %%), canary %d (%.2f %%), other %v",
			n, elapsed.Round(time.Millisecond), counts["demo"], share, counts["canary"], 100*float64(counts["canary"])/float64(n), counts)
		if math.Abs(share-90) > 5*sigma || counts["demo"]+counts["canary"] != n-failed {
			t.Errorf("demo served %.2f %% (%v), want 90 ± %.2f", share, counts, 5*sigma)
		}
	})

	t.Run("sticky by session", func(t *testing.T) {
		applyAlias("name: prod\ntargets:\n  - {target: demo, weight: 1}\n  - {target: canary, weight: 1}\nsticky: session\nfallbacks: [next]\n")
		// Until both routers have it: a session's answers are all one target.
		const sessions, per = 40, 5
		var lastErr string
		ok := eventually(10*time.Second, func() bool {
			seen := map[string]bool{}
			for s := range sessions {
				var first string
				for i := range per {
					code, model := aliasChat(routers[(s+i)%2], "prod", fmt.Sprintf("session-%d", s))
					if code != http.StatusOK {
						lastErr = fmt.Sprintf("session-%d: %d", s, code)
						return false
					}
					if i == 0 {
						first = model
					} else if model != first {
						lastErr = fmt.Sprintf("session-%d went to %s, then %s", s, first, model)
						return false
					}
				}
				seen[first] = true
			}
			if !seen["demo"] || !seen["canary"] {
				lastErr = fmt.Sprintf("sessions all went to %v", seen)
				return false
			}
			return true
		})
		if !ok {
			t.Fatalf("sticky by session: %s", lastErr)
		}
	})

	t.Run("cut over under load", func(t *testing.T) {
		var sent, failed atomic.Int64
		var firstErr atomic.Value
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					code, model := aliasChat(routers[(w+i)%2], "prod", "")
					sent.Add(1)
					if code != http.StatusOK {
						failed.Add(1)
						firstErr.CompareAndSwap(nil, fmt.Sprintf("%d %s", code, model))
					}
				}
			}()
		}
		// A prober per router: the first answer from next after the commit.
		type probe struct {
			seen time.Time
			done chan struct{}
		}
		probes := make([]*probe, len(routers))
		before := time.Now()
		for i, addr := range routers {
			p := &probe{done: make(chan struct{})}
			probes[i] = p
			go func() {
				defer close(p.done)
				deadline := time.Now().Add(within(20 * time.Second))
				for time.Now().Before(deadline) {
					at := time.Now()
					if code, model := aliasChat(addr, "prod", ""); code == http.StatusOK && model == "next" && at.After(before) {
						p.seen = at
						return
					}
				}
			}()
		}
		if !eventually(10*time.Second, func() bool { return sent.Load() >= 100 }) {
			t.Fatal("no load before the cut")
		}
		start := time.Now()
		before = start
		took := applyAlias("name: prod\ntargets:\n  - {target: next, weight: 1}\nfallbacks: [canary]\n")
		for i, p := range probes {
			<-p.done
			if p.seen.IsZero() {
				t.Fatalf("router %s never served next after the cut", routers[i])
			}
			lag := p.seen.Sub(start)
			t.Logf("router %s serves next %v after llmgwctl alias apply started (the apply took %v; %v after it returned)",
				routers[i], lag.Round(time.Millisecond), took.Round(time.Millisecond), (lag - took).Round(time.Millisecond))
			if lag > within(time.Second)+took {
				t.Errorf("router %s took %v to follow the cut, want ≤ 1 s after the commit", routers[i], lag)
			}
		}
		// More load on the new target, then stop.
		base := sent.Load()
		eventually(10*time.Second, func() bool { return sent.Load() >= base+200 })
		close(stop)
		wg.Wait()
		t.Logf("cut over under load: %d requests, %d failed", sent.Load(), failed.Load())
		if failed.Load() > 0 {
			t.Fatalf("%d of %d requests failed during the cut; first: %v", failed.Load(), sent.Load(), firstErr.Load())
		}
	})

	t.Run("every replica of the primary killed", func(t *testing.T) {
		victims := d.modelReplicas("next")
		if len(victims) != 2 || !victims[0].ready() || !victims[1].ready() {
			t.Fatalf("next's replicas %+v, want 2 ready", victims)
		}
		var mu sync.Mutex
		counts := map[string]int{}
		var sent, failed atomic.Int64
		var firstErr atomic.Value
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					code, model := aliasChat(routers[(w+i)%2], "prod", "")
					sent.Add(1)
					if code != http.StatusOK {
						failed.Add(1)
						firstErr.CompareAndSwap(nil, fmt.Sprintf("%d %s", code, model))
						continue
					}
					mu.Lock()
					counts[model]++
					mu.Unlock()
				}
			}()
		}
		if !eventually(10*time.Second, func() bool { return sent.Load() >= 100 }) {
			t.Fatal("no load before the kill")
		}
		// Every engine of next is killed, and killed again as the agent
		// restarts it, for killFor: the primary stays down that long.
		const killFor = 3 * time.Second
		killedAt := time.Now()
		killed := map[int]bool{}
		for time.Since(killedAt) < killFor {
			list, err := d.replicas()
			if err != nil {
				continue
			}
			for _, r := range list {
				if r.Replica.Model == "next" && r.Status != nil && r.Status.PID > 0 && !killed[r.Status.PID] && alive(r.Status.PID) {
					if err := syscall.Kill(r.Status.PID, syscall.SIGKILL); err == nil {
						killed[r.Status.PID] = true
					}
				}
			}
			time.Sleep(20 * time.Millisecond) // pacing the replica list
		}
		// Until the agent has both back and next serves again.
		back := eventually(60*time.Second, func() bool {
			n := 0
			for _, r := range d.modelReplicas("next") {
				if r.ready() && !killed[r.Status.PID] {
					n++
				}
			}
			return n == len(victims)
		})
		mu.Lock()
		nextBefore := counts["next"]
		mu.Unlock()
		served := back && eventually(10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return counts["next"] > nextBefore+20 })
		close(stop)
		wg.Wait()
		if !back || !served {
			t.Fatalf("next not back and serving within %v (back %v)", within(70*time.Second), back)
		}
		rate := 100 * float64(failed.Load()) / float64(sent.Load())
		fallbacks := 0.0
		reasons := map[string]float64{}
		for _, addr := range []string{d.ops, r2.ops} {
			for _, reason := range []string{"no_replica", "overloaded", "upstream_error", "unavailable", "rate_limited", "context_length", "unknown_target", "resolve_failed"} {
				n := testkit.MustScrape(t, addr, "llmgw_router_alias_fallbacks_total", testkit.Labels{"alias": "prod", "target": "next", "reason": reason})
				if n > 0 {
					reasons[reason] += n
					fallbacks += n
				}
			}
		}
		t.Logf("every replica of next killed (%d engines, %v): %d requests over %v until it served again, %d failed (%.3f %%), canary served %d; fallbacks off next %v",
			len(killed), killFor, sent.Load(), time.Since(killedAt).Round(time.Millisecond), failed.Load(), rate, counts["canary"], reasons)
		if rate >= 0.1 {
			t.Fatalf("%.3f %% of requests failed while next was down, want < 0.1 %%; first: %v", rate, firstErr.Load())
		}
		if counts["canary"] == 0 || fallbacks == 0 {
			t.Fatalf("the fallback served %d requests (%v fallbacks counted): the kill was not exercised", counts["canary"], fallbacks)
		}
	})

	t.Run("listed in /v1/models", func(t *testing.T) {
		for _, addr := range routers {
			resp, err := http.Get("http://" + addr + "/v1/models/prod")
			if err != nil {
				t.Fatal(err)
			}
			var card struct{ ID, Object, OwnedBy, Root string }
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &card) != nil || card.ID != "prod" || card.Root != "next" {
				t.Fatalf("%s /v1/models/prod: %d %s", addr, resp.StatusCode, b)
			}
		}
		if out, err := d.ctl("alias", "delete", "prod"); err != nil {
			t.Fatalf("alias delete: %v %s", err, out)
		}
		for _, addr := range routers {
			if !eventually(10*time.Second, func() bool { c, _ := aliasChat(addr, "prod", ""); return c == http.StatusNotFound }) {
				t.Fatalf("router %s still serves the deleted alias", addr)
			}
		}
	})
}

// aliasChat sends one small chat for model through addr, with session as
// X-Session-ID when set, and returns the status and the answer's `model`
// (the error body on a refusal).
func aliasChat(addr, model, session string) (int, string) {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"ping"}],"max_tokens":2}`, model)
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	if session != "" {
		req.Header.Set("X-Session-ID", session)
	}
	resp, err := chatClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<10))
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, string(b)
	}
	var answer struct{ Model string }
	if err := json.Unmarshal(b, &answer); err != nil {
		return 0, string(b)
	}
	return resp.StatusCode, answer.Model
}

// aliasLoad sends n chats for prod over routers from workers goroutines
// and counts the answers by the model that served them.
func aliasLoad(routers []string, n, workers int, session func(int) string) (map[string]int, int, time.Duration) {
	var next atomic.Int64
	var mu sync.Mutex
	counts := map[string]int{}
	failed := 0
	start := time.Now()
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				code, model := aliasChat(routers[i%len(routers)], "prod", session(i))
				mu.Lock()
				if code == http.StatusOK {
					counts[model]++
				} else {
					failed++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return counts, failed, time.Since(start)
}
