package session

import "github.com/prometheus/client_golang/prometheus"

// metrics are the session's, on the agent's registry (design §9).
type metrics struct {
	attempts        prometheus.Counter
	sessions        prometheus.Counter
	attached        prometheus.Gauge
	reattaches      prometheus.Counter
	reattachSeconds prometheus.Histogram
	updates         *prometheus.CounterVec
	fullRequests    prometheus.Counter
	chunked         prometheus.Counter
	superseded      *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		attempts: prometheus.NewCounter(prometheus.CounterOpts{Name: "llmgw_agent_session_attempts_total",
			Help: "Attach attempts to a control node."}),
		sessions: prometheus.NewCounter(prometheus.CounterOpts{Name: "llmgw_agent_sessions_total",
			Help: "Sessions a control node welcomed."}),
		attached: prometheus.NewGauge(prometheus.GaugeOpts{Name: "llmgw_agent_session_attached",
			Help: "1 while a session with a control node is up."}),
		reattaches: prometheus.NewCounter(prometheus.CounterOpts{Name: "llmgw_agent_reattaches_total",
			Help: "Sessions welcomed after an earlier one was lost."}),
		reattachSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "llmgw_agent_reattach_seconds",
			Help: "Time from losing a session to the next welcome.", Buckets: prometheus.ExponentialBuckets(0.05, 2, 12)}),
		updates: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llmgw_agent_updates_sent_total",
			Help: "Ephemeral updates sent, by kind (full, delta)."}, []string{"kind"}),
		fullRequests: prometheus.NewCounter(prometheus.CounterOpts{Name: "llmgw_agent_full_copy_requests_total",
			Help: "Full copies the control node asked for."}),
		chunked: prometheus.NewCounter(prometheus.CounterOpts{Name: "llmgw_agent_chunked_updates_total",
			Help: "Ephemeral updates sent as chunks, being larger than the control node's chunk budget."}),
		superseded: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llmgw_agent_sessions_superseded_total",
			Help: "Hellos refused or sessions ended because a newer session of this node was held: raised (the next epoch goes above it) or ignored (its epoch was too far ahead of this agent's clock)."}, []string{"held"}),
	}
	for _, c := range []prometheus.Collector{m.attempts, m.sessions, m.attached, m.reattaches, m.reattachSeconds,
		m.updates, m.fullRequests, m.chunked, m.superseded} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
