package leader

import (
	"errors"
	"testing"
	"time"

	"github.com/llmgw/llmgw/controlplane/quota"
	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestLease: the leader's leased shares over the replicated state — a
// tenant's limits, the roll-up's tokens of the day — settling from each
// election, forgotten at resignation, with the gauges following.
func TestLease(t *testing.T) {
	day := t0.Truncate(24 * time.Hour).Unix()
	st := &llmgwv1.State{
		Tenants: []*llmgwv1.Tenant{{Name: "acme", Limits: &llmgwv1.TenantLimits{Rpm: 100, DailyTokens: 10_000}}},
		Usage: []*llmgwv1.UsageRow{
			{Tenant: "acme", Model: "m", HourUnix: day - 3600, Counts: &llmgwv1.UsageCounts{InputTokens: 5000}}, // yesterday
			{Tenant: "acme", Model: "m", HourUnix: day, Counts: &llmgwv1.UsageCounts{InputTokens: 6000, OutputTokens: 3500}},
		},
	}
	cfg := testConfig()
	cfg.Quota = quota.Config{MaxSessions: 1}
	r := newRig(t, cfg, st)
	req := func(router string) *llmgwv1.LeaseRequest {
		return &llmgwv1.LeaseRequest{Router: router, Session: 1, Claims: []*llmgwv1.ShareClaim{
			{Scope: &llmgwv1.Scope{Tenant: "acme", Kind: llmgwv1.LimitKind_LIMIT_KIND_RPM}, Demand: 60},
			{Scope: &llmgwv1.Scope{Tenant: "acme", Kind: llmgwv1.LimitKind_LIMIT_KIND_DAILY_TOKENS}},
			{Scope: &llmgwv1.Scope{Tenant: "nobody", Kind: llmgwv1.LimitKind_LIMIT_KIND_RPM}},
		}}
	}
	gauges := func(sessions, settling float64) {
		t.Helper()
		if got := testkit.Metric(t, r.reg, "llmgw_control_quota_sessions", nil); got != sessions {
			t.Errorf("llmgw_control_quota_sessions = %v, want %v", got, sessions)
		}
		if got := testkit.Metric(t, r.reg, "llmgw_control_quota_settling", nil); got != settling {
			t.Errorf("llmgw_control_quota_settling = %v, want %v", got, settling)
		}
	}

	if resp, err := r.l.Lease(req("r1")); err != nil || !resp.Settling || len(resp.Grants) != 0 {
		t.Fatalf("before the election: %v, %v; want settling", resp, err)
	}
	gauges(0, 0)
	r.l.Elected()
	gauges(0, 1)
	r.clock.Add(time.Second)
	if resp, err := r.l.Lease(req("r1")); err != nil || !resp.Settling || len(resp.Grants) != 0 {
		t.Fatalf("a second after the election: %v, %v; want settling", resp, err)
	}
	gauges(1, 1)

	r.clock.Add(11 * time.Second)
	resp, err := r.l.Lease(req("r1"))
	if err != nil || resp.Settling || len(resp.Grants) != 2 {
		t.Fatalf("settled: %v, %v; want two grants", resp, err)
	}
	if g := resp.Grants[0]; g.Share != 100 || g.Fallback != 100 || g.Limit != 100 {
		t.Errorf("rpm grant %v, want all of 100", g)
	}
	// The day's roll-up holds 9500 of 10000: the slice is the 500 left.
	if g := resp.Grants[1]; g.Share != 500 || g.Fallback != 0 || g.Limit != 10_000 {
		t.Errorf("daily grant %v, want the 500 left of 10000", g)
	}
	gauges(1, 0)
	if _, err := r.l.Lease(req("r2")); !errors.Is(err, quota.ErrFull) {
		t.Errorf("a second session with MaxSessions 1: %v, want quota.ErrFull", err)
	}

	r.l.Resigned()
	gauges(0, 0)
	if resp, err := r.l.Lease(req("r1")); err != nil || !resp.Settling {
		t.Errorf("resigned: %v, %v; want settling", resp, err)
	}
	gauges(0, 0)
}
