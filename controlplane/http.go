package controlplane

import (
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/llmgw/llmgw/controlplane/console"
)

// httpHandler serves /metrics (the node's own registry), /healthz (the
// process is up), /readyz (see the package doc: a leader is known and,
// when it is this node, past its Barrier; not refused by the cluster) and
// the web console under /ui/ (package console).
func (s *Server) httpHandler(c *console.Console) http.Handler {
	mux := http.NewServeMux()
	c.Register(mux)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		switch {
		case !s.serving.Load():
			http.Error(w, "not serving gRPC", http.StatusServiceUnavailable)
		case s.members.VersionProblem() != "":
			http.Error(w, "refused by the cluster: "+s.members.VersionProblem(), http.StatusServiceUnavailable)
		case s.members.BootstrapProblem() != "":
			http.Error(w, "bootstrap refused: "+s.members.BootstrapProblem(), http.StatusServiceUnavailable)
		case !s.store.HasLeader():
			http.Error(w, "no raft leader", http.StatusServiceUnavailable)
		default:
			fmt.Fprintln(w, "ready")
		}
	})
	return mux
}

// registerGauges registers the process collectors and the gauges read from
// Raft and the membership when scraped (design §9). Run calls it once
// s.store and s.members exist, before it serves /metrics.
func (s *Server) registerGauges() {
	boolGauge := func(f func() bool) func() float64 {
		return func() float64 {
			if f() {
				return 1
			}
			return 0
		}
	}
	figure := func(f func(healthy bool, tolerance, voters int) float64) func() float64 {
		return func() float64 { return f(s.members.Figures()) }
	}
	s.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "llmgw_control_raft_has_leader", Help: "1 when this node knows a leader.",
		}, boolGauge(func() bool { return s.store.HasLeader() })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "llmgw_control_raft_is_leader", Help: "1 when this node is the leader.",
		}, boolGauge(func() bool { return s.store.IsLeader() })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "llmgw_control_raft_last_contact_seconds", Help: "Time since this follower last heard from the leader; 0 on the leader.",
		}, s.store.LastContactSeconds),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "llmgw_control_autopilot_healthy", Help: "1 when autopilot judges every server healthy (the leader's judgement; other servers estimate from gossip).",
		}, figure(func(h bool, _, _ int) float64 {
			if h {
				return 1
			}
			return 0
		})),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "llmgw_control_autopilot_failure_tolerance", Help: "Voters that may fail before quorum is lost.",
		}, figure(func(_ bool, ft, _ int) float64 { return float64(ft) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "llmgw_control_raft_voters", Help: "Voters in the Raft configuration.",
		}, figure(func(_ bool, _, n int) float64 { return float64(n) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "llmgw_control_raft_applied_revision", Help: "Revision (Raft index) of the last applied entry.",
		}, func() float64 { return float64(s.fsm.Revision()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "llmgw_control_servers_unverified_total", Help: "Gossip members kept out of Raft because their server certificate could not be verified (design §11); counted per attempt.",
		}, func() float64 { return float64(s.members.Unverified()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "llmgw_control_gossip_raft_mismatch", Help: "Servers of the Raft configuration this server's gossip does not see alive: down, or not healed since a partition (design §5.2).",
		}, func() float64 { return float64(s.members.GossipRaftMismatch()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "llmgw_control_gossip_reconnect_attempts_total", Help: "Attempts of gossip's reconnect loop on servers it sees failed (design §5.2).",
		}, func() float64 { a, _ := s.reconnectStats(); return float64(a) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "llmgw_control_gossip_reconnects_total", Help: "Failed servers gossip's reconnect loop brought back alive.",
		}, func() float64 { _, n := s.reconnectStats(); return float64(n) }),
	)
}

// reconnectStats is gossip's reconnect counters, 0 without gossip.
func (s *Server) reconnectStats() (attempts, reconnected uint64) {
	if s.gossip == nil {
		return 0, 0
	}
	return s.gossip.ReconnectStats()
}
