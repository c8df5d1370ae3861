package agent

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/internal/netlimit"
)

// The agent's listeners are bounded as a control node's are (design §11
// "Limits", issue 26): a cap in total and per address (package netlimit:
// past a cap the oldest connection still in its handshake, or idle, is
// closed to make room) and a handshake deadline, so silent sockets cannot
// take its file descriptors or keep routers and scrapers out. The sizes
// are fixed: an agent's peers are few and known.
const (
	// LoadService: each router holds one subscription (a connection); 64
	// routers on one address is far past any deployment, 1024 past any
	// fleet of routers.
	loadMaxConns, loadMaxConnsPerAddr = 1024, 64
	// loadHandshakeTimeout bounds a LoadService connection's TLS handshake
	// and HTTP/2 preface (gRPC's ConnectionTimeout, 120 s by default).
	loadHandshakeTimeout = 10 * time.Second
	// HTTP (/metrics, /healthz, /readyz, engine logs): scrapers, probes
	// and llmgwctl. Its ReadHeaderTimeout bounds a silent connection.
	httpMaxConns, httpMaxConnsPerAddr = 256, 64
	httpReadHeaderTimeout             = 10 * time.Second
)

// agentListeners is a limiter per listener, counting what each closes in
// llmgw_agent_connections_dropped_total{listener,reason} and what it holds
// in llmgw_agent_connections_open{listener,state}.
type agentListeners struct{ load, http *netlimit.Limiter }

func newAgentListeners(reg prometheus.Registerer) agentListeners {
	m := netlimit.NewMetrics(reg, "llmgw_agent")
	return agentListeners{
		// gRPC's server clears the deadline it set once its handshake is
		// done: that ends the handshake here too.
		load: m.New("load", netlimit.Config{MaxConns: loadMaxConns, MaxConnsPerAddr: loadMaxConnsPerAddr,
			HandshakeTimeout: loadHandshakeTimeout, ClearedDeadlineEndsHandshake: true}),
		http: m.New("http", netlimit.Config{MaxConns: httpMaxConns, MaxConnsPerAddr: httpMaxConnsPerAddr}),
	}
}
