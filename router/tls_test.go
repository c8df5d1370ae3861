package router

import (
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/mtls/mtlstest"
)

// TestNewTLSIdentity: a router's certificate must be a router's, and the
// router's id is the certificate's name.
func TestNewTLSIdentity(t *testing.T) {
	ca := mtlstest.New(t)
	tests := []struct {
		name    string
		files   mtls.Files
		id      string
		wantID  string
		wantErr string
	}{
		{"id from the certificate", ca.Files(mtls.RoleRouter, "edge-1"), "", "edge-1", ""},
		{"the same id given", ca.Files(mtls.RoleRouter, "edge-2"), "edge-2", "edge-2", ""},
		{"another id given", ca.Files(mtls.RoleRouter, "edge-3"), "edge-9", "", "--id edge-9 differs from the name in --tls-cert"},
		{"an agent's certificate", ca.Files(mtls.RoleAgent, "gpu-1"), "", "", "is the certificate of agent/gpu-1; a router needs one of role router"},
		{"an admin's certificate", ca.Files(mtls.RoleAdmin, "ops"), "", "", "a router needs one of role router"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			c.ID, c.TLS = tt.id, tt.files
			r, err := New(c, slog.New(slog.DiscardHandler))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("New = %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer r.tok.Close()
			if r.cfg.ID != tt.wantID {
				t.Fatalf("router id %q, want %q", r.cfg.ID, tt.wantID)
			}
		})
	}
}

// TestHTTPS serves the API over HTTPS (--https-cert, --https-key): a
// client trusting the certificate's CA is answered over TLS, a plain-HTTP
// request is not served, and a certificate renewed on disk is used by the
// next handshake without a restart.
func TestHTTPS(t *testing.T) {
	// Not mtlstest: the HTTPS certificate must name 127.0.0.1, an option
	// only mtls.Tree.Issue takes.
	tree := mtls.Tree(t.TempDir())
	if _, err := tree.EnsureCA(); err != nil {
		t.Fatal(err)
	}
	issue := func() mtls.Files {
		t.Helper()
		f, err := tree.Issue(mtls.Identity{Role: mtls.RoleRouter, Name: "api"}, mtls.CertOptions{IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	files := issue()
	c := DefaultConfig()
	c.Control = []string{control(t, "127.0.0.1:1")}
	c.OpsAddr = "127.0.0.1:0"
	c.HTTPSCert, c.HTTPSKey = files.Cert, files.Key
	r, err := New(c, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	var mu sync.Mutex
	r.https.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	addr := serveRouter(t, r)

	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(files.CA)
	if err != nil || !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("read CA: %v", err)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	serial := func() string {
		t.Helper()
		resp, err := client.Get("https://" + addr + "/healthz")
		if err != nil {
			t.Fatalf("GET over HTTPS: %v", err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET over HTTPS: %s", resp.Status)
		}
		return resp.TLS.PeerCertificates[0].SerialNumber.String()
	}
	first := serial()

	plain := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	if resp, err := plain.Get("http://" + addr + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("a plain-HTTP request was served by the HTTPS listener")
		}
	}

	// Renew in place: a new pair over the old files.
	issue()
	if got := serial(); got != first {
		t.Fatalf("certificate changed to %s before the next look at the files", got)
	}
	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	if got := serial(); got == first {
		t.Fatal("the renewed certificate was not picked up")
	}
}
