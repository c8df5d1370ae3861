package sessions

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Remote is what the other control servers announce of their sessions
// (package plane). Safe for concurrent use.
type Remote interface {
	// Live reports whether another server holds a live session for node
	// and, when none does, when the last one ended as seen here (zero if
	// never seen).
	Live(node string) (live bool, endedAt time.Time)
	// LiveNodes is every node another server holds a live session for.
	LiveNodes() []string
}

// Registry counts this server's agent sessions per node. Safe for
// concurrent use.
type Registry struct {
	remote Remote
	now    func() time.Time
	gauge  prometheus.Gauge

	mu         sync.Mutex
	attached   map[string]int       // node id -> attached sessions here
	detachedAt map[string]time.Time // node id -> when its last session here ended
}

// New returns an empty registry over remote; now stamps session ends. It
// registers llmgw_control_agent_sessions with reg.
func New(remote Remote, now func() time.Time, reg prometheus.Registerer) *Registry {
	r := &Registry{
		remote: remote, now: now,
		gauge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmgw_control_agent_sessions", Help: "Agent sessions attached to this node.",
		}),
		attached:   map[string]int{},
		detachedAt: map[string]time.Time{},
	}
	reg.MustRegister(r.gauge)
	return r
}

// Started records a session for node attached here.
func (r *Registry) Started(node string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.attached[node]++
	delete(r.detachedAt, node)
	r.gauge.Inc()
}

// Ended records the end of a session Started recorded.
func (r *Registry) Ended(node string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.attached[node]--; r.attached[node] <= 0 {
		delete(r.attached, node)
		r.detachedAt[node] = r.now()
	}
	r.gauge.Dec()
}

// DetachedSince returns when node's last session ended, here or (as the
// ephemeral plane announced) on any other server; ok is false while one is
// attached anywhere. A node never seen attached has no time.
func (r *Registry) DetachedSince(node string) (at time.Time, ok bool) {
	live, remoteEnd := r.remote.Live(node)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.attached[node] > 0 || live {
		return time.Time{}, false
	}
	at = r.detachedAt[node]
	if remoteEnd.After(at) {
		at = remoteEnd
	}
	return at, true
}

// Connected is every node with an agent session on any control server.
func (r *Registry) Connected() map[string]bool {
	remote := r.remote.LiveNodes()
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]bool, len(r.attached)+len(remote))
	for n := range r.attached {
		out[n] = true
	}
	for _, n := range remote {
		out[n] = true
	}
	return out
}
