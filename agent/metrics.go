package agent

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// metrics are the agent's own, on its own registry (design §9).
type metrics struct {
	reg             *prometheus.Registry
	attempts        prometheus.Counter
	sessions        prometheus.Counter
	attached        prometheus.Gauge
	reattaches      prometheus.Counter
	reattachSeconds prometheus.Histogram
	updates         *prometheus.CounterVec
	fullRequests    prometheus.Counter
	chunked         prometheus.Counter
	desired         prometheus.Gauge
	desiredRevision prometheus.Gauge
	phase           *prometheus.GaugeVec
	restarts        *prometheus.CounterVec
	adoptions       *prometheus.CounterVec
	drains          *prometheus.CounterVec
	drainSeconds    prometheus.Histogram
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
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
		desired: prometheus.NewGauge(prometheus.GaugeOpts{Name: "llmgw_agent_desired_replicas",
			Help: "Replicas in the last desired set."}),
		desiredRevision: prometheus.NewGauge(prometheus.GaugeOpts{Name: "llmgw_agent_desired_revision",
			Help: "Revision of the last desired set."}),
		phase: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "llmgw_agent_replica_phase",
			Help: "1 for each replica's current phase."}, []string{"replica", "model", "phase"}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llmgw_agent_engine_restarts_total",
			Help: "Engine exits or readiness failures followed by a restart."}, []string{"model"}),
		adoptions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llmgw_agent_engine_adoptions_total",
			Help: "Engines an earlier agent left running, by outcome at start: adopted, gone, unhealthy."}, []string{"result"}),
		drains: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llmgw_agent_drains_total",
			Help: "Draining replicas' engines stopped, by why: idle, not_serving, timeout."}, []string{"result"}),
		drainSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "llmgw_agent_drain_seconds",
			Help: "Time from seeing a replica draining to its engine stopped.", Buckets: prometheus.ExponentialBuckets(0.25, 2, 12)}),
	}
	m.reg.MustRegister(m.drains, m.drainSeconds, m.attempts, m.sessions, m.attached, m.reattaches, m.reattachSeconds, m.updates,
		m.fullRequests, m.chunked, m.desired, m.desiredRevision, m.phase, m.restarts, m.adoptions,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

var phaseNames = func() []string {
	var out []string
	for v := range llmgwv1.ReplicaPhase_name {
		if v != 0 {
			out = append(out, phaseName(llmgwv1.ReplicaPhase(v)))
		}
	}
	return out
}()

func phaseName(p llmgwv1.ReplicaPhase) string {
	s := p.String()
	const prefix = "REPLICA_PHASE_"
	if len(s) > len(prefix) {
		s = s[len(prefix):]
	}
	return s
}

// setPhase marks a replica's phase, clearing the others.
func (m *metrics) setPhase(replica, model string, p llmgwv1.ReplicaPhase) {
	cur := phaseName(p)
	for _, name := range phaseNames {
		v := 0.0
		if name == cur {
			v = 1
		}
		m.phase.WithLabelValues(replica, model, name).Set(v)
	}
}

func (m *metrics) forgetReplica(replica, model string) {
	for _, name := range phaseNames {
		m.phase.DeleteLabelValues(replica, model, name)
	}
}
