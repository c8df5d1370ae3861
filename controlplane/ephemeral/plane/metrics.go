package plane

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the plane's figures (design §9: ephemeral-plane lag and drops),
// registered in the control node's own registry.
type Metrics struct {
	forwarded        prometheus.Counter
	peerUpdates      *prometheus.CounterVec
	lag              prometheus.Histogram
	drops            *prometheus.CounterVec
	gaps             *prometheus.CounterVec
	fullCopyRequests *prometheus.CounterVec
}

// NewMetrics creates the plane's metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		forwarded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgw_control_ephemeral_forwarded_total", Help: "Agent updates sent to peer control nodes (counted per peer).",
		}),
		peerUpdates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_control_ephemeral_peer_updates_total", Help: "Updates received from peer control nodes, by what the acceptance rule did with them (accepted_late: held for reordering, then applied).",
		}, []string{"verdict"}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "llmgw_control_ephemeral_lag_seconds",
			Help:    "Time from the owning control node receiving an agent update to this node applying it (across hosts' clocks).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		drops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_control_ephemeral_drops_total", Help: "Updates or messages the plane dropped, by reason; each is repaired by a full copy.",
		}, []string{"reason"}),
		gaps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_control_ephemeral_gaps_total", Help: "Gaps in an agent's updates from peers, by what revealed them (a sequence gap, or a digest).",
		}, []string{"detected_by"}),
		fullCopyRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_control_ephemeral_full_copy_requests_total", Help: "Full-copy requests between control nodes, by direction.",
		}, []string{"direction"}),
	}
	reg.MustRegister(m.forwarded, m.peerUpdates, m.lag, m.drops, m.gaps, m.fullCopyRequests)
	return m
}
