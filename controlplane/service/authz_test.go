package service

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/internal/mtls"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// servedByControlPlane are the proto services a control server serves;
// LoadService is the agents' (design §5.3).
var servedByControlPlane = map[string]bool{
	"AgentService": true, "WatchService": true, "AdminService": true, "AdapterService": true, "ServerService": true,
	"QuotaService": true, "FlowService": true,
}

// TestAllowedCoversEveryMethod: every method of every service the control
// plane serves has a row, and every row names a real method, so a new RPC
// cannot ship without someone deciding who may call it.
func TestAllowedCoversEveryMethod(t *testing.T) {
	svcs := llmgwv1.File_llmgw_v1_llmgw_proto.Services()
	methods := map[string]bool{}
	for i := range svcs.Len() {
		sd := svcs.Get(i)
		name := string(sd.Name())
		if name == "LoadService" {
			continue
		}
		if !servedByControlPlane[name] {
			t.Errorf("service %s is new: decide whether the control plane serves it and add its methods to allowed", name)
			continue
		}
		for j := range sd.Methods().Len() {
			full := fmt.Sprintf("/%s/%s", sd.FullName(), sd.Methods().Get(j).Name())
			methods[full] = true
			if _, ok := allowed[full]; !ok {
				t.Errorf("%s has no row in allowed", full)
			}
		}
	}
	for m := range allowed {
		if !methods[m] {
			t.Errorf("allowed has a row for %s, which no served service has", m)
		}
	}
}

// ctxAs is an incoming call's context from a peer whose verified
// certificate carries id.
func ctxAs(id mtls.Identity) context.Context {
	cert := &x509.Certificate{URIs: []*url.URL{id.URI()}}
	info := credentials.TLSInfo{State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert}}}}
	return peer.NewContext(context.Background(), &peer.Peer{AuthInfo: info})
}

// members is a Raft configuration of the named servers; hasState false
// is a fresh server's.
type members struct {
	ids      []string
	hasState bool
}

func (m members) Member(id string) (bool, bool) {
	for _, x := range m.ids {
		if x == id {
			return true, m.hasState
		}
	}
	return false, m.hasState
}

