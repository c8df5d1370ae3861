package controlplane

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/controlplane/console"
	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/mtls/mtlstest"
	"github.com/llmgw/llmgw/internal/testkit"
)

// TestConsoleOverTLS: a node with mutual TLS serves its console over HTTPS
// on the HTTP port to an admin certificate, reading AdminService from its
// own listener with its server certificate; plain HTTP there still serves
// /metrics, and the console refuses it and other roles.
func TestConsoleOverTLS(t *testing.T) {
	ca := mtlstest.New(t)
	cfg := testConfig(t, filepath.Join(t.TempDir(), "c1"), freeAddr(t))
	cfg.TLS = ca.Files(mtls.RoleServer, "c1")
	r := start(t, cfg)
	defer r.stop(t)
	addr := r.srv.HTTPAddr()

	client := func(src *mtls.Source) *http.Client {
		tr := &http.Transport{}
		if src != nil {
			tr.TLSClientConfig = src.ClientConfig(mtls.RoleServer)
		}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr, Timeout: 10 * time.Second}
	}
	get := func(c *http.Client, url string) (int, string) {
		t.Helper()
		resp, err := c.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	code, body := get(client(ca.Source(mtls.RoleAdmin, "ops")), "https://"+addr+"/ui/api/cluster")
	if code != http.StatusOK {
		t.Fatalf("admin: %d %s", code, body)
	}
	var page struct {
		Status struct {
			ServerID string `json:"server_id"`
			Leader   string `json:"leader"`
		} `json:"status"`
		Errors map[string]string `json:"errors"`
	}
	if err := json.Unmarshal([]byte(body), &page); err != nil {
		t.Fatal(err)
	}
	if page.Status.ServerID != "c1" || page.Status.Leader != "c1" || len(page.Errors) != 0 {
		t.Fatalf("cluster page over TLS: %s", body)
	}
	if code, body := get(client(ca.Source(mtls.RoleRouter, "r1")), "https://"+addr+"/ui/"); code != http.StatusForbidden || !strings.Contains(body, "caller is router/r1") {
		t.Fatalf("router: %d %s", code, body)
	}
	if code, body := get(client(nil), "http://"+addr+"/ui/"); code != http.StatusForbidden {
		t.Fatalf("plain console: %d %s", code, body)
	}
	if code, body := get(client(nil), "http://"+addr+"/metrics"); code != http.StatusOK || !strings.Contains(body, "llmgw_control_raft_is_leader 1") {
		t.Fatalf("plain /metrics: %d", code)
	}
}

// TestConsoleReadsTLSRouterOps: under mutual TLS a router's operations
// port admits admin, scraper and server certificates only; the console's
// router sampler presents this server's and reads the router's counters,
// where a client without a certificate is refused.
func TestConsoleReadsTLSRouterOps(t *testing.T) {
	ca := mtlstest.New(t)
	router := ca.Source(mtls.RoleRouter, "r1")
	ops := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "# TYPE llmgw_prefix_decisions_total counter\nllmgw_prefix_decisions_total{decision=\"owner\"} 7\n")
	}))
	ops.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused plain client below
	ops.TLS = router.ServerConfig(mtls.RoleAdmin, mtls.RoleScraper, mtls.RoleServer)
	ops.StartTLS()
	defer ops.Close()

	cfg := testConfig(t, filepath.Join(t.TempDir(), "c1"), freeAddr(t))
	cfg.TLS = ca.Files(mtls.RoleServer, "c1")
	cfg.ConsoleRouters = []string{ops.URL}
	r := start(t, cfg)
	defer r.stop(t)

	admin := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: ca.Source(mtls.RoleAdmin, "ops").ClientConfig(mtls.RoleServer)}}
	testkit.WaitErr(t, 20*time.Second, "the console's routers page reading the TLS router", func() error {
		resp, err := admin.Get("https://" + r.srv.HTTPAddr() + "/ui/api/routers")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var page struct{ Routers console.RoutersView }
		if err := json.NewDecoder(resp.Body).Decode(&page); err != nil {
			return fmt.Errorf("%s: %w", resp.Status, err)
		}
		v := page.Routers
		if len(v.Routers) != 1 || v.Routers[0].Error != "" || len(v.Routers[0].Tiers) == 0 {
			return fmt.Errorf("routers %+v", v.Routers)
		}
		for _, tier := range v.Routers[0].Tiers {
			for _, d := range tier.Decisions {
				if d.Decision == "owner" && d.Total == 7 {
					return nil
				}
			}
		}
		return fmt.Errorf("tiers %+v", v.Routers[0].Tiers)
	})

	// Without a certificate the same port refuses: the check above could fail.
	plain := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	if resp, err := plain.Get(ops.URL + "/metrics"); err == nil {
		resp.Body.Close()
		t.Fatalf("a client without a certificate read the router: %s", resp.Status)
	}
}
