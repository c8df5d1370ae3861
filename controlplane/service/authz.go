package service

import (
	"context"
	"fmt"
	"log/slog"
	"path"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/ratelog"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// The roles besides server that a method admits.
var (
	adminOnly  = []mtls.Role{mtls.RoleAdmin}
	routerOnly = []mtls.Role{mtls.RoleRouter}
	serverOnly = []mtls.Role{}
)

// allowed is who may call each method of the control plane's services
// (design §11), in one place: a server of the cluster may call every
// method (servers forward calls and hellos to the leader, and ask one
// another for their Raft figures; a server certificate outside the Raft
// configuration is refused, see Authorizer), so each row lists the other
// roles it admits. A method
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
	llmgwv1.AdminService_SetApiKeysRequired_FullMethodName: adminOnly,
	llmgwv1.AdminService_Keyring_FullMethodName:            adminOnly,
	llmgwv1.AdminService_SetApiKeyTenant_FullMethodName:    adminOnly,
	llmgwv1.AdminService_PutTenant_FullMethodName:          adminOnly,
	llmgwv1.AdminService_DeleteTenant_FullMethodName:       adminOnly,
	llmgwv1.AdminService_ApplyAlias_FullMethodName:         adminOnly,
	llmgwv1.AdminService_DeleteAlias_FullMethodName:        adminOnly,
	// Reads: an operator's as well.
	llmgwv1.AdminService_ListModels_FullMethodName:    adminOnly,
	llmgwv1.AdminService_ListNodes_FullMethodName:     adminOnly,
	llmgwv1.AdminService_ListReplicas_FullMethodName:  adminOnly,
	llmgwv1.AdminService_ClusterStatus_FullMethodName: adminOnly,
	llmgwv1.AdminService_Members_FullMethodName:       adminOnly,
	llmgwv1.AdminService_ListPeers_FullMethodName:     adminOnly,
	llmgwv1.AdminService_ListApiKeys_FullMethodName:   adminOnly,
	llmgwv1.AdminService_ListAdapters_FullMethodName:  adminOnly,
	llmgwv1.AdminService_GetTenant_FullMethodName:     adminOnly,
	llmgwv1.AdminService_ListTenants_FullMethodName:   adminOnly,
	llmgwv1.AdminService_Usage_FullMethodName:         adminOnly,
	llmgwv1.AdminService_FlowStatus_FullMethodName:    adminOnly,
	llmgwv1.AdminService_ModelStatus_FullMethodName:   adminOnly,
	llmgwv1.AdminService_ListAliases_FullMethodName:   adminOnly,
	// Routers watch the state and ask for cold adapters; an admin may watch
	// too (debugging what routers see).
	llmgwv1.WatchService_Watch_FullMethodName:           {mtls.RoleRouter, mtls.RoleAdmin},
	llmgwv1.AdapterService_EnsureAdapter_FullMethodName: routerOnly,

	// Routers report their requests in flight per adapter (design §7.6).
	llmgwv1.AdapterService_ReportAdapterUse_FullMethodName: routerOnly,
	// Routers lease shares of tenants' limits and send their metered usage
	// (design §7.7).
	llmgwv1.QuotaService_Lease_FullMethodName:       routerOnly,
	llmgwv1.QuotaService_RecordUsage_FullMethodName: routerOnly,
	// Routers share their flow-control queues (design §7.8).
	llmgwv1.FlowService_Report_FullMethodName: routerOnly,
	// Agents attach; which node they may attach as is the AgentService's
	// check (the certificate's name), since only it reads the hello.
	llmgwv1.AgentService_Attach_FullMethodName: {mtls.RoleAgent},
	// Server to server only.
	llmgwv1.ServerService_RegisterNode_FullMethodName: serverOnly,
	llmgwv1.ServerService_LocalKeyring_FullMethodName: serverOnly,
}

// refusalLogCallers bounds the callers whose refusals are remembered for
// the log's rate: a handful of servers in practice.
const refusalLogCallers = 1024

