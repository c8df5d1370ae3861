package watch

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the watch streams' figures (design §9).
type Metrics struct {
	watchers       prometheus.Gauge
	watchOverflows prometheus.Counter
	watchSnapshots prometheus.Counter
	chunked        prometheus.Counter
}

// NewMetrics registers the watch streams' metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		watchers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmgw_control_watchers", Help: "Watch streams open on this node.",
		}),
		watchOverflows: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgw_control_watch_overflows_total", Help: "Watchers disconnected because they fell behind.",
		}),
		watchSnapshots: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgw_control_watch_snapshots_total", Help: "Framed snapshots sent to watchers.",
		}),
		chunked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgw_control_watch_chunked_updates_total", Help: "Ephemeral updates sent to watchers as chunks, being larger than ephemeral_chunk_bytes.",
		}),
	}
	reg.MustRegister(m.watchers, m.watchOverflows, m.watchSnapshots, m.chunked)
	return m
}
