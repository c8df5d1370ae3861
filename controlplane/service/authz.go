package service

import (
	"context"
	"path"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/internal/mtls"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// The roles besides server that a method admits.
var (
	adminOnly  = []mtls.Role{mtls.RoleAdmin}
	routerOnly = []mtls.Role{mtls.RoleRouter}
	serverOnly = []mtls.Role{}
)

// allowed is who may call each method of the control plane's services
// (design §11), in one place: a server may call every method (servers
// forward calls and hellos to the leader, and ask one another for their
// Raft figures), so each row lists the other roles it admits. A method
// missing here is refused to everyone but servers; a test checks that every
// method of the services the control plane serves has a row.
//
// Why reads are an admin's too: a cluster's models, nodes and peers are
// what an attacker maps before striking, and no router or agent needs them
// (routers learn the state from Watch).
var allowed = map[string][]mtls.Role{
	// Writes, snapshots, membership and Raft verbs: an operator's.
	llmgwv1.AdminService_ApplyModel_FullMethodName:         adminOnly,
	llmgwv1.AdminService_DeleteModel_FullMethodName:        adminOnly,
	llmgwv1.AdminService_DrainNode_FullMethodName:          adminOnly,
	llmgwv1.AdminService_SetNodeLabels_FullMethodName:      adminOnly,
	llmgwv1.AdminService_Join_FullMethodName:               adminOnly,
	llmgwv1.AdminService_Leave_FullMethodName:              adminOnly,
	llmgwv1.AdminService_RemovePeer_FullMethodName:         adminOnly,
	llmgwv1.AdminService_TransferLeadership_FullMethodName: adminOnly,
	llmgwv1.AdminService_SnapshotSave_FullMethodName:       adminOnly,
	llmgwv1.AdminService_SnapshotRestore_FullMethodName:    adminOnly,
	llmgwv1.AdminService_CreateApiKey_FullMethodName:       adminOnly,
	llmgwv1.AdminService_RevokeApiKey_FullMethodName:       adminOnly,
	llmgwv1.AdminService_Keyring_FullMethodName:            adminOnly,
	// Reads: an operator's as well.
	llmgwv1.AdminService_ListModels_FullMethodName:    adminOnly,
	llmgwv1.AdminService_ListNodes_FullMethodName:     adminOnly,
	llmgwv1.AdminService_ListReplicas_FullMethodName:  adminOnly,
	llmgwv1.AdminService_ClusterStatus_FullMethodName: adminOnly,
	llmgwv1.AdminService_Members_FullMethodName:       adminOnly,
	llmgwv1.AdminService_ListPeers_FullMethodName:     adminOnly,
	llmgwv1.AdminService_ListApiKeys_FullMethodName:   adminOnly,
	llmgwv1.AdminService_ListAdapters_FullMethodName:  adminOnly,
	// Routers watch the state and ask for cold adapters; an admin may watch
	// too (debugging what routers see).
	llmgwv1.WatchService_Watch_FullMethodName:           {mtls.RoleRouter, mtls.RoleAdmin},
	llmgwv1.AdapterService_EnsureAdapter_FullMethodName: routerOnly,

	// Routers report their requests in flight per adapter (design §7.6).
	llmgwv1.AdapterService_ReportAdapterUse_FullMethodName: routerOnly,
	// Agents attach; which node they may attach as is the AgentService's
	// check (the certificate's name), since only it reads the hello.
	llmgwv1.AgentService_Attach_FullMethodName: {mtls.RoleAgent},
	// Server to server only.
	llmgwv1.ServerService_RegisterNode_FullMethodName: serverOnly,
	llmgwv1.ServerService_LocalKeyring_FullMethodName: serverOnly,
}

// Authorizer refuses calls whose certificate's role may not make them
// (design §11). Without TLS (a plain-text deployment on loopback, or
// --insecure) nothing is known of callers and everything is allowed, as
// before identities existed.
type Authorizer struct {
	enabled bool
}

// NewAuthorizer returns the check of a server that serves mutual TLS
// (enabled) or plain text.
func NewAuthorizer(enabled bool) *Authorizer { return &Authorizer{enabled: enabled} }

// Unary is the interceptor of unary calls. It runs before forwarding: a
// follower checks the caller, then forwards to the leader as itself (a
// server), and the leader trusts servers.
func (a *Authorizer) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := a.Check(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// Stream is the interceptor of streams.
func (a *Authorizer) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := a.Check(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}

// Check is the decision for one call of method: nil, UNAUTHENTICATED when a
// TLS server has no verified identity for the caller, or PERMISSION_DENIED
// naming the certificate the method needs and the caller's. A call marked
// forwarded (answered here, never forwarded again) must come from a server:
// the mark is metadata any client could set.
func (a *Authorizer) Check(ctx context.Context, method string) error {
	if !a.enabled {
		return nil
	}
	id, ok := mtls.FromContext(ctx)
	if !ok {
		return status.Errorf(codes.Unauthenticated, "%s needs a client certificate of this cluster's CA carrying an llmgw identity", shortMethod(method))
	}
	if id.Role == mtls.RoleServer {
		return nil
	}
	if IsForwarded(ctx) {
		return status.Errorf(codes.PermissionDenied, "%s: only a server may forward a call; caller is %s", shortMethod(method), id)
	}
	roles, known := allowed[method]
	for _, r := range roles {
		if id.Role == r {
			return nil
		}
	}
	if !known {
		return status.Errorf(codes.PermissionDenied, "%s is not open to clients; caller is %s", shortMethod(method), id)
	}
	return status.Errorf(codes.PermissionDenied, "%s needs %s certificate; caller is %s", shortMethod(method), needs(roles), id)
}

// shortMethod is "AdminService/DeleteModel" of "/llmgw.v1.AdminService/DeleteModel".
func shortMethod(full string) string {
	svc, m := path.Split(full)
	svc = strings.Trim(svc, "/")
	if i := strings.LastIndexByte(svc, '.'); i >= 0 {
		svc = svc[i+1:]
	}
	return svc + "/" + m
}

// needs is "an admin", "a router or admin", "a server".
func needs(roles []mtls.Role) string {
	if len(roles) == 0 {
		return "a server"
	}
	names := make([]string, len(roles))
	for i, r := range roles {
		names[i] = string(r)
	}
	article := "a"
	if strings.ContainsRune("aeiou", rune(names[0][0])) {
		article = "an"
	}
	return article + " " + strings.Join(names, " or ")
}
