package controlplane

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are this node's own figures in its own registry (plan §9). Raft's
// alerted figures come from raft's API and observer, per node, not from the
// go-metrics global sink.
type metrics struct {
	reg *prometheus.Registry

	leaderChanges    prometheus.Counter
	commitSeconds    prometheus.Histogram
	applySeconds     prometheus.Histogram
	agentSessions    prometheus.Gauge
	ephemeralUpdates *prometheus.CounterVec
	kvForeign        prometheus.Counter
	watchers         prometheus.Gauge
	watchOverflows   prometheus.Counter
	watchSnapshots   prometheus.Counter
	placements       *prometheus.CounterVec

	// LoRA adapters (plan §7.6).
	adapterForeign    prometheus.Counter
	adapterPlacements *prometheus.CounterVec
	adapterEnsure     *prometheus.HistogramVec
	adapterWaiters    prometheus.Gauge
}

// raftView is what the gauges read from raft when scraped.
type raftView interface {
	hasLeader() bool
	isLeader() bool
	lastContactSeconds() float64
	revision() uint64
	// clusterFigures is autopilot's health, failure tolerance and voters.
	clusterFigures() (healthy bool, tolerance, voters int)
}

func newMetrics(v raftView) *metrics {
	reg := prometheus.NewRegistry()
	m := &metrics{
		reg: reg,
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
		agentSessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmgw_control_agent_sessions", Help: "Agent sessions attached to this node.",
		}),
		ephemeralUpdates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_control_ephemeral_updates_total", Help: "Agent updates received, by what the acceptance rule did with them.",
		}, []string{"verdict"}),
		kvForeign: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgw_control_kv_foreign_total", Help: "KV entries dropped because the sending agent's node does not run the replica's leader shard.",
		}),
		watchers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmgw_control_watchers", Help: "Watch streams open on this node.",
		}),
		watchOverflows: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgw_control_watch_overflows_total", Help: "Watchers disconnected because they fell behind.",
		}),
		watchSnapshots: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgw_control_watch_snapshots_total", Help: "Framed snapshots sent to watchers.",
		}),
		placements: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_control_placement_decisions_total", Help: "Placement decisions proposed by this node as leader, by action and result.",
		}, []string{"action", "result"}),
		adapterForeign: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgw_control_adapter_foreign_total", Help: "Adapter statuses dropped because the sending agent's node does not run the replica.",
		}),
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
	}
	boolGauge := func(f func() bool) func() float64 {
		return func() float64 {
			if f() {
				return 1
			}
			return 0
		}
	}
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.leaderChanges, m.commitSeconds, m.applySeconds, m.agentSessions, m.ephemeralUpdates, m.kvForeign,
		m.watchers, m.watchOverflows, m.watchSnapshots, m.placements,
		m.adapterForeign, m.adapterPlacements, m.adapterEnsure, m.adapterWaiters,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "llmgw_control_raft_has_leader", Help: "1 when this node knows a leader.",
		}, boolGauge(v.hasLeader)),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "llmgw_control_raft_is_leader", Help: "1 when this node is the leader.",
		}, boolGauge(v.isLeader)),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "llmgw_control_raft_last_contact_seconds", Help: "Time since this follower last heard from the leader; 0 on the leader.",
		}, v.lastContactSeconds),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "llmgw_control_autopilot_healthy", Help: "1 when autopilot judges every server healthy (the leader's judgement; other servers estimate from gossip).",
		}, boolGauge(func() bool { h, _, _ := v.clusterFigures(); return h })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "llmgw_control_autopilot_failure_tolerance", Help: "Voters that may fail before quorum is lost.",
		}, func() float64 { _, ft, _ := v.clusterFigures(); return float64(ft) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "llmgw_control_raft_voters", Help: "Voters in the Raft configuration.",
		}, func() float64 { _, _, n := v.clusterFigures(); return float64(n) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "llmgw_control_raft_applied_revision", Help: "Revision (Raft index) of the last applied entry.",
		}, func() float64 { return float64(v.revision()) }),
	)
	return m
}
