package cluster

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/llmgw/llmgw/internal/mtls"
)

// mdForwarded marks a call one server forwarded to another: the receiver
// answers it itself (or refuses), never forwards it again, so a leader
// change in flight cannot make calls bounce between servers.
const mdForwarded = "llmgw-forwarded"

// IsForwarded reports whether an incoming call was forwarded by another
// server.
func IsForwarded(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(mdForwarded)) > 0
}

// ForwardedContext marks an outgoing call to another server as forwarded
// by server from.
func ForwardedContext(ctx context.Context, from string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, mdForwarded, from)
}

// Pool holds one client connection per peer gRPC address, for forwarding,
// bootstrap's and autopilot's questions to the other servers. Connections
// are created lazily and closed together when the node stops. With TLS
// they present this server's certificate and accept only a peer holding a
// server certificate of the same CA (design §11).
type Pool struct {
	tls    *mtls.Source
	opts   []grpc.DialOption // added to every connection's (tracing)
	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	closed bool
}

// NewPool returns an empty pool dialing with src (nil: plain text) and
// opts (the node's gRPC tracing, design §9).
func NewPool(src *mtls.Source, opts ...grpc.DialOption) *Pool {
	return &Pool{tls: src, opts: opts, conns: map[string]*grpc.ClientConn{}}
}

// Conn returns the connection to addr; a closed pool (or a bad address)
// yields a connection whose calls fail, never nil.
func (p *Pool) Conn(addr string) grpc.ClientConnInterface {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.conns[addr]; ok {
		return c
	}
	if p.closed {
		return closedConn()
	}
	c, err := grpc.NewClient("passthrough:///"+addr, append([]grpc.DialOption{mtls.DialOption(p.tls, mtls.RoleServer)}, p.opts...)...)
	if err != nil {
		// NewClient fails only on a malformed target; the call on this
		// placeholder fails the same way a dead peer would, and nothing
		// is dialed for it.
		return closedConn()
	}
	p.conns[addr] = c
	return c
}

// closedConn is a connection whose every call fails at once: it is closed
// before it could dial anything.
func closedConn() *grpc.ClientConn {
	c, _ := grpc.NewClient("passthrough:///127.0.0.1:1", grpc.WithTransportCredentials(insecure.NewCredentials()))
	c.Close()
	return c
}

// Close closes every connection; later Conns fail their calls.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for a, c := range p.conns {
		c.Close()
		delete(p.conns, a)
	}
}
