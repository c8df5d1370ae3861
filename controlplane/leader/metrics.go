package leader

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the leader's figures (design §9): its placement decisions
// its adapter work (design §7.6) and the leased shares of the tenants'
// limits (design §7.7).
type Metrics struct {
	placements        *prometheus.CounterVec
	adapterPlacements *prometheus.CounterVec
	adapterEnsure     *prometheus.HistogramVec
	adapterWaiters    prometheus.Gauge
	adapterQueued     prometheus.Gauge
	adapterUseRouters prometheus.Gauge
	quotaSessions     prometheus.Gauge
	quotaSettling     prometheus.Gauge
	// The autoscaler (design §5.7), per autoscaled model; a model's
	// series go when it does, and every series when the term ends.
	scaleCount       *prometheus.GaugeVec
	scaleRecommended *prometheus.GaugeVec
	scaleHeld        *prometheus.GaugeVec
	scaleSteps       *prometheus.CounterVec
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
		quotaSessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmgw_control_quota_sessions", Help: "Router sessions whose leased shares of tenants' limits this node holds as leader (each counts until its lease has ended and it has been silent for the hold, 30 s by default).",
		}),
		quotaSettling: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmgw_control_quota_settling", Help: "1 while this node, leader since less than the settle time (12 s by default), grants no shares of tenants' limits: the old leader's leases are running out. 0 once it grants, and on a node that does not lead.",
		}),
	}
	m.scaleCount = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "llmgw_control_autoscale_replicas", Help: "The count placement works to for each autoscaled model, as this node's autoscaler last saw it as leader.",
	}, []string{"model"})
	m.scaleRecommended = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "llmgw_control_autoscale_recommended_replicas", Help: "The count each autoscaled model's targets asked for in this leader's last round (within the spec's min and max).",
	}, []string{"model"})
	m.scaleHeld = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "llmgw_control_autoscale_held", Help: "1 while a rule keeps an autoscaled model at a count its targets do not ask for (a cooldown, replicas still starting, the step-down window), 0 otherwise.",
	}, []string{"model"})
	m.scaleSteps = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgw_control_autoscale_steps_total", Help: "Autoscale steps this node committed as leader, by model and direction (up, down).",
	}, []string{"model", "direction"})
	reg.MustRegister(m.placements, m.adapterPlacements, m.adapterEnsure, m.adapterWaiters, m.adapterQueued, m.adapterUseRouters,
		m.quotaSessions, m.quotaSettling, m.scaleCount, m.scaleRecommended, m.scaleHeld, m.scaleSteps)
	return m
}
