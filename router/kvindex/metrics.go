package kvindex

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	updates *prometheus.CounterVec
	lookup  prometheus.Histogram
	specLag prometheus.Histogram
}

// newMetrics registers the index's metrics. The sizes are read at scrape
// time under the read lock rather than kept in gauges on every store: a
// scrape is rare, a store is not.
func newMetrics(x *Index, reg prometheus.Registerer) *metrics {
	m := &metrics{
		updates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_kvindex_updates_total",
			Help: "Per-replica KV updates from the watch stream: applied, stale (older incarnation), unknown (a delta without a base), invalid.",
		}, []string{"result"}),
		lookup: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "llmgw_router_kvindex_lookup_seconds",
			Help:    "Time to answer how many leading blocks of a prompt each replica holds.",
			Buckets: []float64{1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 5e-4, 1e-3},
		}),
		specLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "llmgw_router_kvindex_speculative_lag_seconds",
			Help:    "Time from recording a speculative entry (the router's send) to the engine's event confirming it: what the speculative TTL adapts to.",
			Buckets: []float64{.05, .1, .2, .3, .5, .75, 1, 1.5, 2, 3, 5, 10},
		}),
	}
	for _, r := range []string{ResultApplied, ResultStale, ResultUnknown, ResultInvalid} {
		m.updates.WithLabelValues(r)
	}
	if reg == nil {
		return m
	}
	size := func(f func(Size) float64) func() float64 { return func() float64 { return f(x.Size()) } }
	spec := func(f func(SpecStats) float64) func() float64 { return func() float64 { return f(x.SpecStats()) } }
	reg.MustRegister(m.specLag,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "llmgw_router_kvindex_speculative_pending", Help: "Speculative (block, replica) entries pending: sent by this router, not yet confirmed by the engine's events.",
		}, spec(func(s SpecStats) float64 { return float64(s.Pending) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "llmgw_router_kvindex_speculative_ttl_seconds", Help: "The TTL of speculative entries now: twice the p99 of recent confirmation lags, within kv_speculation_ttl_min and _max.",
		}, spec(func(s SpecStats) float64 { return s.TTL.Seconds() })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "llmgw_router_kvindex_speculative_recorded_total", Help: "Speculative entries recorded: prompt blocks sent to a replica not known to hold them.",
		}, spec(func(s SpecStats) float64 { return float64(s.Recorded) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "llmgw_router_kvindex_speculative_confirmed_total", Help: "Speculative entries confirmed by the engine's store events.",
		}, spec(func(s SpecStats) float64 { return float64(s.Confirmed) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "llmgw_router_kvindex_speculative_expired_total", Help: "Speculative entries expired by the TTL without a confirmation.",
		}, spec(func(s SpecStats) float64 { return float64(s.Expired) })),
	)
	for _, reason := range []string{DropRemoved, DropReset, DropUntrusted, DropFull, DropWithdrawn} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "llmgw_router_kvindex_speculative_dropped_total",
			Help:        "Speculative entries dropped before confirmation or expiry, by reason: removed (a removal event), reset, untrusted, full (a bound), withdrawn (the attempt failed).",
			ConstLabels: prometheus.Labels{"reason": reason},
		}, spec(func(s SpecStats) float64 { return float64(s.Dropped[reason]) })))
	}
	reg.MustRegister(m.updates, m.lookup,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "llmgw_router_kvindex_blocks", Help: "Distinct KV block hashes held by any replica.",
		}, size(func(s Size) float64 { return float64(s.Blocks) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "llmgw_router_kvindex_entries", Help: "(block, replica) pairs in the index.",
		}, size(func(s Size) float64 { return float64(s.Entries) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "llmgw_router_kvindex_replicas", Help: "Replica incarnations the index holds KV state for.",
		}, size(func(s Size) float64 { return float64(s.Replicas) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "llmgw_router_kvindex_dropped_blocks_total", Help: "Block stores refused because the index was at its entry bound (it under-reports).",
		}, size(func(s Size) float64 { return float64(s.Dropped) })),
	)
	return m
}

func (m *metrics) update(err error) {
	switch {
	case err == nil:
		m.updates.WithLabelValues(ResultApplied).Inc()
	case errors.Is(err, ErrStale):
		m.updates.WithLabelValues(ResultStale).Inc()
	case errors.Is(err, ErrUnknown):
		m.updates.WithLabelValues(ResultUnknown).Inc()
	default:
		m.updates.WithLabelValues(ResultInvalid).Inc()
	}
}
