package adapters

import "github.com/prometheus/client_golang/prometheus"

// metrics are the manager's (design §9), on the agent's registry.
type metrics struct {
	loads   *prometheus.CounterVec
	unloads prometheus.Counter
	// unloadsDeferred: unloads not made because a fresh reading showed
	// requests for the adapter in the engine.
	unloadsDeferred prometheus.Counter
	// unloadsOverdue: unloads made although the reading showed requests,
	// the adapter having been removed UnloadDeferMax ago.
	unloadsOverdue prometheus.Counter
	loadSeconds    prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		loads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llmgw_agent_adapter_loads_total",
			Help: "LoRA adapter loads through engines' runtime API, by result (ok; failed; full: refused while a removed adapter held its slot, loaded after the unload)."}, []string{"result"}),
		unloads: prometheus.NewCounter(prometheus.CounterOpts{Name: "llmgw_agent_adapter_unloads_total",
			Help: "LoRA adapters unloaded after being removed from the placement and idle."}),
		unloadsDeferred: prometheus.NewCounter(prometheus.CounterOpts{Name: "llmgw_agent_adapter_unloads_deferred_total",
			Help: "Unloads of removed adapters put off because a fresh reading just before showed requests for them in the engine."}),
		unloadsOverdue: prometheus.NewCounter(prometheus.CounterOpts{Name: "llmgw_agent_adapter_unloads_overdue_total",
			Help: "Unloads of removed adapters made although the engine's reading still showed requests for them, the adapter having been removed longer ago than the bound (a stuck activity metric, or a router that did not learn of the removal)."}),
		loadSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "llmgw_agent_adapter_load_seconds",
			Help:    "Time for an engine to load a LoRA adapter (successful loads).",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}}),
	}
	for _, r := range []string{"ok", "failed", "full"} {
		m.loads.WithLabelValues(r)
	}
	for _, c := range []prometheus.Collector{m.loads, m.unloads, m.unloadsDeferred, m.unloadsOverdue, m.loadSeconds} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
