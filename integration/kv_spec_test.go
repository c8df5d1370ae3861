package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
)

// TestKVRouterSpeculation (issue 14, design §7.5 step 6): a router that
// sent a prompt counts its blocks as held on that replica at once, before
// the engine's events come back. Two models on one router, alike but for
// profile_overrides.speculation: a prompt sent while the same prompt's
// first request is still in prefill (so no event can have confirmed it) is
// a tier-2 hit, and a speculative one, with speculation on, and a miss with
// it off. The pending entries are then confirmed by the events, and none is
// left pending.
func TestKVRouterSpeculation(t *testing.T) {
	d := startDev(t, "--port-range", freePortRange(t, 40)) // 6 engines of up to 3 ports
	for _, m := range []struct{ name, overrides string }{
		{"kvs", ""},
		{"kvn", "profile_overrides: {speculation: false}\n"},
	} {
		file := filepath.Join(t.TempDir(), m.name+".yaml")
		// 2 ms of prefill a token: the first request's ~200-token prompt is
		// in prefill for ~0.4 s, longer than it takes to send the second.
		writeFile(t, file, kvModelYAML(m.name, 2, "--sim-prefill-us-per-token", "2000")+m.overrides)
		if out, err := d.ctl("model", "apply", "-f", file); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
	}
	d.waitReady("kvs", 2, 60*time.Second)
	d.waitReady("kvn", 2, 60*time.Second)
	// A second router with a generous /tokenize budget: with the default
	// 20 ms a loaded machine falls back as tokenize_timeout before the
	// index is asked.
	r := startRouterWith(t, "rs", []string{d.grpc}, "--tokenize-budget", within(2*time.Second).String())
	waitRouterServes(t, r.http, "kvs")
	waitRouterServes(t, r.http, "kvn")
	// Tier 2 answers only once a replica reported its (empty) KV state:
	// until then requests are counted no_data.
	for _, m := range []string{"kvs", "kvn"} {
		if !eventually(20*time.Second, func() bool {
			before := kvDecisions(r.ops)
			specChat(t, r.http, m, strings.Repeat("warm up "+m+". ", 20), "hello")
			after := kvDecisions(r.ops)
			return after["hit"]+after["miss"] > before["hit"]+before["miss"]
		}) {
			t.Fatalf("model %s: tier 2 never answered (decisions %v)", m, kvDecisions(r.ops))
		}
	}

	tests := []struct {
		model    string
		decision string  // of the second request
		specHits float64 // speculative hits it adds
	}{
		{"kvs", "hit", 1},
		{"kvn", "miss", 0},
	}
	for i, tt := range tests {
		sys := strings.Repeat(fmt.Sprintf("speculation case %d: the house rules apply. ", i), 20)
		before := kvDecisions(r.ops)
		hitsBefore, _ := testkit.Scrape(r.ops, "llmgw_kv_speculative_hits_total", nil)
		recordedBefore, _ := testkit.Scrape(r.ops, "llmgw_router_kvindex_speculative_recorded_total", nil)

		first := make(chan specSend, 1)
		go func() { first <- specChat(t, r.http, tt.model, sys, "first") }()
		// The first request is in the engine once the router scheduled it
		// (its decision counted) and, with speculation, recorded its blocks.
		if !eventually(10*time.Second, func() bool {
			after := kvDecisions(r.ops)
			recorded, _ := testkit.Scrape(r.ops, "llmgw_router_kvindex_speculative_recorded_total", nil)
			return after["hit"]+after["miss"]+after["load_override"] > before["hit"]+before["miss"]+before["load_override"] &&
				(tt.specHits == 0 || recorded > recordedBefore)
		}) {
			t.Fatalf("%s: the first request was never scheduled (decisions %v)", tt.model, kvDecisions(r.ops))
		}
		mid := kvDecisions(r.ops)
		second := specChat(t, r.http, tt.model, sys, "second")
		a := <-first
		after := kvDecisions(r.ops)
		if got := after[tt.decision] - mid[tt.decision]; got != 1 {
			t.Errorf("%s: the second request's decision: %s rose by %v, want 1 (before %v, after %v)", tt.model, tt.decision, got, mid, after)
		}
		if a.cached != 0 {
			t.Errorf("%s: the first request found %d cached tokens; the prompt was meant to be new", tt.model, a.cached)
		}
		hits, _ := testkit.Scrape(r.ops, "llmgw_kv_speculative_hits_total", nil)
		if got := hits - hitsBefore; got != tt.specHits {
			t.Errorf("%s: speculative hits rose by %v, want %v", tt.model, got, tt.specHits)
		}
		recorded, _ := testkit.Scrape(r.ops, "llmgw_router_kvindex_speculative_recorded_total", nil)
		if tt.specHits > 0 {
			if recorded <= recordedBefore {
				t.Errorf("%s: no speculative entry recorded", tt.model)
			}
			if second.replica != a.replica {
				t.Errorf("%s: the speculative hit went to %s, the first request to %s", tt.model, second.replica, a.replica)
			}
		} else if recorded != recordedBefore {
			t.Errorf("%s: speculation off, yet %v entries recorded", tt.model, recorded-recordedBefore)
		}
		t.Logf("%s: first on %s, second on %s (%d cached tokens), decisions %v", tt.model, a.replica, second.replica, second.cached, after)
	}
	// The events confirm what was sent; nothing stays pending.
	if !eventually(10*time.Second, func() bool {
		pending, _ := testkit.Scrape(r.ops, "llmgw_router_kvindex_speculative_pending", nil)
		confirmed, _ := testkit.Scrape(r.ops, "llmgw_router_kvindex_speculative_confirmed_total", nil)
		return pending == 0 && confirmed > 0
	}) {
		pending, _ := testkit.Scrape(r.ops, "llmgw_router_kvindex_speculative_pending", nil)
		confirmed, _ := testkit.Scrape(r.ops, "llmgw_router_kvindex_speculative_confirmed_total", nil)
		t.Fatalf("pending %v, confirmed %v: the events did not confirm the speculative entries", pending, confirmed)
	}
	expired, _ := testkit.Scrape(r.ops, "llmgw_router_kvindex_speculative_expired_total", nil)
	confirmed, _ := testkit.Scrape(r.ops, "llmgw_router_kvindex_speculative_confirmed_total", nil)
	ttl, _ := testkit.Scrape(r.ops, "llmgw_router_kvindex_speculative_ttl_seconds", nil)
	t.Logf("speculative entries: %v confirmed, %v expired, TTL %vs", confirmed, expired, ttl)
}

// specSend is what one chat's answer said: the replica and its cached
// prompt tokens.
type specSend struct {
	replica string
	cached  int
}

func specChat(t *testing.T, addr, model, system, user string) specSend {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 2, "messages": []map[string]string{
		{"role": "system", "content": system}, {"role": "user", "content": user},
	}})
	resp, err := chatClient.Post("http://"+addr+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Errorf("chat %s: %v", model, err)
		return specSend{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("chat %s: %d %s", model, resp.StatusCode, b)
		return specSend{}
	}
	var out struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	_ = json.Unmarshal(b, &out)
	return specSend{replica: resp.Header.Get("X-Llmgw-Replica"), cached: out.Usage.Details.Cached}
}
