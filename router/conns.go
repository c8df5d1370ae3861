package router

import (
	"net"
	"net/http"

	"github.com/llmgw/llmgw/internal/configfile"
	"github.com/llmgw/llmgw/internal/netlimit"
)

// This file bounds the API listener's connections (design §11 "Limits"):
// --max-connections in total and --max-conns-per-addr from one address.
// Before, the router had the total alone, and past it new connections
// waited in the kernel's backlog: one client opening 4,096 keep-alive
// connections, each after one GET /healthz, held every slot for the 120 s
// idle timeout, and 8 of 8 other clients' requests timed out (issue 26).
// Now (package netlimit) a connection past a cap makes room by closing the
// oldest connection that is idle between requests, or has not sent its
// first request yet — of its own address for the per-address cap — and
// is closed at once itself only when every connection within the cap is
// serving a request. So no address can hold more than its share, and
// idle connections, whoever holds them, never keep a new client out.
//
// A connection is in its "handshake" until net/http reads its first
// request (ConnState active), which ReadHeaderTimeout bounds, TLS
// handshake included, so the listener needs no deadline of its own. Idle
// is net/http's StateIdle (HTTP/1 keep-alive; HTTP/2 with no stream open).
// Closing an idle keep-alive connection is what IdleTimeout does anyway;
// clients reopen one.

// validateConns adds the connection caps' problems to p.
func (c Config) validateConns(p *configfile.Problems) {
	if c.MaxConnections < 0 {
		p.Add(configfile.Flag("max-connections"), "must not be negative (0: no cap), got %d", c.MaxConnections)
	}
	// A per-address cap at or above the total is allowed, and has no
	// effect: --max-connections lowered alone must not be refused.
	if c.MaxConnsPerAddr < 0 {
		p.Add(configfile.Flag("max-conns-per-addr"), "must not be negative (0: no cap), got %d", c.MaxConnsPerAddr)
	}
}

// limitConns wraps ln in the caps and hooks srv's ConnState to them,
// counting what they close in llmgw_router_connections_dropped_total
// {listener="api",reason} and what is open in
// llmgw_router_connections_open{listener="api",state}. With both caps 0 it
// returns ln as it is: nothing is counted or tracked per connection (the
// benchmarks' "caps off").
func (r *Router) limitConns(ln net.Listener, srv *http.Server) net.Listener {
	if r.cfg.MaxConnections == 0 && r.cfg.MaxConnsPerAddr == 0 {
		return ln
	}
	lim := r.connMetrics().New("api", netlimit.Config{MaxConns: r.cfg.MaxConnections, MaxConnsPerAddr: r.cfg.MaxConnsPerAddr})
	srv.ConnState = lim.ConnState
	return lim.Listen(ln)
}

// connMetrics is the connection metrics both of the router's listeners
// (api, ops) register under, created once: a family registers once.
func (r *Router) connMetrics() *netlimit.Metrics {
	r.connMetricsOnce.Do(func() { r.connMetricsV = netlimit.NewMetrics(r.reg, "llmgw_router") })
	return r.connMetricsV
}
