package service

import (
	"log/slog"
	"sync"
	"time"

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

// refusalLog logs a refusal at most once per every per caller, so that a
// stranger retrying in a loop cannot flood the log; the metric counts
// every one.
type refusalLog struct {
	log   *slog.Logger
	now   func() time.Time
	every time.Duration
	mu    sync.Mutex
	last  map[string]time.Time
}

// refusalLogCallers bounds the callers remembered: a handful of servers
// in practice; a flood of distinct names clears the memory rather than
// grow it.
const refusalLogCallers = 1024

func (l *refusalLog) note(caller, msg string, args ...any) {
	now := l.now()
	l.mu.Lock()
	if t, ok := l.last[caller]; ok && now.Sub(t) < l.every {
		l.mu.Unlock()
		return
	}
	if len(l.last) >= refusalLogCallers {
		clear(l.last)
	}
	l.last[caller] = now
	l.mu.Unlock()
	l.log.Warn(msg, args...)
}
