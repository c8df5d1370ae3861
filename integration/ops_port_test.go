package integration

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/mtls"
)

// opsGet is GET url with client: status and body, or the error (a refused
// handshake).
func opsGet(client *http.Client, url string) (int, string, error) {
	resp, err := client.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b), nil
}

// opsClient is an HTTPS client of a router's operations port presenting
// src's certificate (none when src is nil, trusting p's CA), and checking
// that the port's certificate is a router's of src's CA.
func opsClient(t *testing.T, p *testPKI, src *mtls.Source) *http.Client {
	t.Helper()
	var cfg *tls.Config
	if src != nil {
		cfg = src.ClientConfig(mtls.RoleRouter)
	} else {
		cfg = p.source(mtls.RoleAdmin, "ops").ClientConfig(mtls.RoleRouter)
		cfg.GetClientCertificate = nil // nothing to present
	}
	tr := &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: within(10 * time.Second)}
}

// TestOpsPort (issue 26 part 4) runs a control server, an agent and a
// router on mutual TLS, the router's operations port on every interface
// (allowed with TLS, refused without it), and a model with KV events, so
// the router's index holds what its prompts hash to:
//   - the API port answers 404 for /metrics, /sd/replicas, /debug/kvindex
//     (with and without ?replica=) and /debug/pprof/;
//   - the operations port answers no plain-text request, no certificate,
//     another CA's admin, a router's or an agent's certificate;
//   - a scraper certificate reads /metrics, /sd/replicas and the index's
//     summary, and gets 403 for the index's hashes and the profiles; a
//     control server's reads /metrics (the web console's); an admin reads
//     the hashes and the profiles;
//   - a real Prometheus holding the scraper certificate, configured as
//     deploy/prometheus is, scrapes the router and the engine the router
//     lists at /sd/replicas: every target up.
func TestOpsPort(t *testing.T) {
	requireClusterTLS(t)
	p := newPKI(t)
	c1 := startSingleTLS(t, p)
	ctl := c1.ctl // as p's admin
	file := filepath.Join(t.TempDir(), "kvo.yaml")
	writeFile(t, file, kvModelYAML("kvo", 1))
	if err := eventuallyErr(30*time.Second, func() error { _, err := ctl("model", "apply", "-f", file); return err }); err != nil {
		t.Fatalf("model apply over TLS: %v\n%s", err, tail(c1.output(), 20))
	}
	agent := startAgentProc(t, "n1", []string{c1.grpc}, p.flags(mtls.RoleAgent, "n1")...)
	wild := wildcard(t)
	router := startRouterWith(t, "r1", []string{c1.grpc}, append(p.flags(mtls.RoleRouter, "r1"), "--ops-addr", wild, "--pprof")...)
	if !eventually(90*time.Second, func() bool { code, _ := chat(router.http, "kvo"); return code == http.StatusOK }) {
		code, body := chat(router.http, "kvo")
		t.Fatalf("no chat served over TLS within %v: %d %s\nagent:\n%s\nrouter:\n%s", within(90*time.Second), code, body,
			tail(agent.output(), 20), tail(router.output(), 20))
	}
	out, err := ctl("replica", "list", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var rep replicaView
	for _, r := range decodeReplicas(t, out) {
		if r.Replica.Model == "kvo" && r.ready() {
			rep = r
		}
	}
	if rep.Replica.ID == "" {
		t.Fatalf("no ready replica of kvo: %s", out)
	}
	ops := "https://" + viaLoopback(router.ops)
	hashesPath := "/debug/kvindex?replica=" + rep.Replica.ID
	adminClient := opsClient(t, p, p.source(mtls.RoleAdmin, "ops"))
	// Traffic until the index holds the replica's blocks (an admin sees them).
	if !eventually(30*time.Second, func() bool {
		kvTraffic(t, router.http, "kvo", 4, 0)
		code, body, err := opsGet(adminClient, ops+hashesPath)
		var view kvIndexView
		return err == nil && code == 200 && json.Unmarshal([]byte(body), &view) == nil && len(view.Hashes) > 0
	}) {
		code, body, err := opsGet(adminClient, ops+hashesPath)
		t.Fatalf("the admin never read %s's hashes within %v: %d %.300s %v", rep.Replica.ID, within(30*time.Second), code, body, err)
	}

	paths := []string{"/metrics", "/sd/replicas", "/debug/kvindex", hashesPath, "/debug/pprof/"}
	t.Run("the API port has none of them", func(t *testing.T) {
		for _, path := range paths {
			code, body, err := opsGet(chatClient, "http://"+router.http+path)
			if err != nil || code != http.StatusNotFound {
				t.Errorf("API port %s: %d %.200s (%v), want 404", path, code, body, err)
			}
		}
	})

	t.Run("strangers get no answer", func(t *testing.T) {
		if code, body, err := opsGet(chatClient, "http://"+viaLoopback(router.ops)+"/metrics"); err == nil && code == 200 {
			t.Errorf("plain HTTP read /metrics: %.200s", body)
		}
		for name, src := range map[string]*mtls.Source{
			"no certificate":     nil,
			"another CA's admin": newPKI(t).source(mtls.RoleAdmin, "ops"),
			"a router":           p.source(mtls.RoleRouter, "r2"),
			"an agent":           p.source(mtls.RoleAgent, "n1"),
		} {
			if code, body, err := opsGet(opsClient(t, p, src), ops+"/metrics"); err == nil {
				t.Errorf("%s: /metrics answered %d %.200s, want a refused handshake", name, code, body)
			}
		}
	})

	t.Run("a scraper reads metrics and lists, never hashes", func(t *testing.T) {
		scraper := opsClient(t, p, p.source(mtls.RoleScraper, "prom"))
		for _, tt := range []struct {
			path, has, hasNot string
			want              int
		}{
			{"/metrics", "llmgw_router_requests_total", "", 200},
			{"/sd/replicas", rep.Status.Address, "", 200},
			{"/debug/kvindex", rep.Replica.ID, "hashes", 200},
			{hashesPath, "needs an admin certificate", "", 403},
			{"/debug/pprof/", "needs an admin certificate", "", 403},
		} {
			code, body, err := opsGet(scraper, ops+tt.path)
			if err != nil || code != tt.want || !strings.Contains(body, tt.has) || (tt.hasNot != "" && strings.Contains(body, tt.hasNot)) {
				t.Errorf("scraper %s: %d %.300s (%v); want %d with %q and without %q", tt.path, code, body, err, tt.want, tt.has, tt.hasNot)
			}
		}
		server := opsClient(t, p, p.source(mtls.RoleServer, "c1"))
		if code, _, err := opsGet(server, ops+"/metrics"); err != nil || code != 200 {
			t.Errorf("control server /metrics: %d (%v), want 200 (the web console reads it)", code, err)
		}
		if code, _, err := opsGet(adminClient, ops+"/debug/pprof/"); err != nil || code != 200 {
			t.Errorf("admin /debug/pprof/: %d (%v), want 200", code, err)
		}
	})

	t.Run("prometheus scrapes the router and its engines", func(t *testing.T) {
		scraper := p.files(mtls.RoleScraper, "prom")
		tlsConfig := fmt.Sprintf("\n      ca_file: %q\n      cert_file: %q\n      key_file: %q\n      server_name: router.llmgw",
			scraper.CA, scraper.Cert, scraper.Key)
		prom := startPrometheusWith(t, fmt.Sprintf(`  - job_name: llmgw-router
    scheme: https
    tls_config:%[1]s
    static_configs:
      - targets: [%[2]q]
  - job_name: llmgw-engine
    http_sd_configs:
      - url: %[3]q
        refresh_interval: 1s
        tls_config:%[4]s
`, tlsConfig, viaLoopback(router.ops), ops+"/sd/replicas", strings.ReplaceAll(tlsConfig, "\n      ", "\n          ")))
		var health map[string]string
		if !eventually(30*time.Second, func() bool {
			health, _ = prom.targetHealth()
			return health["llmgw-router "+viaLoopback(router.ops)] == "up" && health["llmgw-engine "+rep.Status.Address] == "up"
		}) {
			t.Fatalf("targets %v within %v, want the router's operations port and engine %s up", health, within(30*time.Second), rep.Status.Address)
		}
		t.Logf("prometheus targets: %v", health)
	})

	t.Run("beyond loopback only with TLS", func(t *testing.T) {
		wild := wildcard(t)
		out, err := runToExit(t, 20*time.Second, routerArgs(t, freeAddr(t), "--ops-addr", wild, "--insecure")...)
		if want := "--ops-addr (ops_addr): " + wild + ": the operations port"; err == nil || !strings.Contains(out, want) || !strings.Contains(out, "--tls-ca") {
			t.Fatalf("exit %v, output:\n%s\nwant a refusal containing %q that names --tls-ca", err, tail(out, 10), want)
		}
	})
}
