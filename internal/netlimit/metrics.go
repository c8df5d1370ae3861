package netlimit

import "github.com/prometheus/client_golang/prometheus"

// Metrics counts, for one component, what its limiters close and hold:
// PREFIX_connections_dropped_total{listener,reason} and
// PREFIX_connections_open{listener,state}, on the registry it is given
// (there is no global one). One per component, a limiter per listener.
type Metrics struct {
	reg     prometheus.Registerer
	prefix  string
	dropped *prometheus.CounterVec
}

// NewMetrics registers the dropped counter on reg; prefix names the
// component ("llmgw_control").
func NewMetrics(reg prometheus.Registerer, prefix string) *Metrics {
	m := &Metrics{reg: reg, prefix: prefix, dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: prefix + "_connections_dropped_total",
		Help: "Connections a listener closed to stay within its limits, by listener and reason: a new one over its cap in total or per address with nothing to evict (total, per_address), the oldest one still in its handshake or idle closed to make room (evicted_handshake, evicted_idle), or one with no handshake within the deadline (handshake_timeout).",
	}, []string{"listener", "reason"})}
	reg.MustRegister(m.dropped)
	return m
}

// New returns a limiter for cfg (its OnDrop replaced) whose drops and open
// connections are counted as listener's.
func (m *Metrics) New(listener string, cfg Config) *Limiter {
	byReason := map[Reason]prometheus.Counter{}
	for _, r := range Reasons {
		byReason[r] = m.dropped.WithLabelValues(listener, r.String())
	}
	cfg.OnDrop = func(r Reason) { byReason[r].Inc() }
	l := New(cfg)
	for state, count := range map[string]func(handshaking, busy, waiting int) int{
		"handshake": func(h, _, _ int) int { return h },
		"active":    func(_, a, _ int) int { return a },
		"idle":      func(_, _, i int) int { return i },
	} {
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: m.prefix + "_connections_open", ConstLabels: prometheus.Labels{"listener": listener, "state": state},
			Help: "Connections open on a listener, by listener and state: before the end of their handshake (handshake), serving (active), between requests (idle).",
		}, func() float64 { return float64(count(l.Counts())) }))
	}
	return l
}
