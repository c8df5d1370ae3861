package quota

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// maxTenantSeries caps the tenants named in the per-tenant series; the
// rest are counted as tenant="_other", so a cluster with many tenants
// cannot grow the router's series without bound.
const maxTenantSeries = 200

type metrics struct {
	requests      *prometheus.CounterVec
	tenantTokens  *prometheus.CounterVec
	modelTokens   *prometheus.CounterVec
	leaseFailures prometheus.Counter
	leaseSettling prometheus.Counter
	flushFailures prometheus.Counter

	mu    sync.Mutex
	named map[string]bool
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_tenant_requests_total",
			Help: "Requests by tenant (\"\": no key) and admission result: admitted, refused (429 by a limit or budget), shadow_refused (a shadow tenant's limits would have refused it; served).",
		}, []string{"tenant", "result"}),
		tenantTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_tenant_tokens_total",
			Help: "Tokens metered by tenant and kind (input, cached, output), as the engines' usage reports them (a cancelled stream: the chunks it was sent).",
		}, []string{"tenant", "kind"}),
		modelTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_metered_tokens_total",
			Help: "Tokens metered by base model and kind (input, output): held against the engines' own vllm:prompt_tokens_total and vllm:generation_tokens_total by the metering drift alert.",
		}, []string{"model", "kind"}),
		leaseFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgw_router_quota_lease_failures_total",
			Help: "Share renewals that failed; shares hold until their lease ends, then the fallback.",
		}),
		leaseSettling: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgw_router_quota_lease_settling_total",
			Help: "Share renewals a new leader answered with nothing while the old leader's leases run out.",
		}),
		flushFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgw_router_quota_flush_failures_total",
			Help: "Usage batches that failed to reach the roll-up (sent again later).",
		}),
		named: map[string]bool{},
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.tenantTokens, m.modelTokens, m.leaseFailures, m.leaseSettling, m.flushFailures)
	}
	return m
}

// label is tenant as the series name it, within maxTenantSeries.
func (m *metrics) label(tenant string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.named[tenant] {
		return tenant
	}
	if len(m.named) >= maxTenantSeries {
		return "_other"
	}
	m.named[tenant] = true
	return tenant
}

// tenantSeries are one tenant's series, resolved once: a request adds to
// them without looking labels up.
type tenantSeries struct {
	admitted, refused, shadowRefused prometheus.Counter
	input, cached, output            prometheus.Counter
}

func (m *metrics) forTenant(tenant string) *tenantSeries {
	t := m.label(tenant)
	return &tenantSeries{
		admitted: m.requests.WithLabelValues(t, "admitted"), refused: m.requests.WithLabelValues(t, "refused"),
		shadowRefused: m.requests.WithLabelValues(t, "shadow_refused"),
		input:         m.tenantTokens.WithLabelValues(t, "input"), cached: m.tenantTokens.WithLabelValues(t, "cached"),
		output: m.tenantTokens.WithLabelValues(t, "output"),
	}
}

// modelSeries are one model's metered input and output counters.
type modelSeries struct{ input, output prometheus.Counter }

func (m *metrics) forModel(model string) *modelSeries {
	return &modelSeries{input: m.modelTokens.WithLabelValues(model, "input"), output: m.modelTokens.WithLabelValues(model, "output")}
}
