package router

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/mtls/mtlstest"
	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// serveOps runs a router (its control connection going nowhere) with
// cfg changed by mutate and returns its API and operations addresses.
func serveOps(t *testing.T, mutate func(*Config)) (r *Router, api, ops string) {
	t.Helper()
	c := DefaultConfig()
	c.Control = []string{control(t, "127.0.0.1:1")}
	c.OpsAddr = "127.0.0.1:0"
	mutate(&c)
	r, err := New(c, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	api = serveRouter(t, r)
	waitStatus(t, "http://"+api+"/healthz", 200)
	if r.OpsAddr() == "" {
		t.Fatal("no operations listener")
	}
	return r, api, r.OpsAddr()
}

// get is GET url's status and body with client.
func get(t *testing.T, client *http.Client, url string) (int, string, error) {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// opsPaths are the operations port's pages; the API port has none of them.
var opsPaths = []string{"/metrics", "/sd/replicas", "/debug/kvindex", "/debug/kvindex?replica=demo-0", "/debug/pprof/cmdline"}

// TestOpsPlainLoopback: without TLS the operations pages are on the
// operations port, to every (loopback) caller, and the API port answers
// 404 for each; the profiles only with --pprof.
func TestOpsPlainLoopback(t *testing.T) {
	for _, pprofOn := range []bool{false, true} {
		t.Run(fmt.Sprintf("pprof %v", pprofOn), func(t *testing.T) {
			r, api, ops := serveOps(t, func(c *Config) { c.Pprof = pprofOn })
			seedKV(t, r, 30, 10, 20)
			client := newClient(t)
			for _, p := range opsPaths {
				want := 200
				if p == "/debug/pprof/cmdline" && !pprofOn {
					want = 404
				}
				if code, body, err := get(t, client, "http://"+ops+p); err != nil || code != want {
					t.Errorf("operations port %s = %d %.200s (%v), want %d", p, code, body, err, want)
				}
				if code, body, err := get(t, client, "http://"+api+p); err != nil || code != 404 {
					t.Errorf("API port %s = %d %.200s (%v), want 404", p, code, body, err)
				}
			}
		})
	}
}

// seedKV gives the index demo-0's blocks, once the watch stream placed it
// (the router forgets KV state of replicas not placed). The blocks come
// from seedNode, not the script's n1: n1's full ephemeral update drops
// every replica n1 reported KV for, and it may land after the placement
// is visible, so blocks seeded as n1 could vanish mid-test.
const seedNode = "seed"

func seedKV(t *testing.T, r *Router, hashes ...uint64) {
	t.Helper()
	testkit.Wait(t, "the watch stream to place demo-0", func() bool { return r.watch.Current().Replicas["demo-0"] != nil })
	if err := r.kv.Apply(seedNode, &llmgwv1.KVBlocks{ReplicaId: "demo-0", Uid: 5, Incarnation: 1, Reset_: true, Stored: hashes}); err != nil {
		t.Fatal(err)
	}
}

// TestOpsTLS: with TLS the operations port speaks mutual TLS under the
// cluster's CA: no certificate, another CA's or a router's or agent's
// never gets an answer; a scraper and a control server read /metrics,
// /sd/replicas and the index's summary but no hash and no profile; an
// admin reads everything. (The router's watch cannot reach the test's
// plain-text control server, so the index is empty: an admin's ?replica=
// is a 404 for want of state, a scraper's a 403.)
func TestOpsTLS(t *testing.T) {
	ca := mtlstest.New(t)
	_, api, ops := serveOps(t, func(c *Config) {
		c.TLS = ca.Files(mtls.RoleRouter, "r1")
		c.Pprof = true
	})
	clientAs := func(src *mtls.Source) *http.Client {
		var cfg *tls.Config
		if src != nil {
			cfg = src.ClientConfig(mtls.RoleRouter)
		} else {
			cfg = ca.Source(mtls.RoleAdmin, "ops").ClientConfig(mtls.RoleRouter)
			cfg.GetClientCertificate = nil // no certificate to present
		}
		tr := &http.Transport{TLSClientConfig: cfg}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr, Timeout: 10 * time.Second}
	}
	summary := "/debug/kvindex"
	for _, tt := range []struct {
		name string
		src  *mtls.Source
		// ok are the paths answered 200; every other one is 403. nil:
		// no answer at all (the handshake fails).
		ok []string
	}{
		{"no certificate", nil, nil},
		{"another CA's admin", mtlstest.New(t).Source(mtls.RoleAdmin, "ops"), nil},
		{"a router", ca.Source(mtls.RoleRouter, "r2"), nil},
		{"an agent", ca.Source(mtls.RoleAgent, "n1"), nil},
		{"a scraper", ca.Source(mtls.RoleScraper, "prom"), []string{"/metrics", "/sd/replicas", summary}},
		{"a control server", ca.Source(mtls.RoleServer, "c1"), []string{"/metrics", "/sd/replicas", summary}},
		{"an admin", ca.Source(mtls.RoleAdmin, "ops"), opsPaths},
	} {
		t.Run(tt.name, func(t *testing.T) {
			client := clientAs(tt.src)
			for _, p := range opsPaths {
				code, body, err := get(t, client, "https://"+ops+p)
				switch {
				case tt.ok == nil:
					if err == nil {
						t.Errorf("%s answered %d %.100s, want a refused handshake", p, code, body)
					}
				case containsPath(tt.ok, p):
					want := 200
					if strings.Contains(p, "?replica=") {
						want = 404
					}
					if err != nil || code != want {
						t.Errorf("%s = %d %.100s (%v), want %d", p, code, body, err, want)
					}
				default:
					if err != nil || code != 403 || !strings.Contains(body, "needs an admin certificate") {
						t.Errorf("%s = %d %.100s (%v), want 403 naming the admin certificate", p, code, body, err)
					}
				}
			}
		})
	}
	t.Run("plain HTTP", func(t *testing.T) {
		if code, _, err := get(t, newClient(t), "http://"+ops+"/metrics"); err == nil && code == 200 {
			t.Fatal("the TLS operations port served /metrics over plain HTTP")
		}
	})
	t.Run("the API port", func(t *testing.T) {
		for _, p := range opsPaths {
			if code, _, err := get(t, newClient(t), "http://"+api+p); err != nil || code != 404 {
				t.Errorf("API port %s = %d (%v), want 404", p, code, err)
			}
		}
	})
}

func containsPath(list []string, p string) bool {
	for _, x := range list {
		if x == p {
			return true
		}
	}
	return false
}

// TestDebugKVIndexPaged: the index's listing is paged, each page bounded
// whatever the replica holds, and the pages together are every hash once,
// in order.
func TestDebugKVIndexPaged(t *testing.T) {
	r, _, ops := serveOps(t, func(*Config) {})
	const n = 25_000
	hashes := make([]uint64, n)
	for i := range hashes {
		hashes[i] = uint64(n-i) * 7919 // every one distinct, none zero, not in order
	}
	seedKV(t, r, hashes...)
	client := newClient(t)
	var got []uint64
	after := ""
	pages := 0
	for {
		resp, err := client.Get("http://" + ops + "/debug/kvindex?replica=demo-0" + after)
		if err != nil {
			t.Fatal(err)
		}
		var page struct {
			Blocks int
			Hashes []uint64 `json:"hashes"`
			Next   *uint64  `json:"next"`
		}
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("page %d: %d %v", pages, resp.StatusCode, err)
		}
		if len(page.Hashes) > maxDebugHashes || page.Blocks != n {
			t.Fatalf("page %d: %d hashes (at most %d), blocks %d (want %d)", pages, len(page.Hashes), maxDebugHashes, page.Blocks, n)
		}
		got = append(got, page.Hashes...)
		pages++
		if page.Next == nil {
			break
		}
		after = fmt.Sprintf("&after=%d", *page.Next)
	}
	if pages != 3 || len(got) != n {
		t.Fatalf("%d pages of %d hashes in all, want 3 pages of %d", pages, len(got), n)
	}
	for i := 1; i < len(got); i++ {
		if got[i] <= got[i-1] {
			t.Fatalf("hash %d (%d) not after %d: pages overlap or are out of order", i, got[i], got[i-1])
		}
	}
	for _, bad := range []string{"&limit=0", "&limit=10001", "&after=x"} {
		if code, body, err := get(t, client, "http://"+ops+"/debug/kvindex?replica=demo-0"+bad); err != nil || code != 400 {
			t.Errorf("%s: %d %s (%v), want 400", bad, code, body, err)
		}
	}
}

