package integration

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestAPIKeys (issue #12, design §11) runs `llmgw dev` and a second router
// process on its control plane. Its engines are this test binary run as a
// stand-in engine (headerEngineMain) that records the headers it gets:
//   - before any key exists, requests need none;
//   - once a key exists, a request without one is 401 with OpenAI's error
//     body on both routers, a valid key is 200, a key limited to other
//     models is 403;
//   - the engine never sees the client's Authorization or Cookie;
//   - `apikey list` shows names and models, no secret and no hash;
//   - a revoked key is 401 on both routers within 1 s of the revoke
//     (measured and printed), while another key still works.
func TestAPIKeys(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	seen := t.TempDir()
	t.Setenv(envHeaderEngine, seen) // dev's agent passes its environment on to engines
	d := startDev(t, "--sim-command", self)
	r2 := startRouterWith(t, "r2", []string{d.grpc})
	routers := map[string]string{"dev-router": d.http, "r2": r2.http}
	applyModel(t, d.grpc, "side", 1)
	for name, addr := range routers {
		for _, m := range []string{"demo", "side"} {
			var code int
			var body string
			if !eventually(60*time.Second, func() bool { code, body = chatAs(addr, m, ""); return code == http.StatusOK }) {
				t.Fatalf("router %s does not serve %s without a key before any key exists: last %d %s", name, m, code, body)
			}
		}
	}

	ops := createKey(t, d.grpc, "ops")
	team := createKey(t, d.grpc, "team", "--models", "demo")

	t.Run("no key is 401, a valid key 200, another model 403", func(t *testing.T) {
		for name, addr := range routers {
			var code int
			var body string
			if !eventually(10*time.Second, func() bool { code, body = chatAs(addr, "demo", ""); return code == http.StatusUnauthorized }) {
				t.Fatalf("router %s: no key gives %d %s, want 401", name, code, body)
			}
			// The first key turns the check on; the second may reach
			// the router a moment later (seen on a loaded machine).
			if !eventually(10*time.Second, func() bool { c, _ := chatAs(addr, "demo", team); return c != http.StatusUnauthorized }) {
				t.Fatalf("router %s: key team not in force within %v", name, within(10*time.Second))
			}
			var e struct {
				Error struct{ Message, Type, Code string } `json:"error"`
			}
			if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Type != "invalid_request_error" || e.Error.Code != "invalid_api_key" {
				t.Errorf("router %s: 401 body %s is not OpenAI's invalid_api_key", name, body)
			}
			if code, body := chatAs(addr, "demo", "sk-llmgw-not-a-key"); code != http.StatusUnauthorized {
				t.Errorf("router %s: a wrong key gives %d %s, want 401", name, code, body)
			}
			if code, body := chatAs(addr, "demo", ops); code != http.StatusOK {
				t.Errorf("router %s: key ops gives %d %s, want 200", name, code, body)
			}
			if code, body := chatAs(addr, "demo", team); code != http.StatusOK {
				t.Errorf("router %s: key team on demo gives %d %s, want 200", name, code, body)
			}
			if code, body := chatAs(addr, "side", team); code != http.StatusForbidden {
				t.Errorf("router %s: key team on side gives %d %s, want 403", name, code, body)
			}
		}
	})

	t.Run("the engine never sees the client's Authorization", func(t *testing.T) {
		for name, addr := range routers {
			req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions",
				strings.NewReader(`{"model":"demo","messages":[{"role":"user","content":"hi"}]}`))
			req.Header.Set("Authorization", "Bearer "+team)
			req.Header.Set("Cookie", "session=client-cookie")
			req.Header.Set("X-Marker", name)
			resp, err := chatClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("router %s: %d", name, resp.StatusCode)
			}
		}
		all := seenHeaders(t, seen)
		marked := 0
		for _, h := range all {
			if h.Get("X-Marker") != "" {
				marked++
			}
			if a, c := h.Get("Authorization"), h.Get("Cookie"); a != "" || c != "" {
				t.Errorf("engine saw Authorization %q, Cookie %q", a, c)
			}
			if strings.Contains(fmt.Sprint(h), "sk-llmgw-") {
				t.Fatalf("an API key reached the engine: %v", h)
			}
		}
		if marked != len(routers) {
			t.Fatalf("engines recorded %d of the %d marked requests (of %d in all)", marked, len(routers), len(all))
		}
	})

	t.Run("apikey list shows no secret", func(t *testing.T) {
		table, err := ctlAt(d.grpc, "apikey", "list")
		if err != nil {
			t.Fatal(err)
		}
		js, err := ctlAt(d.grpc, "apikey", "list", "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"ops", "team", "demo", "every model"} {
			if !strings.Contains(table, want) {
				t.Errorf("apikey list lacks %q:\n%s", want, table)
			}
		}
		for _, secret := range []string{ops, team} {
			h := sha256.Sum256([]byte(secret))
			for _, leak := range []string{secret, strings.TrimPrefix(secret, "sk-llmgw-"), hex.EncodeToString(h[:]), base64.StdEncoding.EncodeToString(h[:])} {
				if strings.Contains(table, leak) || strings.Contains(js, leak) {
					t.Fatalf("apikey list shows a secret or its hash:\n%s\n%s", table, js)
				}
			}
		}
	})

	t.Run("a revoked key is refused by every router within 1 s", func(t *testing.T) {
		a, closeConn := admin(t, d.grpc)
		defer closeConn()
		ctx, cancel := context.WithTimeout(context.Background(), within(30*time.Second))
		defer cancel()
		// Each router is polled without pause from just before the revoke;
		// the first 401 for the key is when that router honoured it.
		var wg sync.WaitGroup
		refusedAt := map[string]time.Time{}
		var mu sync.Mutex
		start := make(chan struct{})
		for name, addr := range routers {
			wg.Go(func() {
				<-start
				for ctx.Err() == nil {
					if code, _ := chatAs(addr, "demo", ops); code == http.StatusUnauthorized {
						mu.Lock()
						refusedAt[name] = time.Now()
						mu.Unlock()
						return
					}
				}
			})
		}
		close(start)
		revoked := time.Now()
		if _, err := a.RevokeApiKey(ctx, &llmgwv1.RevokeApiKeyRequest{Name: "ops"}); err != nil {
			cancel()
			wg.Wait()
			t.Fatal(err)
		}
		committed := time.Since(revoked)
		wg.Wait()
		var worst time.Duration
		for name := range routers {
			at, ok := refusedAt[name]
			if !ok {
				t.Fatalf("router %s never refused the revoked key", name)
			}
			took := at.Sub(revoked)
			worst = max(worst, took)
			t.Logf("router %s refused the revoked key %v after the revoke was sent", name, took.Round(time.Millisecond))
		}
		t.Logf("revocation: committed in %v; honoured by every router within %v of the revoke", committed.Round(time.Millisecond), worst.Round(time.Millisecond))
		if limit := within(time.Second); worst > limit {
			t.Errorf("the revocation took %v to reach every router, want <= %v", worst, limit)
		}
		for name, addr := range routers {
			if code, body := chatAs(addr, "demo", team); code != http.StatusOK {
				t.Errorf("router %s: key team after revoking ops gives %d %s, want 200", name, code, body)
			}
		}
	})

	t.Run("requests are counted by key name", func(t *testing.T) {
		for name, addr := range map[string]string{"dev-router": d.ops, "r2": r2.ops} { // the operations ports
			if n, ok := testkit.Scrape(addr, "llmgw_router_requests_total", testkit.Labels{"code": "200", "key": "team", "model": "demo"}); !ok || n < 1 {
				t.Errorf("router %s: no 200 counted for key team (%v, %v)", name, n, ok)
			}
			if n, ok := testkit.Scrape(addr, "llmgw_router_requests_total", testkit.Labels{"code": "401", "key": "", "model": "_unknown"}); !ok || n < 1 {
				t.Errorf("router %s: no anonymous 401 counted (%v, %v)", name, n, ok)
			}
		}
	})
}

