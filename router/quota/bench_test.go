package quota

import (
	"context"
	"testing"
	"time"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// BenchmarkAdmit is one request's admission and settlement (issue 28's
// target: ≤ 2 µs): "limits" against a tenant with a request rate, both
// token rates, a concurrency cap and a daily budget, with shares large
// enough never to refuse; "no-limits" a tenant without any, as the
// baseline of the metering alone.
func BenchmarkAdmit(b *testing.B) {
	for _, bc := range []struct {
		name   string
		limits *llmgwv1.TenantLimits
	}{
		{"no-limits", nil},
		{"limits", &llmgwv1.TenantLimits{Rpm: 1e8, InputTpm: 1e12, OutputTpm: 1e12, Concurrency: 1e6, DailyTokens: 1e12}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			f := &fakeLeader{term: time.Hour, shares: map[llmgwv1.LimitKind]uint64{
				llmgwv1.LimitKind_LIMIT_KIND_RPM: 1e8, llmgwv1.LimitKind_LIMIT_KIND_INPUT_TPM: 1e12,
				llmgwv1.LimitKind_LIMIT_KIND_OUTPUT_TPM: 1e12, llmgwv1.LimitKind_LIMIT_KIND_CONCURRENCY: 1e6,
				llmgwv1.LimitKind_LIMIT_KIND_DAILY_TOKENS: 1e12}}
			tenants := map[string]*llmgwv1.Tenant{}
			if bc.limits != nil {
				tenants["a"] = tenantWith("a", bc.limits)
			}
			q, _ := newTestQuota(b, tenants, f, nil)
			q.cfg.Now = time.Now
			q.renew(context.Background())
			req := Request{Tenant: "a", Model: "m", Base: "m", Input: 1000, InputExact: true, MaxTokens: 200}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				tk, refusal, _ := q.Admit(req)
				if refusal != nil {
					b.Fatal(refusal)
				}
				tk.Settle(Usage{Input: 1000, Cached: 500, Output: 150, Known: true})
			}
		})
	}
}