// Authorizer refuses calls whose certificate's role may not make them
// (design §11). Without TLS (a plain-text deployment on loopback, or
// --insecure) nothing is known of callers and everything is allowed, as
// before identities existed.
//
// A server certificate is not enough on its own: the CA signs one for
// every server an operator may ever run, and one that never joined — or
// was removed — held every power of a member (it listed API keys,
// registered nodes and attached as any agent). So a server caller must
// also be a server of this server's latest Raft configuration (Membership),
// the check the Raft transport's guard makes for Raft's own RPCs
// (controlplane/store/guard.go). Two calls need no membership: this
// server's own (its web console reads its own listener with its own
// certificate) and ClusterStatus, which a server asks of the others before
// it is a member (the bootstrap's look for an existing cluster, the
// minimum-version check of a server not yet added) and which carries
// nothing gossip does not already show its members.
type Authorizer struct {
	enabled bool
	self    string
	members Membership // nil: server certificates are trusted as such
	metrics *AuthzMetrics
	// log gets a refusal once a minute per caller (logLimit), so a
	// stranger retrying in a loop cannot flood it; the metric counts all.
	log      *slog.Logger
	logLimit *ratelog.Limiter
}

// AuthzConfig is who the Authorizer serves and what it reads.
type AuthzConfig struct {
	// Enabled is true on a server that serves mutual TLS.
	Enabled bool
	// Self is this server's id: its own calls pass.
	Self string
	// Members decides which server certificates are the cluster's; nil
	// trusts every server certificate (tests of roles alone).
	Members Membership
	// Metrics counts refusals; nil counts nothing.
	Metrics *AuthzMetrics
	// Now is the clock of the refusal log's rate limit; nil is time.Now.
	Now func() time.Time
}

// preJoin are the methods a server certificate may call without being a
// member (see Authorizer).
var preJoin = map[string]bool{
	llmgwv1.AdminService_ClusterStatus_FullMethodName: true,
}

// NewAuthorizer returns the check of a server as cfg describes it,
// logging refusals of server certificates to log (at most once a minute
// per caller).
func NewAuthorizer(cfg AuthzConfig, log *slog.Logger) *Authorizer {
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Authorizer{enabled: cfg.Enabled, self: cfg.Self, members: cfg.Members, metrics: cfg.Metrics,
		log: log, logLimit: ratelog.New(time.Minute, refusalLogCallers, now)}
}

// Unary is the interceptor of unary calls. It runs before forwarding: a
// follower checks the caller, then forwards to the leader as itself (a
// server), and the leader checks that server is a member.
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
// naming the certificate the method needs and the caller's, or, for a
// server certificate, that it is not of this cluster's configuration. A
// call marked forwarded (answered here, never forwarded again) must come
// from a server: the mark is metadata any client could set.
func (a *Authorizer) Check(ctx context.Context, method string) error {
	if !a.enabled {
		return nil
	}
	id, ok := mtls.FromContext(ctx)
	if !ok {
		return status.Errorf(codes.Unauthenticated, "%s needs a client certificate of this cluster's CA carrying an llmgw identity", shortMethod(method))
	}
	if id.Role == mtls.RoleServer {
		return a.checkServer(id, method)
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

// checkServer admits a server certificate that is this server's own, of a
// member of its latest Raft configuration, or calling a preJoin method; a
// server with no Raft state admits every one (Membership).
func (a *Authorizer) checkServer(id mtls.Identity, method string) error {
	if a.members == nil || id.Name == a.self || preJoin[method] {
		return nil
	}
	member, hasState := a.members.Member(id.Name)
	if member || !hasState {
		return nil
	}
	short := shortMethod(method)
	label := short
	if _, known := allowed[method]; !known {
		label = "other" // a caller's junk method name must not grow the metric
	}
	a.metrics.refused(label)
	why := fmt.Sprintf("%s is not a server of %s's Raft configuration: a server certificate has a server's powers only once its server has joined the cluster", id, a.self)
	if a.logLimit.Allow(id.String()) {
		a.log.Warn("a server certificate outside this cluster was refused", "caller", id.String(), "method", short, "reason", why)
	}
	return status.Errorf(codes.PermissionDenied, "%s refused: %s (see llmgwctl raft list-peers)", short, why)
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
