package controlplane

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/internal/configfile"
	"github.com/llmgw/llmgw/internal/netlimit"
)

// ListenerLimits bounds the connections a control node's listeners hold
// (design §11 "Limits"). Before them every listener kept whatever a peer
// opened for as long as it liked: 1,500 silent sockets each on the Raft and
// gRPC ports stayed open past 70 s, and at a 1,024-fd limit llmgwctl and
// /healthz failed with "too many open files"; 64 on the gossip port kept
// every server's stream out (issue 26). Each listener has a cap in total
// and per address (package netlimit: past a cap the oldest connection
// still in its handshake, or idle, is closed to make room, and only when
// there is none is the new one refused) and a handshake deadline. The gRPC
// port's caps are settings, as the number of agents and routers a cluster
// serves is the operator's; the others are fixed by what servers and
// scrapers open (serverListeners).
type ListenerLimits struct {
	// GRPCMaxConns bounds the connections to --grpc-addr open at once:
	// each agent and router holds one (two while it fails over), each peer
	// server one for forwarding, llmgwctl one per command.
	GRPCMaxConns int `yaml:"grpc_max_conns"`
	// GRPCMaxConnsPerAddress bounds those from one IP address (an IPv6
	// /64): one host runs an agent and a router or two, but a NAT, `llmgw
	// dev` or a test machine many more, hence well above a few.
	GRPCMaxConnsPerAddress int `yaml:"grpc_max_conns_per_address"`
	// HandshakeTimeout bounds a connection's time from its accept to the
	// end of its handshake on the gRPC, Raft and gossip ports — TLS and
	// gRPC's HTTP/2 preface, a Raft peer's first RPC, a gossip stream's
	// TLS handshake or first byte — after which it is closed. gRPC's own
	// default is 120 s; a handshake on a LAN takes milliseconds.
	HandshakeTimeout time.Duration `yaml:"handshake_timeout"`
}

// DefaultListenerLimits are ListenerLimits' defaults.
func DefaultListenerLimits() ListenerLimits {
	return ListenerLimits{GRPCMaxConns: 4096, GRPCMaxConnsPerAddress: 256, HandshakeTimeout: 10 * time.Second}
}

// The fixed sizes of the other listeners, each well above what its
// legitimate peers open and well below a process's file descriptors.
const (
	// Raft: a peer holds raft's pool of 3, a pipeline and a snapshot
	// stream, and more for a moment when RPCs overlap; a server is one
	// address. 64 leaves room for several servers on one host (dev, tests)
	// and their bursts, 512 for some fifty servers.
	raftMaxConns, raftMaxConnsPerAddr = 512, 64
	// Gossip streams: a push/pull every 30 s and a stream per batch of the
	// ephemeral plane per peer, each closed once read.
	gossipMaxConns, gossipMaxConnsPerAddr = 512, 64
	// HTTP (/metrics, /healthz, /readyz, the console): scrapers, probes
	// and a few browsers of some 6 connections each. net/http's
	// ReadHeaderTimeout (httpReadHeaderTimeout) bounds a silent
	// connection, TLS handshake included, so no deadline of its own.
	httpMaxConns, httpMaxConnsPerAddr = 1024, 128
	httpReadHeaderTimeout             = 5 * time.Second
)

// validate adds c's problems to p.
func (c ListenerLimits) validate(p *configfile.Problems) {
	if c.GRPCMaxConns < 1 {
		p.Add("grpc_max_conns", "must be at least 1, got %d", c.GRPCMaxConns)
	}
	// A per-address cap at or above the total has no effect, and is not
	// refused: grpc_max_conns lowered alone must not need it lowered too.
	if c.GRPCMaxConnsPerAddress < 1 {
		p.Add("grpc_max_conns_per_address", "must be at least 1, got %d", c.GRPCMaxConnsPerAddress)
	}
	if c.HandshakeTimeout < 100*time.Millisecond {
		p.Add("handshake_timeout", "must be at least 100ms, got %s", c.HandshakeTimeout)
	}
}

// serverListeners is a limiter per listener of the node, counting what
// each closes in llmgw_control_connections_dropped_total{listener,reason}
// and what it holds in llmgw_control_connections_open{listener,state}.
type serverListeners struct {
	raft, grpc, gossip, http *netlimit.Limiter
}

func newServerListeners(c ListenerLimits, reg prometheus.Registerer) serverListeners {
	m := netlimit.NewMetrics(reg, "llmgw_control")
	return serverListeners{
		raft: m.New("raft", netlimit.Config{MaxConns: raftMaxConns, MaxConnsPerAddr: raftMaxConnsPerAddr, HandshakeTimeout: c.HandshakeTimeout}),
		// gRPC's server clears the deadline it set once the TLS handshake
		// and the HTTP/2 preface are in: that ends the handshake here too.
		grpc: m.New("grpc", netlimit.Config{MaxConns: c.GRPCMaxConns, MaxConnsPerAddr: c.GRPCMaxConnsPerAddress,
			HandshakeTimeout: c.HandshakeTimeout, ClearedDeadlineEndsHandshake: true}),
		gossip: m.New("gossip", netlimit.Config{MaxConns: gossipMaxConns, MaxConnsPerAddr: gossipMaxConnsPerAddr, HandshakeTimeout: c.HandshakeTimeout}),
		http:   m.New("http", netlimit.Config{MaxConns: httpMaxConns, MaxConnsPerAddr: httpMaxConnsPerAddr}),
	}
}
