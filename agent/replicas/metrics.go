package replicas

import (
	"github.com/prometheus/client_golang/prometheus"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// metrics are the replica set's, on the agent's registry (design §9).
type metrics struct {
	desired         prometheus.Gauge
	desiredRevision prometheus.Gauge
	phase           *prometheus.GaugeVec
	restarts        *prometheus.CounterVec
	adoptions       *prometheus.CounterVec
	drains          *prometheus.CounterVec
	drainSeconds    prometheus.Histogram
	externalRefused prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
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
		externalRefused: prometheus.NewCounter(prometheus.CounterOpts{Name: "llmgw_agent_external_refused_dials_total",
			Help: "Connections to external engines refused because the endpoint's host named or resolved to an address the model policy refuses."}),
	}
	for _, c := range []prometheus.Collector{m.drains, m.drainSeconds, m.desired, m.desiredRevision, m.phase, m.restarts, m.adoptions, m.externalRefused} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
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
