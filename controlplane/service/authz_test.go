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

func TestAuthorizerCheck(t *testing.T) {
	as := func(r mtls.Role, n string) context.Context { return ctxAs(mtls.Identity{Role: r, Name: n}) }
	forwarded := func(ctx context.Context) context.Context {
		return metadata.NewIncomingContext(ctx, metadata.Pairs("llmgw-forwarded", "c2"))
	}
	tests := []struct {
		name    string
		enabled bool
		ctx     context.Context
		method  string
		code    codes.Code
		msg     string // a part of the refusal's message
	}{
		{"plain text allows everything", false, context.Background(), llmgwv1.AdminService_DeleteModel_FullMethodName, codes.OK, ""},
		{"no identity on a TLS server", true, context.Background(), llmgwv1.WatchService_Watch_FullMethodName, codes.Unauthenticated, "WatchService/Watch needs a client certificate"},
		{"admin writes", true, as(mtls.RoleAdmin, "ops"), llmgwv1.AdminService_DeleteModel_FullMethodName, codes.OK, ""},
		{"router may not write", true, as(mtls.RoleRouter, "r1"), llmgwv1.AdminService_DeleteModel_FullMethodName, codes.PermissionDenied,
			"AdminService/DeleteModel needs an admin certificate; caller is router/r1"},
		{"router may not read the admin's lists", true, as(mtls.RoleRouter, "r1"), llmgwv1.AdminService_ListNodes_FullMethodName, codes.PermissionDenied, "needs an admin"},
		{"agent may not snapshot", true, as(mtls.RoleAgent, "n1"), llmgwv1.AdminService_SnapshotSave_FullMethodName, codes.PermissionDenied, "caller is agent/n1"},
		{"router watches", true, as(mtls.RoleRouter, "r1"), llmgwv1.WatchService_Watch_FullMethodName, codes.OK, ""},
		{"admin watches", true, as(mtls.RoleAdmin, "ops"), llmgwv1.WatchService_Watch_FullMethodName, codes.OK, ""},
		{"agent may not watch", true, as(mtls.RoleAgent, "n1"), llmgwv1.WatchService_Watch_FullMethodName, codes.PermissionDenied, "needs a router or admin certificate"},
		{"router ensures adapters", true, as(mtls.RoleRouter, "r1"), llmgwv1.AdapterService_EnsureAdapter_FullMethodName, codes.OK, ""},
		{"agent attaches", true, as(mtls.RoleAgent, "n1"), llmgwv1.AgentService_Attach_FullMethodName, codes.OK, ""},
		{"router may not attach", true, as(mtls.RoleRouter, "r1"), llmgwv1.AgentService_Attach_FullMethodName, codes.PermissionDenied, "needs an agent certificate"},
		{"admin may not register nodes", true, as(mtls.RoleAdmin, "ops"), llmgwv1.ServerService_RegisterNode_FullMethodName, codes.PermissionDenied,
			"ServerService/RegisterNode needs a server certificate; caller is admin/ops"},
		{"server calls anything", true, as(mtls.RoleServer, "c2"), llmgwv1.ServerService_RegisterNode_FullMethodName, codes.OK, ""},
		{"server forwards", true, forwarded(as(mtls.RoleServer, "c2")), llmgwv1.AgentService_Attach_FullMethodName, codes.OK, ""},
		{"an agent's call marked forwarded", true, forwarded(as(mtls.RoleAgent, "n1")), llmgwv1.AgentService_Attach_FullMethodName, codes.PermissionDenied,
			"only a server may forward a call; caller is agent/n1"},
		{"an unknown method", true, as(mtls.RoleAdmin, "ops"), "/llmgw.v1.AdminService/Nope", codes.PermissionDenied, "not open to clients"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := NewAuthorizer(tt.enabled).Check(tt.ctx, tt.method)
			if got := status.Code(err); got != tt.code {
				t.Fatalf("Check = %v, want code %v", err, tt.code)
			}
			if tt.msg != "" && !strings.Contains(status.Convert(err).Message(), tt.msg) {
				t.Fatalf("Check = %q, want it to contain %q", status.Convert(err).Message(), tt.msg)
			}
		})
	}
}
