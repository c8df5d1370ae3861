package controlplane

import (
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/mtls/mtlstest"
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
