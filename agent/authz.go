package agent

import (
	"context"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/internal/mtls"
)

// loadCallers are the roles allowed on the agent's gRPC listener (design
// §11). Only routers call LoadService.Subscribe; control servers never dial
// an agent (the agent dials them), so a server certificate has no business
// here either: deny by default.
var loadCallers = []mtls.Role{mtls.RoleRouter}

// authorize returns the PermissionDenied (or Unauthenticated) status for a
// call whose verified peer is not of one of roles. With TLS every call has
// a verified peer, so a missing identity means a certificate without one.
func authorize(ctx context.Context, method string, roles []mtls.Role) error {
	id, ok := mtls.FromContext(ctx)
	if !ok {
		return status.Errorf(codes.Unauthenticated, "%s: no verified llmgw identity on this connection", method)
	}
	for _, r := range roles {
		if id.Role == r {
			return nil
		}
	}
	return status.Errorf(codes.PermissionDenied, "%s: caller %s is not allowed: expected role %s", method, id, rolesText(roles))
}

func rolesText(roles []mtls.Role) string {
	names := make([]string, len(roles))
	for i, r := range roles {
		names[i] = string(r)
	}
	return strings.Join(names, " or ")
}

// serverOptions are the gRPC server options of the agent's listener: its
// TLS credentials and, with TLS, the role check on every call. In plain
// text (src nil) nothing is known of callers and every call is served, as
// on the loopback or --insecure deployments that allows.
func serverOptions(src *mtls.Source, roles []mtls.Role) []grpc.ServerOption {
	opts := []grpc.ServerOption{grpc.Creds(mtls.ServerCredentials(src))}
	if src == nil {
		return opts
	}
	return append(opts,
		grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := authorize(ctx, info.FullMethod, roles); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := authorize(ss.Context(), info.FullMethod, roles); err != nil {
				return err
			}
			return h(srv, ss)
		}))
}
