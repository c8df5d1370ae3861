package breaker

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Set holds one breaker per replica incarnation, created on first use.
// Keys are the caller's replica identity — (uid, incarnation) per design §4 —
// so a restarted engine starts with a closed breaker. Safe for concurrent use.
type Set[K comparable] struct {
	cfg   Config
	label func(K) string

	mu sync.Mutex
	m  map[K]*Breaker

	state       *prometheus.GaugeVec
	transitions *prometheus.CounterVec
}

// NewSet returns an empty set. label names a key in metrics (the replica
// id); reg receives the metrics and may be nil.
func NewSet[K comparable](cfg Config, label func(K) string, reg prometheus.Registerer) (*Set[K], error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Set[K]{cfg: cfg, label: label, m: make(map[K]*Breaker),
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "llmgw_router_breaker_state",
			Help: "Circuit breaker per replica: 0 closed, 1 open, 2 half-open (probing).",
		}, []string{"replica"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_breaker_transitions_total",
			Help: "Circuit breaker transitions, by the state entered.",
		}, []string{"to"}),
	}
	if reg != nil {
		reg.MustRegister(s.state, s.transitions)
	}
	return s, nil
}

// Get returns k's breaker, creating a closed one.
func (s *Set[K]) Get(k K) *Breaker {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b := s.m[k]; b != nil {
		return b
	}
	name := s.label(k)
	g := s.state.WithLabelValues(name)
	g.Set(float64(Closed))
	b := New(s.cfg, func(_, to State) {
		g.Set(float64(to))
		s.transitions.WithLabelValues(to.String()).Inc()
	})
	s.m[k] = b
	return b
}

// Peek returns k's breaker without creating one; a replica never tried
// has none and counts as closed.
func (s *Set[K]) Peek(k K) *Breaker {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[k]
}

// Retain drops the breakers (and their metric series) of keys keep
// rejects: replicas that are gone. Call it when the routing table changes.
func (s *Set[K]) Retain(keep func(K) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	live := make(map[string]bool)
	var gone []string
	for k := range s.m {
		if keep(k) {
			live[s.label(k)] = true
			continue
		}
		gone = append(gone, s.label(k))
		delete(s.m, k)
	}
	for _, name := range gone {
		if !live[name] { // another incarnation of the same replica keeps the series
			s.state.DeleteLabelValues(name)
		}
	}
}

// Len is the number of breakers held.
func (s *Set[K]) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}
