package flow

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are flow control's series, per model × class (design §9): the
// classes are bounded by MaxClasses, the models by desired state.
type metrics struct {
	queue      *prometheus.GaugeVec
	oldest     *prometheus.GaugeVec
	wait       *prometheus.HistogramVec
	dispatched *prometheus.CounterVec
	refused    *prometheus.CounterVec
	dropped    *prometheus.CounterVec
	inversions *prometheus.CounterVec
	saturated  *prometheus.GaugeVec

	// shown is whether the last observe left a non-zero oldest wait, so
	// an idle router does not walk its models every tick.
	shown bool
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		queue: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "llmgw_router_flow_queued",
			Help: "Requests waiting in this router's flow-control queue, by base model and priority class."}, []string{"model", "class"}),
		oldest: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "llmgw_router_flow_oldest_wait_seconds",
			Help: "How long the oldest queued request of the model and class has waited (0: none waits)."}, []string{"model", "class"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "llmgw_router_flow_wait_seconds",
			Help:    "Time queued requests waited, observed as they left the queue (dispatched, timed out or their client gone).",
			Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}}, []string{"model", "class"}),
		dispatched: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llmgw_router_flow_dispatched_total",
			Help: "Requests flow control let on to be scheduled: path=\"direct\" as they arrived, \"queued\" after waiting."}, []string{"model", "class", "path"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llmgw_router_flow_refused_total",
			Help: "Requests refused with 429 by flow control: reason queue_full, queue_bytes (a bound of the class's queue) or queue_timeout (waited the class's TTL)."}, []string{"model", "class", "reason"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llmgw_router_flow_dropped_total",
			Help: "Queued requests whose client left before they were dispatched."}, []string{"model", "class"}),
		inversions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llmgw_router_flow_inversions_total",
			Help: "Dispatches of a class while a higher class had waited past flow.inversion_wait here or, as last reported, at another router."}, []string{"model", "class"}),
		saturated: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "llmgw_router_flow_saturated",
			Help: "1 while the model's replicas have no room for another request, as this router sees them."}, []string{"model"}),
	}
	if reg != nil {
		reg.MustRegister(m.queue, m.oldest, m.wait, m.dispatched, m.refused, m.dropped, m.inversions, m.saturated)
	}
	return m
}

func (m *metrics) queued(model, class string, d float64) {
	m.queue.WithLabelValues(model, class).Add(d)
}

func (m *metrics) waited(model, class string, since, now time.Time) {
	m.wait.WithLabelValues(model, class).Observe(now.Sub(since).Seconds())
}

// observe sets the oldest-wait and saturation gauges.
func (m *metrics) observe(c *Controller) {
	if c.queued.Load() == 0 && !m.shown {
		return
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	shown := false
	for _, md := range c.models {
		for rank, q := range md.queues {
			w := 0.0
			if o, ok := q.oldest(); ok {
				w, shown = now.Sub(o).Seconds(), true
			}
			m.oldest.WithLabelValues(md.name, c.cfg.Classes[rank].Name).Set(w)
		}
		room, _, serves := c.room(md)
		sat := 0.0
		if serves && room < 1 {
			sat = 1
		}
		m.saturated.WithLabelValues(md.name).Set(sat)
	}
	m.shown = shown
}
