package console

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/mtls/mtlstest"
	"github.com/llmgw/llmgw/internal/testkit"
)

// TestAccessWithoutTLS: without TLS the console answers loopback callers
// only, unless --insecure.
func TestAccessWithoutTLS(t *testing.T) {
	for _, tc := range []struct {
		name     string
		insecure bool
		remote   string
		want     int
	}{
		{"loopback v4", false, "127.0.0.1:5000", http.StatusOK},
		{"loopback v6", false, "[::1]:5000", http.StatusOK},
		{"beyond loopback", false, "10.1.2.3:5000", http.StatusForbidden},
		{"beyond loopback with --insecure", true, "10.1.2.3:5000", http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := Access{Insecure: tc.insecure}.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "page") }))
			req := httptest.NewRequest(http.MethodGet, "/ui/", nil)
			req.RemoteAddr = tc.remote
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.want {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.want, rec.Body)
			}
			if tc.want == http.StatusForbidden && !strings.Contains(rec.Body.String(), "loopback callers only") {
				t.Fatalf("refusal does not say why: %q", rec.Body)
			}
		})
	}
}

// TestSplitServesConsoleOverTLSToAdminsOnly: with TLS, one port serves
// /metrics in plain text as before and the console over HTTPS, to an
// admin certificate only; plain HTTP to the console is refused, loopback
// or not.
func TestSplitServesConsoleOverTLSToAdminsOnly(t *testing.T) {
	ca := mtlstest.New(t)
	server := ca.Source(mtls.RoleServer, "c1")
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lis := Split(inner, server.ServerConfig())
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "metrics") })
	mux.Handle("GET /ui/", Access{TLS: true}.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "console") })))
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(lis) }()
	t.Cleanup(func() {
		hs.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	addr := inner.Addr().String()

	client := func(src *mtls.Source) *http.Client {
		tr := &http.Transport{}
		if src != nil {
			tr.TLSClientConfig = src.ClientConfig(mtls.RoleServer)
		}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr, Timeout: 10 * time.Second}
	}
	for _, tc := range []struct {
		name   string
		client *http.Client
		url    string
		want   int
		says   string
	}{
		{"plain /metrics", client(nil), "http://" + addr + "/metrics", http.StatusOK, "metrics"},
		{"plain console from loopback", client(nil), "http://" + addr + "/ui/", http.StatusForbidden, "needs HTTPS with an admin certificate"},
		{"admin over TLS", client(ca.Source(mtls.RoleAdmin, "ops")), "https://" + addr + "/ui/", http.StatusOK, "console"},
		{"router over TLS", client(ca.Source(mtls.RoleRouter, "r1")), "https://" + addr + "/ui/", http.StatusForbidden, "caller is router/r1"},
		{"/metrics over TLS too", client(ca.Source(mtls.RoleRouter, "r1")), "https://" + addr + "/metrics", http.StatusOK, "metrics"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := tc.client.Get(tc.url)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.want || !strings.Contains(string(body), tc.says) {
				t.Fatalf("%d %q, want %d saying %q", resp.StatusCode, body, tc.want, tc.says)
			}
		})
	}

	t.Run("TLS without a client certificate fails the handshake", func(t *testing.T) {
		c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
		if err == nil {
			// TLS 1.3 reports a refused client certificate on the first read.
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, err = c.Read(make([]byte, 1))
			c.Close()
		}
		if err == nil {
			t.Fatal("a client without a certificate completed a TLS session")
		}
	})

	t.Run("another CA's admin is refused", func(t *testing.T) {
		other := mtlstest.New(t).Source(mtls.RoleAdmin, "ops")
		if resp, err := client(other).Get("https://" + addr + "/ui/"); err == nil {
			resp.Body.Close()
			t.Fatalf("an admin of another CA got %s", resp.Status)
		}
	})
}

// TestSplitCloseDoesNotWaitForSilentClients: a connection that never sends
// a byte does not hold Close for the sniff timeout.
func TestSplitCloseDoesNotWaitForSilentClients(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lis := Split(inner, &tls.Config{MinVersion: tls.VersionTLS13})
	c, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	closed := make(chan error, 1)
	// Give the accept loop the connection before closing.
	testkit.Wait(t, "the listener accepting the connection", func() bool {
		sp := lis.(*split)
		sp.mu.Lock()
		defer sp.mu.Unlock()
		return len(sp.pending) == 1
	})
	go func() { closed <- lis.Close() }()
	select {
	case <-closed:
	case <-time.After(sniffTimeout - time.Second):
		t.Fatalf("Close waited for a silent client (sniff timeout %v)", sniffTimeout)
	}
	if _, err := lis.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
	}
}
