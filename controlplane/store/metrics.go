package store

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the store's figures (design §9), taken from raft's API and
// observer into the node's own registry rather than go-metrics' global
// sink.
type Metrics struct {
	leaderChanges prometheus.Counter
	commitSeconds prometheus.Histogram
	applySeconds  prometheus.Histogram
	raftRefused   *prometheus.CounterVec
}

// NewMetrics registers the store's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		leaderChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgw_control_raft_leader_changes_total", Help: "Leader changes this node observed.",
		}),
		commitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "llmgw_control_raft_commit_seconds", Help: "Time from proposing a command to it being applied, on the leader.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		applySeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "llmgw_control_raft_apply_seconds", Help: "Time the FSM took to apply one entry.",
			Buckets: prometheus.ExponentialBuckets(0.00001, 4, 10),
		}),
		raftRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_control_raft_refused_rpcs_total", Help: "Raft RPCs this server refused from a server outside its Raft configuration (design §5.2 \"Cluster identity\"), by rpc.",
		}, []string{"rpc"}),
	}
	reg.MustRegister(m.leaderChanges, m.commitSeconds, m.applySeconds, m.raftRefused)
	return m
}