// createKey runs `llmgwctl apikey create` and returns the secret it printed.
func createKey(t *testing.T, addr, name string, flags ...string) string {
	t.Helper()
	out, err := ctlAt(addr, append([]string{"apikey", "create", name, "-o", "json"}, flags...)...)
	if err != nil {
		t.Fatal(err)
	}
	var k struct{ Secret string }
	if err := json.Unmarshal([]byte(out), &k); err != nil || !strings.HasPrefix(k.Secret, "sk-llmgw-") {
		t.Fatalf("apikey create %s printed %q (%v)", name, out, err)
	}
	return k.Secret
}

// chatAs sends a small chat for model with secret as its Bearer key (none
// when empty).
func chatAs(addr, model, secret string) (int, string) {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"ping"}],"max_tokens":4}`, model)
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+secret)
	}
	resp, err := chatClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	return resp.StatusCode, string(b)
}

// envHeaderEngine, set to a directory, turns this test binary into a
// stand-in engine (see init): what the agent's sim driver runs with
// `llmgw dev --sim-command <this binary>`.
const envHeaderEngine = "LLMGW_TEST_HEADER_ENGINE"

// init runs before TestMain: a process started as an engine serves as one
// and exits, never reaching the tests.
func init() {
	if dir := os.Getenv(envHeaderEngine); dir != "" {
		os.Exit(headerEngineMain(dir, os.Args[1:]))
	}
}

// headerEngineMain is a stand-in engine for vLLM's flags: it serves
// /health, vLLM's load gauges and completions on --host and --port, and
// appends the headers of every completion request it gets to a file of
// its own in dir, one JSON object a line. It runs until killed.
func headerEngineMain(dir string, args []string) int {
	// The driver writes every option as --name=value (design §6), so a
	// value can never be read as an option; the older --name value form
	// is read too.
	var host, port string
	for i, a := range args {
		name, value, inline := strings.Cut(a, "=")
		if !inline && i+1 < len(args) {
			value = args[i+1]
		}
		switch name {
		case "--host":
			host = value
		case "--port":
			port = value
		}
	}
	rec, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("engine-%d.jsonl", os.Getpid())), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, "header engine:", err)
		return 1
	}
	var mu sync.Mutex
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0\n")
	})
	complete := func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		line, _ := json.Marshal(r.Header)
		mu.Lock()
		_, _ = rec.Write(append(line, '\n'))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"chat.completion","model":"demo","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}
	mux.HandleFunc("POST /v1/chat/completions", complete)
	mux.HandleFunc("POST /v1/completions", complete)
	srv := &http.Server{Addr: net.JoinHostPort(host, port), Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintln(os.Stderr, "header engine:", srv.ListenAndServe())
	return 1
}

// seenHeaders reads what every stand-in engine recorded in dir.
func seenHeaders(t *testing.T, dir string) []http.Header {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "engine-*.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var out []http.Header
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if line == "" {
				continue
			}
			var h http.Header
			if err := json.Unmarshal([]byte(line), &h); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			out = append(out, h)
		}
	}
	return out
}

// TestAPIKeyRevocationAcrossServers: with three control servers, two
// routers watching different ones (so at least one follows a follower's
// FSM), a revoked key is refused by both within 1 s of the revoke, through
// llmgwctl as an operator runs it; the figure is logged.
func TestAPIKeyRevocationAcrossServers(t *testing.T) {
	f := startFailoverSetup(t)
	addr := f.c.servers[0].grpc
	gone := createKey(t, addr, "gone")
	kept := createKey(t, addr, "kept")
	for _, r := range f.routers {
		if !eventually(10*time.Second, func() bool { code, _ := chatAs(r.http, "chat", gone); return code == http.StatusOK }) {
			t.Fatalf("router %s does not serve key gone", r.id)
		}
		// The first key turns keys required on; a router serves a keyless
		// request until that reaches it, which may be after the key itself
		// has (a router that requires nothing serves any key).
		var code int
		var body string
		if !eventually(10*time.Second, func() bool { code, body = chatAs(r.http, "chat", ""); return code == http.StatusUnauthorized }) {
			t.Fatalf("router %s: no key gives %d %s, want 401 within 10 s of the keys", r.id, code, body)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), within(30*time.Second))
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	refusedAt := map[string]time.Time{}
	for _, r := range f.routers {
		wg.Go(func() {
			for ctx.Err() == nil {
				if code, _ := chatAs(r.http, "chat", gone); code == http.StatusUnauthorized {
					mu.Lock()
					refusedAt[r.id] = time.Now()
					mu.Unlock()
					return
				}
			}
		})
	}
	revoked := time.Now()
	_, err := ctlAt(f.c.servers[2].grpc, "apikey", "revoke", "gone")
	ran := time.Since(revoked)
	if err != nil {
		cancel()
		wg.Wait()
		t.Fatal(err)
	}
	wg.Wait()
	var worst time.Duration
	for _, r := range f.routers {
		at, ok := refusedAt[r.id]
		if !ok {
			t.Fatalf("router %s never refused the revoked key", r.id)
		}
		worst = max(worst, at.Sub(revoked))
	}
	t.Logf("revocation across 3 servers: `llmgwctl apikey revoke` ran %v; every router refused the key within %v of its start", ran.Round(time.Millisecond), worst.Round(time.Millisecond))
	if limit := within(time.Second); worst > limit {
		t.Errorf("the revocation took %v to reach every router, want <= %v", worst, limit)
	}
	for _, r := range f.routers {
		if code, body := chatAs(r.http, "chat", kept); code != http.StatusOK {
			t.Errorf("router %s: the other key gives %d %s, want 200", r.id, code, body)
		}
	}
}
