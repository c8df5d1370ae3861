package api

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/auth"
	"github.com/llmgw/llmgw/router/breaker"
	"github.com/llmgw/llmgw/router/endpoint"
	"github.com/llmgw/llmgw/router/quota"
	"github.com/llmgw/llmgw/router/scheduler"
)

// grantAll is a control plane that grants every scope a share far above
// any load, and takes every usage batch.
type grantAll struct{}

func (grantAll) Lease(_ context.Context, req *llmgwv1.LeaseRequest) (*llmgwv1.LeaseResponse, error) {
	resp := &llmgwv1.LeaseResponse{TermMs: 3_600_000}
	for i, c := range req.Claims {
		resp.Grants = append(resp.Grants, &llmgwv1.ShareGrant{Scope: c.Scope, Seq: uint64(i + 1), Share: 1 << 40, Fallback: 1 << 40, Limit: 1 << 40})
	}
	return resp, nil
}

func (grantAll) RecordUsage(context.Context, *llmgwv1.RecordUsageCommand) (*llmgwv1.RecordUsageResponse, error) {
	return &llmgwv1.RecordUsageResponse{}, nil
}

// BenchmarkHandlerTenants is one chat request through the whole router
// handler (as BenchmarkHandlerAPIKey) with a key of no tenant (metering
// only) and a key of a tenant with a request rate, both token rates and a
// concurrency cap, none binding (docs/benchmarks.md, "Tenants"): the
// difference is what admission, settlement and the x-ratelimit headers
// add to a request.
func BenchmarkHandlerTenants(b *testing.B) {
	const secret = "sk-llmgw-0123456789abcdefghijklmnopqrstuvwxyzABCDEFG"
	eng := okEngine()
	defer eng.Close()
	tb := &table{models: map[string][]*endpoint.Endpoint{"demo": {ep("demo-0", strings.TrimPrefix(eng.URL, "http://"))}}}
	body := `{"model":"demo","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say ok."}],"max_tokens":1}`
	tenants := map[string]*llmgwv1.Tenant{"limited": {Name: "limited", Limits: &llmgwv1.TenantLimits{
		Rpm: 1e8, InputTpm: 1e12, OutputTpm: 1e12, Concurrency: 1e6}}}
	for _, tt := range []struct{ name, tenant string }{
		{"tenant=none", ""},
		{"tenant=limited", "limited"},
	} {
		b.Run(tt.name, func(b *testing.B) {
			k := apiKey("bench", secret)
			k.Tenant = tt.tenant
			keys := (*auth.Set)(nil).Clone()
			keys.Put(k)
			cfg := DefaultConfig()
			cfg.Keys = func() *auth.Set { return keys }
			q := quota.New(quota.Config{Router: "bench"}, func() map[string]*llmgwv1.Tenant { return tenants }, grantAll{},
				slog.New(slog.DiscardHandler), nil)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { _ = q.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			cfg.Quota = q
			br, err := breaker.NewSet(breaker.DefaultConfig(), func(k scheduler.Key) string { return k.ID }, nil)
			if err != nil {
				b.Fatal(err)
			}
			h := newHandler(b, cfg, tb, inOrder{}, br, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
			serve := func() *httptest.ResponseRecorder {
				req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+secret)
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				return w
			}
			for i := 0; ; i++ { // the first renewal has granted the shares
				if w := serve(); w.Code == http.StatusOK {
					break
				} else if i == 1000 {
					b.Fatalf("status %d: %s", w.Code, w.Body)
				}
			}
			b.ReportAllocs()
			cpu0 := processCPU()
			for b.Loop() {
				serve()
			}
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// processCPU is this process's user and system CPU time so far: the
// router's handler, the engine stand-in and the client alike, the same in
// both variants but for what tenants add.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
