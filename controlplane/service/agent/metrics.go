package agent

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the sessions' figures (design §9).
type Metrics struct {
	ephemeralUpdates *prometheus.CounterVec
	kvForeign        prometheus.Counter
	adapterForeign   prometheus.Counter
	statusForeign    prometheus.Counter
	sessionsCut      *prometheus.CounterVec
	hellosRefused    *prometheus.CounterVec
}

// NewMetrics registers the sessions' metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		ephemeralUpdates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_control_ephemeral_updates_total", Help: "Agent updates received, by what the acceptance rule did with them.",
		}, []string{"verdict"}),
		kvForeign: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgw_control_kv_foreign_total", Help: "KV entries dropped because the sending agent's node does not run the replica's leader shard.",
		}),
		adapterForeign: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgw_control_adapter_foreign_total", Help: "Adapter statuses dropped because the sending agent's node does not run the replica.",
		}),
		statusForeign: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgw_control_status_foreign_total", Help: "Replica statuses dropped because they name another node, or the replica's leader shard is on another node.",
		}),
	}
	m.hellosRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgw_control_agent_hellos_refused_total",
		Help: "Agent hellos refused, by reason: identity (the certificate does not name the node, or a server's unforwarded hello), epoch_ahead (more than 5 min past this server's clock), newer_session (a newer session holds the node).",
	}, []string{"reason"})
	reg.MustRegister(m.ephemeralUpdates, m.kvForeign, m.adapterForeign, m.statusForeign, m.hellosRefused)
	m.sessionsCut = newSessionsCut(reg)
	return m
}
