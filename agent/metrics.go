package agent

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// newRegistry is the agent's own registry (design §9), served on /metrics:
// the Go runtime's and the process's collectors here, and every part of
// the agent (session, replicas, kv, adapters, load) registers its own
// metrics on it.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}
