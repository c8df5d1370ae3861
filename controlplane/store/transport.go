package store

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/netlimit"
)

// Transport settings, as raft's own TCP transport has them: three pooled
// connections per peer, a 10 s I/O deadline.
const (
	transportPool    = 3
	transportTimeout = 10 * time.Second
)

// newTransport is Raft's network transport on addr: plain TCP when src is
// nil, else mutual TLS where both ends must hold server certificates of
// the cluster's CA.
//
// With TLS, clusterID (nil: none) is carried in the handshake, as the
// ALPN protocol "llmgw-cluster/<id>": an acceptor that knows its cluster's
// id refuses a dialer that offers another, before any RPC is read (design
// §5.2 "Cluster identity"), and calls refused. A peer that offers none — a
// release before identities, or a fresh server — is left to the guard.
//
// conns (nil: none) bounds the listener (design §11 "Limits"): raft's own
// accept loop reads nothing, and its connection handler waits for an RPC
// without a deadline, so a silent socket was held for good (1,500 of them
// stayed open past 70 s, issue 26). Under conns a connection is in its
// handshake until the first byte of an RPC arrives — after the TLS
// handshake, with TLS — and closed if that takes longer than conns'
// handshake timeout; past its caps the oldest connection still in its
// handshake is closed to make room. Once an RPC has come, a connection is
// a peer's pooled one and is never timed out: raft keeps it for the next.
func newTransport(addr string, src *mtls.Source, clusterID func() string, refused func(rpc, from, why string), conns *netlimit.Limiter, log hclog.Logger) (*raft.NetworkTransport, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	// Raft advertises the bound address: it must be one peers can dial
	// (Config.Validate refuses a wildcard --raft-addr).
	if a, ok := lis.Addr().(*net.TCPAddr); !ok || a.IP.IsUnspecified() {
		lis.Close()
		return nil, errors.New("raft transport: the bound address is not advertisable")
	}
	ln := lis
	if conns != nil {
		ln = conns.Listen(lis)
	}
	if src == nil {
		if conns != nil {
			ln = conns.ActiveOnFirstRead(ln)
		}
		return raft.NewNetworkTransportWithLogger(&plainLayer{Listener: ln}, transportPool, transportTimeout, log), nil
	}
	if clusterID == nil {
		clusterID = func() string { return "" }
	}
	// The TLS handshake runs in the first Read of raft's per-connection
	// handler, never in its accept loop.
	ln = tls.NewListener(ln, clusterChecked(src.ServerConfig(mtls.RoleServer), clusterID, refused))
	if conns != nil {
		ln = conns.ActiveOnFirstRead(ln)
	}
	layer := &tlsLayer{Listener: ln, client: src.ClientConfig(mtls.RoleServer), clusterID: clusterID}
	return raft.NewNetworkTransportWithLogger(layer, transportPool, transportTimeout, log), nil
}

// plainLayer is raft's StreamLayer over plain TCP, as raft's own
// TCPStreamLayer, over a listener of ours.
type plainLayer struct{ net.Listener }

func (l *plainLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return (&net.Dialer{Timeout: timeout}).Dial("tcp", string(address))
}

// tlsLayer is raft's StreamLayer over TLS: accepted connections must
// present a server certificate (checked in the handshake, which the first
// read of raft's connection handler runs), and dialed peers must be
// servers of the same CA.
type tlsLayer struct {
	net.Listener
	client    *tls.Config
	clusterID func() string
}

// alpnCluster prefixes the cluster id a Raft dialer offers as its ALPN
// protocol. ALPN is the one part of a TLS handshake a peer of an older
// release ignores without failing, which is why the id rides there.
const alpnCluster = "llmgw-cluster/"

// clusterChecked wraps a server config so that a dialer offering another
// cluster's id is refused in the handshake; one offering this cluster's id
// (or any, while this server knows none) gets it back as the negotiated
// protocol.
func clusterChecked(server *tls.Config, clusterID func() string, refused func(rpc, from, why string)) *tls.Config {
	inner := server.GetConfigForClient
	out := server.Clone()
	out.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		c, err := inner(hello)
		if err != nil {
			return nil, err
		}
		theirs, offered := offeredCluster(hello.SupportedProtos)
		if !offered {
			return c, nil
		}
		if ours := clusterID(); ours != "" && theirs != ours {
			from := hello.Conn.RemoteAddr().String()
			why := fmt.Sprintf("the server at %s is of cluster %q, this one of cluster %s", from, theirs, ours)
			refused("handshake", from, why)
			return nil, fmt.Errorf("raft transport: refused: %s", why)
		}
		c = c.Clone()
		c.NextProtos = []string{alpnCluster + theirs}
		return c, nil
	}
	return out
}

// offeredCluster is the cluster id a dialer offered, if it offered one.
func offeredCluster(protos []string) (string, bool) {
	for _, p := range protos {
		if id, ok := strings.CutPrefix(p, alpnCluster); ok {
			return id, true
		}
	}
	return "", false
}

// Dial connects and completes the handshake within timeout, so a peer that
// is not a server of this CA fails here rather than at raft's first write.
func (l *tlsLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	cfg := l.client
	if id := l.clusterID(); id != "" {
		cfg = cfg.Clone()
		cfg.NextProtos = []string{alpnCluster + id}
	}
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: timeout}, "tcp", string(address), cfg)
	if err != nil {
		return nil, fmt.Errorf("raft transport: dial %s: %w", address, err)
	}
	return c, nil
}
