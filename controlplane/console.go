package controlplane

import (
	"fmt"
	"net"
	"net/http"
	"time"

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
	routers := console.NewSampler(console.SamplerConfig{Routers: s.cfg.ConsoleRouters, Client: s.routerOpsClient()}, log)
	access := console.Access{TLS: s.tls != nil, Insecure: s.cfg.Insecure}
	return nodeConsole{
		Console: console.New(llmgwv1.NewAdminServiceClient(conn), access, console.NewLoad(), routers, log),
		routers: routers,
		conn:    conn,
	}, nil
}

// routerOpsClient reads the routers' operations ports (--console-router).
// Under TLS a router's operations port admits admin, scraper and server
// certificates only (router/ops.go), so the client presents this server's
// and expects a router's; without TLS it is nil and the sampler's default
// plain client is used.
func (s *Server) routerOpsClient() *http.Client {
	if s.tls == nil {
		return nil
	}
	return &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: s.tls.ClientConfig(mtls.RoleRouter), MaxIdleConnsPerHost: 1},
	}
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
