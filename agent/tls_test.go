package agent

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/mtls/mtlstest"
	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestTLSCertificateMustBeThisAgents: the agent refuses to start with a
// certificate a control server would refuse on every attach — another
// role's, or another node's.
func TestTLSCertificateMustBeThisAgents(t *testing.T) {
	ca := mtlstest.New(t)
	tests := []struct {
		name    string
		files   mtls.Files
		wantErr string
	}{
		{"this node's agent certificate", ca.Files(mtls.RoleAgent, "n1"), ""},
		{"another node's", ca.Files(mtls.RoleAgent, "n2"), "agent/n2, but this agent is agent/n1"},
		{"a router's", ca.Files(mtls.RoleRouter, "n1"), "router/n1, but this agent is agent/n1"},
		{"a server's", ca.Files(mtls.RoleServer, "n1"), "server/n1, but this agent is agent/n1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := testConfig(t)
			c.Control = []string{"127.0.0.1:1"}
			c.TLS = tt.files
			_, err := New(c, slog.New(slog.DiscardHandler))
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "--tls-cert") {
				t.Fatalf("New = %v, want an error naming --tls-cert and %q", err, tt.wantErr)
			}
		})
	}
}

// TestTLSSessionAndLoadService runs an agent on TLS: it attaches to a
// control node holding a server certificate of its CA and never to one
// holding another role's; its LoadService streams to routers and refuses
// every other caller — another role (PermissionDenied naming the role
// expected), another CA's router, plain text.
func TestTLSSessionAndLoadService(t *testing.T) {
	ca := mtlstest.New(t)
	// A control "server" with an agent certificate comes first in the
	// rotation: the agent must refuse it and attach to the real one.
	impostor := startFakeControl(t, "impostor", grpc.Creds(mtls.ServerCredentials(ca.Source(mtls.RoleAgent, "evil"))))
	real := startFakeControl(t, "c1", grpc.Creds(mtls.ServerCredentials(ca.Source(mtls.RoleServer, "c1"))))
	c := testConfig(t, impostor.addr, real.addr)
	c.TLS = ca.Files(mtls.RoleAgent, "n1")
	a, _ := startAgent(t, c)
	testkit.Wait(t, "attach to the control node with a server certificate", func() bool {
		h, _ := real.snapshot()
		return len(h) > 0
	})
	if h, _ := impostor.snapshot(); len(h) > 0 {
		t.Fatalf("the agent said hello to a peer with an agent certificate: %v", h)
	}
	testkit.Wait(t, "LoadService address", func() bool { return a.GRPCAddr() != "" })

	subscribe := func(opt grpc.DialOption) error {
		conn, err := grpc.NewClient(a.GRPCAddr(), opt)
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		stream, err := llmgwv1.NewLoadServiceClient(conn).Subscribe(ctx, &llmgwv1.LoadSubscribeRequest{ClientId: "t"})
		if err != nil {
			return err
		}
		snap, err := stream.Recv()
		if err == nil && snap.GetNode() != "n1" {
			t.Errorf("snapshot of node %q, want n1", snap.GetNode())
		}
		return err
	}
	other := mtlstest.New(t)
	tests := []struct {
		name     string
		dial     grpc.DialOption
		wantCode codes.Code
		wantMsg  string
	}{
		{"router", mtls.DialOption(ca.Source(mtls.RoleRouter, "r1"), mtls.RoleAgent), codes.OK, ""},
		{"server", mtls.DialOption(ca.Source(mtls.RoleServer, "c1"), mtls.RoleAgent), codes.PermissionDenied, "expected role router"},
		{"another agent", mtls.DialOption(ca.Source(mtls.RoleAgent, "n2"), mtls.RoleAgent), codes.PermissionDenied, "expected role router"},
		{"admin", mtls.DialOption(ca.Source(mtls.RoleAdmin, "ops"), mtls.RoleAgent), codes.PermissionDenied, "expected role router"},
		{"router of another CA", mtls.DialOption(other.Source(mtls.RoleRouter, "r1"), mtls.RoleAgent), codes.Unavailable, ""},
		{"plain text", mtls.DialOption(nil, mtls.RoleAgent), codes.Unavailable, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := subscribe(tt.dial)
			if got := status.Code(err); got != tt.wantCode || !strings.Contains(status.Convert(err).Message(), tt.wantMsg) {
				t.Fatalf("Subscribe as %s: %v (code %s), want code %s with %q", tt.name, err, got, tt.wantCode, tt.wantMsg)
			}
		})
	}
}

// TestEngineLogsStayOnLoopback: the engines' log lines, which may hold
// prompts, are not served to a non-loopback caller of the plain-HTTP
// listener unless --insecure.
func TestEngineLogsStayOnLoopback(t *testing.T) {
	tests := []struct {
		name     string
		remote   string
		insecure bool
		want     int
	}{
		{"loopback", "127.0.0.1:5000", false, http.StatusNotFound},
		{"network", "10.0.0.9:5000", false, http.StatusForbidden},
		{"network, --insecure", "10.0.0.9:5000", true, http.StatusNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := testConfig(t, "127.0.0.1:1")
			c.Insecure = tt.insecure
			a, err := New(c, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			req := httptest.NewRequest("GET", "/v1/replicas/nope/logs", nil)
			req.RemoteAddr = tt.remote
			w := httptest.NewRecorder()
			a.handler().ServeHTTP(w, req)
			if w.Code != tt.want {
				t.Fatalf("GET logs from %s: %d %s, want %d", tt.remote, w.Code, w.Body, tt.want)
			}
		})
	}
}
