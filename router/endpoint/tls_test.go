package endpoint

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/mtls/mtlstest"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestAgentCredsDemandTheNodesAgent: with TLS, a router's load subscription
// to node n1 goes through only to the agent certificate named n1 — not to
// another node's agent, not to another role, not to another CA's n1, and
// not in plain text.
func TestAgentCredsDemandTheNodesAgent(t *testing.T) {
	ca, other := mtlstest.New(t), mtlstest.New(t)
	router := ca.Source(mtls.RoleRouter, "r1")
	tests := []struct {
		name    string
		agent   *mtls.Source // nil: plain text
		wantErr string
	}{
		{"the node's agent", ca.Source(mtls.RoleAgent, "n1"), ""},
		{"another node's agent", ca.Source(mtls.RoleAgent, "n2"), "presented the certificate of agent/n2"},
		{"a server", ca.Source(mtls.RoleServer, "n1"), "is not a agent of this cluster's CA"},
		{"n1 of another CA", other.Source(mtls.RoleAgent, "n1"), "is not a agent of this cluster's CA"},
		{"plain text", nil, "connection"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := startFakeAgent(t, grpc.Creds(mtls.ServerCredentials(tt.agent)))
			a.push <- &llmgwv1.LoadSnapshot{Node: "n1"}
			conn, err := grpc.NewClient(a.addr, agentCreds(router, "n1"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var snap *llmgwv1.LoadSnapshot
			stream, err := llmgwv1.NewLoadServiceClient(conn).Subscribe(ctx, &llmgwv1.LoadSubscribeRequest{ClientId: "r1"})
			if err == nil {
				snap, err = stream.Recv()
			}
			if tt.wantErr == "" {
				if err != nil || snap.GetNode() != "n1" {
					t.Fatalf("subscribe to n1's agent: %v, %v", snap, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("subscribe = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}