func TestAuthorizerCheck(t *testing.T) {
	as := func(r mtls.Role, n string) context.Context { return ctxAs(mtls.Identity{Role: r, Name: n}) }
	forwarded := func(ctx context.Context) context.Context {
		return metadata.NewIncomingContext(ctx, metadata.Pairs("llmgw-forwarded", "c2"))
	}
	cluster := members{ids: []string{"c1", "c2", "c3"}, hasState: true}
	fresh := members{}
	tests := []struct {
		name    string
		enabled bool
		members Membership
		ctx     context.Context
		method  string
		code    codes.Code
		msg     string // a part of the refusal's message
	}{
		{"plain text allows everything", false, cluster, context.Background(), llmgwv1.AdminService_DeleteModel_FullMethodName, codes.OK, ""},
		{"plain text: a stranger server too", false, cluster, as(mtls.RoleServer, "c9"), llmgwv1.AdminService_ListApiKeys_FullMethodName, codes.OK, ""},
		{"no identity on a TLS server", true, cluster, context.Background(), llmgwv1.WatchService_Watch_FullMethodName, codes.Unauthenticated, "WatchService/Watch needs a client certificate"},
		{"admin writes", true, cluster, as(mtls.RoleAdmin, "ops"), llmgwv1.AdminService_DeleteModel_FullMethodName, codes.OK, ""},
		{"router may not write", true, cluster, as(mtls.RoleRouter, "r1"), llmgwv1.AdminService_DeleteModel_FullMethodName, codes.PermissionDenied,
			"AdminService/DeleteModel needs an admin certificate; caller is router/r1"},
		{"router may not read the admin's lists", true, cluster, as(mtls.RoleRouter, "r1"), llmgwv1.AdminService_ListNodes_FullMethodName, codes.PermissionDenied, "needs an admin"},
		{"agent may not snapshot", true, cluster, as(mtls.RoleAgent, "n1"), llmgwv1.AdminService_SnapshotSave_FullMethodName, codes.PermissionDenied, "caller is agent/n1"},
		{"router watches", true, cluster, as(mtls.RoleRouter, "r1"), llmgwv1.WatchService_Watch_FullMethodName, codes.OK, ""},
		{"admin watches", true, cluster, as(mtls.RoleAdmin, "ops"), llmgwv1.WatchService_Watch_FullMethodName, codes.OK, ""},
		{"agent may not watch", true, cluster, as(mtls.RoleAgent, "n1"), llmgwv1.WatchService_Watch_FullMethodName, codes.PermissionDenied, "needs a router or admin certificate"},
		{"router ensures adapters", true, cluster, as(mtls.RoleRouter, "r1"), llmgwv1.AdapterService_EnsureAdapter_FullMethodName, codes.OK, ""},
		{"router reports its flow queues", true, cluster, as(mtls.RoleRouter, "r1"), llmgwv1.FlowService_Report_FullMethodName, codes.OK, ""},
		{"admin may not report flow queues", true, cluster, as(mtls.RoleAdmin, "ops"), llmgwv1.FlowService_Report_FullMethodName, codes.PermissionDenied,
			"FlowService/Report needs a router certificate; caller is admin/ops"},
		{"admin reads the flow status", true, cluster, as(mtls.RoleAdmin, "ops"), llmgwv1.AdminService_FlowStatus_FullMethodName, codes.OK, ""},
		{"router may not read the flow status", true, cluster, as(mtls.RoleRouter, "r1"), llmgwv1.AdminService_FlowStatus_FullMethodName, codes.PermissionDenied, "needs an admin"},
		{"agent attaches", true, cluster, as(mtls.RoleAgent, "n1"), llmgwv1.AgentService_Attach_FullMethodName, codes.OK, ""},
		{"router may not attach", true, cluster, as(mtls.RoleRouter, "r1"), llmgwv1.AgentService_Attach_FullMethodName, codes.PermissionDenied, "needs an agent certificate"},
		{"admin may not register nodes", true, cluster, as(mtls.RoleAdmin, "ops"), llmgwv1.ServerService_RegisterNode_FullMethodName, codes.PermissionDenied,
			"ServerService/RegisterNode needs a server certificate; caller is admin/ops"},
		{"an agent's call marked forwarded", true, cluster, forwarded(as(mtls.RoleAgent, "n1")), llmgwv1.AgentService_Attach_FullMethodName, codes.PermissionDenied,
			"only a server may forward a call; caller is agent/n1"},
		{"an unknown method", true, cluster, as(mtls.RoleAdmin, "ops"), "/llmgw.v1.AdminService/Nope", codes.PermissionDenied, "not open to clients"},

		// Membership is the authority: a server certificate counts only
		// for a server of the configuration.
		{"a member registers nodes", true, cluster, as(mtls.RoleServer, "c2"), llmgwv1.ServerService_RegisterNode_FullMethodName, codes.OK, ""},
		{"a member forwards a hello", true, cluster, forwarded(as(mtls.RoleServer, "c2")), llmgwv1.AgentService_Attach_FullMethodName, codes.OK, ""},
		{"a member forwards a key listing", true, cluster, forwarded(as(mtls.RoleServer, "c3")), llmgwv1.AdminService_ListApiKeys_FullMethodName, codes.OK, ""},
		{"this server's own certificate (its console)", true, cluster, as(mtls.RoleServer, "c1"), llmgwv1.AdminService_ListApiKeys_FullMethodName, codes.OK, ""},
		{"this server's own certificate, removed from the configuration", true, members{ids: []string{"c2", "c3"}, hasState: true},
			as(mtls.RoleServer, "c1"), llmgwv1.AdminService_ListNodes_FullMethodName, codes.OK, ""},
		{"a stranger lists keys", true, cluster, as(mtls.RoleServer, "c9"), llmgwv1.AdminService_ListApiKeys_FullMethodName, codes.PermissionDenied,
			"AdminService/ListApiKeys refused: server/c9 is not a server of c1's Raft configuration"},
		{"a stranger forwards a write", true, cluster, forwarded(as(mtls.RoleServer, "c9")), llmgwv1.AdminService_ApplyModel_FullMethodName, codes.PermissionDenied,
			"not a server of c1's Raft configuration"},
		{"a stranger registers a node", true, cluster, as(mtls.RoleServer, "c9"), llmgwv1.ServerService_RegisterNode_FullMethodName, codes.PermissionDenied, "server/c9"},
		{"a stranger attaches", true, cluster, as(mtls.RoleServer, "c9"), llmgwv1.AgentService_Attach_FullMethodName, codes.PermissionDenied, "server/c9"},
		{"a stranger forwards a hello", true, cluster, forwarded(as(mtls.RoleServer, "c9")), llmgwv1.AgentService_Attach_FullMethodName, codes.PermissionDenied, "server/c9"},
		{"a stranger watches", true, cluster, as(mtls.RoleServer, "c9"), llmgwv1.WatchService_Watch_FullMethodName, codes.PermissionDenied, "server/c9"},
		{"a stranger saves a snapshot", true, cluster, forwarded(as(mtls.RoleServer, "c9")), llmgwv1.AdminService_SnapshotSave_FullMethodName, codes.PermissionDenied, "server/c9"},
		{"a stranger changes the gossip keyring", true, cluster, as(mtls.RoleServer, "c9"), llmgwv1.ServerService_LocalKeyring_FullMethodName, codes.PermissionDenied, "server/c9"},
		{"a stranger's unknown method", true, cluster, as(mtls.RoleServer, "c9"), "/llmgw.v1.AdminService/Nope", codes.PermissionDenied, "server/c9"},
		{"a server not yet a member asks the cluster's status", true, cluster, as(mtls.RoleServer, "c9"), llmgwv1.AdminService_ClusterStatus_FullMethodName, codes.OK, ""},
		{"a fresh server admits any server (the join path)", true, fresh, as(mtls.RoleServer, "c9"), llmgwv1.AdminService_ListNodes_FullMethodName, codes.OK, ""},
		{"without a membership source, servers are trusted", true, nil, as(mtls.RoleServer, "c9"), llmgwv1.ServerService_RegisterNode_FullMethodName, codes.OK, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := NewAuthorizer(AuthzConfig{Enabled: tt.enabled, Self: "c1", Members: tt.members}, nil).Check(tt.ctx, tt.method)
			if got := status.Code(err); got != tt.code {
				t.Fatalf("Check = %v, want code %v", err, tt.code)
			}
			if tt.msg != "" && !strings.Contains(status.Convert(err).Message(), tt.msg) {
				t.Fatalf("Check = %q, want it to contain %q", status.Convert(err).Message(), tt.msg)
			}
		})
	}
}
