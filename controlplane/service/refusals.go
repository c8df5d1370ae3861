package service

import (
	"github.com/prometheus/client_golang/prometheus"
)

// AuthzMetrics are the Authorizer's figures (design §9).
type AuthzMetrics struct {
	serverRefused *prometheus.CounterVec
}

// NewAuthzMetrics registers the Authorizer's metrics with reg.
func NewAuthzMetrics(reg prometheus.Registerer) *AuthzMetrics {
	m := &AuthzMetrics{serverRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgw_control_server_calls_refused_total",
		Help: "gRPC calls refused because the caller's server certificate names no server of this server's Raft configuration (design §11), by method.",
	}, []string{"method"})}
	reg.MustRegister(m.serverRefused)
	return m
}

func (m *AuthzMetrics) refused(method string) {
	if m != nil {
		m.serverRefused.WithLabelValues(method).Inc()
	}
}
