package controlplane

import (
	"fmt"
	"net"

	"google.golang.org/grpc"

	"github.com/llmgw/llmgw/chunking"
	"github.com/llmgw/llmgw/controlplane/console"
	"github.com/llmgw/llmgw/internal/mtls"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// nodeConsole is the web console of this node and what it holds open.
type nodeConsole struct {
	*console.Console
	routers *console.Sampler
	conn    *grpc.ClientConn
}

func (c nodeConsole) close() { c.conn.Close() }

// newConsole makes the node's web console (design §9). It reads
// AdminService over a gRPC connection to this node's own listener, with
// this server's certificate under TLS: the console's reads then pass the
// same authorization and forwarding to the leader as llmgwctl's. The
// connection is lazy; it is first used when a page is asked for, once gRPC
// serves.
func (s *Server) newConsole() (nodeConsole, error) {
	conn, err := grpc.NewClient(selfAddr(s.grpcAddr), mtls.DialOption(s.tls, mtls.RoleServer),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(chunking.MaxMessageBytes)))
	if err != nil {
		return nodeConsole{}, fmt.Errorf("console: connect to this node's gRPC %s: %w", s.grpcAddr, err)
	}
	log := s.log.With("subsystem", "console")
	routers := console.NewSampler(console.SamplerConfig{Routers: s.cfg.ConsoleRouters}, log)
	access := console.Access{TLS: s.tls != nil, Insecure: s.cfg.Insecure}
	return nodeConsole{
		Console: console.New(llmgwv1.NewAdminServiceClient(conn), access, console.NewLoad(), routers, log),
		routers: routers,
		conn:    conn,
	}, nil
}

// selfAddr is where this node reaches its own bound gRPC address: a
// wildcard bind is dialed on loopback.
func selfAddr(bound string) string {
	host, port, err := net.SplitHostPort(bound)
	if err != nil {
		return bound
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		if ip != nil && ip.To4() == nil {
			return net.JoinHostPort("::1", port)
		}
		return net.JoinHostPort("127.0.0.1", port)
	}
	return bound
}
