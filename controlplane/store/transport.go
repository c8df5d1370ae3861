package store

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/llmgw/llmgw/internal/mtls"
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
func newTransport(addr string, src *mtls.Source, log hclog.Logger) (*raft.NetworkTransport, error) {
	if src == nil {
		return raft.NewTCPTransportWithLogger(addr, nil, transportPool, transportTimeout, log)
	}
	layer, err := newTLSLayer(addr, src)
	if err != nil {
		return nil, err
	}
	return raft.NewNetworkTransportWithLogger(layer, transportPool, transportTimeout, log), nil
}

// tlsLayer is raft's StreamLayer over TLS: accepted connections must
// present a server certificate (checked in the handshake, which the first
// read of raft's connection handler runs), and dialed peers must be
// servers of the same CA.
type tlsLayer struct {
	net.Listener
	client *tls.Config
}

func newTLSLayer(addr string, src *mtls.Source) (*tlsLayer, error) {
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
	return &tlsLayer{
		Listener: tls.NewListener(lis, src.ServerConfig(mtls.RoleServer)),
		client:   src.ClientConfig(mtls.RoleServer),
	}, nil
}

// Dial connects and completes the handshake within timeout, so a peer that
// is not a server of this CA fails here rather than at raft's first write.
func (l *tlsLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: timeout}, "tcp", string(address), l.client)
	if err != nil {
		return nil, fmt.Errorf("raft transport: dial %s: %w", address, err)
	}
	return c, nil
}