// TestDebugKVIndexTiers: ?tier= lists an offload tier's hashes, paged as
// the GPU's are; an unknown tier is a 400.
func TestDebugKVIndexTiers(t *testing.T) {
	r, _, ops := serveOps(t, func(*Config) {})
	seedKV(t, r, 1, 2)
	if err := r.kv.Apply(seedNode, &llmgwv1.KVBlocks{ReplicaId: "demo-0", Uid: 5, Incarnation: 1, StoredCpu: []uint64{9, 3, 5}, StoredStorage: []uint64{7}}); err != nil {
		t.Fatal(err)
	}
	client := newClient(t)
	for _, tc := range []struct {
		query, want string
	}{
		{"", "[1 2] <nil> 4"},
		{"&tier=cpu", "[3 5 9] <nil> 4"},
		{"&tier=cpu&limit=2", "[3 5] 5 4"},
		{"&tier=cpu&after=5", "[9] <nil> 4"},
		{"&tier=storage", "[7] <nil> 4"},
	} {
		resp, err := client.Get("http://" + ops + "/debug/kvindex?replica=demo-0" + tc.query)
		if err != nil {
			t.Fatal(err)
		}
		var page struct {
			Offloaded int
			Hashes    []uint64 `json:"hashes"`
			Next      *uint64  `json:"next"`
		}
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		next := "<nil>"
		if page.Next != nil {
			next = fmt.Sprint(*page.Next)
		}
		if got := fmt.Sprint(page.Hashes, " ", next, " ", page.Offloaded); err != nil || resp.StatusCode != 200 || got != tc.want {
			t.Errorf("%s: %d %q (%v), want %q", tc.query, resp.StatusCode, got, err, tc.want)
		}
	}
	if code, body, err := get(t, client, "http://"+ops+"/debug/kvindex?replica=demo-0&tier=tape"); err != nil || code != 400 {
		t.Errorf("tier=tape: %d %s (%v), want 400", code, body, err)
	}
}
