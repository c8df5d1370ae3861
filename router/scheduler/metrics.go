package scheduler

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	prefix        *prometheus.CounterVec
	kv            *prometheus.CounterVec
	kvSpecHits    prometheus.Counter
	pressure      *prometheus.CounterVec
	session       *prometheus.CounterVec
	clamped       *prometheus.CounterVec
	profileErrors *prometheus.CounterVec
	latency       prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		// The seeds' name, kept so dashboards carry over (design §9).
		prefix: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_prefix_decisions_total",
			Help: "Tier-1 prefix scorer decisions: hit, miss (placed by rendezvous), load_override (imbalance guard), no_prompt.",
		}, []string{"decision"}),
		// Beside the seeds' tier-1 counter, with the seeds' naming.
		kv: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_kv_decisions_total",
			Help: "Tier-2 (precise KV index) prefix decisions: hit, miss (tier 1 places it), load_override, untrusted, or why the index could not answer (no_data, tokenize_timeout, tokenize_error, multimodal, unsupported, short_prompt).",
		}, []string{"decision"}),
		kvSpecHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgw_kv_speculative_hits_total",
			Help: "Tier-2 decisions (hit or untrusted) whose best match counted blocks pending from this router's own sends, not yet confirmed by the engine's events.",
		}),
		pressure: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_kv_pressure_decisions_total",
			Help: "Tier-2 cache-pressure decisions on KV hits: kept (the longest match), evictions (sent where fewer blocks are evicted), session_placed (a new session sent where its planned room fits), session_overfull (fits nowhere: sent where the most room is planned).",
		}, []string{"decision"}),
		session: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_session_decisions_total",
			Help: "Tier-0 session affinity decisions: hit, new (placed by rendezvous), moved (replica gone), load_override (over the load bound).",
		}, []string{"decision"}),
		clamped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_scheduler_scores_clamped_total",
			Help: "Scores outside [0, 1] (or NaN) clamped, by scorer: a scorer bug, not load.",
		}, []string{"scorer"}),
		profileErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_profile_errors_total",
			Help: "Models whose scheduling profile or overrides were refused; they are routed with the default chat profile.",
		}, []string{"model"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "llmgw_router_scheduling_seconds",
			Help:    "Time to make one scheduling decision (filters, scorers, picker).",
			Buckets: []float64{1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2},
		}),
	}
	if reg != nil {
		reg.MustRegister(m.prefix, m.kv, m.kvSpecHits, m.pressure, m.session, m.clamped, m.profileErrors, m.latency)
	}
	return m
}
