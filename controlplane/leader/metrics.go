package leader

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the leader's figures (design §9): its placement decisions
// and its adapter work (design §7.6).
type Metrics struct {
	placements        *prometheus.CounterVec
	adapterPlacements *prometheus.CounterVec
	adapterEnsure     *prometheus.HistogramVec
	adapterWaiters    prometheus.Gauge
	adapterQueued     prometheus.Gauge
	adapterUseRouters prometheus.Gauge
}

// NewMetrics registers the leader's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		placements: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_control_placement_decisions_total", Help: "Placement decisions proposed by this node as leader, by action and result.",
		}, []string{"action", "result"}),
		adapterPlacements: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_control_adapter_placements_total", Help: "Adapter placement decisions committed by this node as leader: place (a cold adapter given a replica), evict (an idle adapter removed to make room), retry (a failed load placed again after its retry-after).",
		}, []string{"action"}),
		adapterEnsure: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "llmgw_control_adapter_ensure_seconds", Help: "Time EnsureAdapter took on the leader, by the state it returned (loaded, failed, busy, timeout).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"result"}),
		adapterWaiters: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmgw_control_adapter_waiters", Help: "EnsureAdapter calls waiting on this node for an adapter to load.",
		}),
		adapterQueued: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmgw_control_adapter_queued_calls", Help: "EnsureAdapter calls waiting on this node in a model's queue for a free adapter slot.",
		}),
		adapterUseRouters: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmgw_control_adapter_use_routers", Help: "Router sessions whose report of requests in flight per adapter this node holds as leader (each counts for 3 s).",
		}),
	}
	reg.MustRegister(m.placements, m.adapterPlacements, m.adapterEnsure, m.adapterWaiters, m.adapterQueued, m.adapterUseRouters)
	return m
}
