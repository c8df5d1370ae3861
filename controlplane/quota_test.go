//go:build !llmgw_upgrade_old

package controlplane

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestQuotaService: the node serves the QuotaService. A usage batch is
// refused with FAILED_PRECONDITION while the cluster's minimum version
// does not admit tenants' commands — a batch never opens the gate itself,
// on a server of any release — and once an operator's tenant command has
// opened it, committed to the roll-up, once; a renewal right after the
// election is answered settling.
func TestQuotaService(t *testing.T) {
	hour := time.Now().Unix() / 3600 * 3600
	batch := &llmgwv1.RecordUsageCommand{Router: "r1", Session: 9, Seq: 1, Rows: []*llmgwv1.UsageRow{
		{Tenant: "acme", Model: "m", HourUnix: hour, Counts: &llmgwv1.UsageCounts{Requests: 1, InputTokens: 10, OutputTokens: 5}},
	}}
	tests := []struct {
		version string
		ok      bool
	}{
		{"v0.1.0", false},
		{fsm.TenantsVersion, true},
	}
	for _, tt := range tests {
		t.Run(tt.version, func(t *testing.T) {
			cfg := testConfig(t, t.TempDir(), freeAddr(t))
			cfg.Version = tt.version
			r := start(t, cfg)
			defer r.stop(t)
			ctx := context.Background()
			q := llmgwv1.NewQuotaServiceClient(r.conn)

			resp, err := q.Lease(ctx, &llmgwv1.LeaseRequest{Router: "r1", Session: 9, Claims: []*llmgwv1.ShareClaim{
				{Scope: &llmgwv1.Scope{Tenant: "acme", Kind: llmgwv1.LimitKind_LIMIT_KIND_RPM}, Demand: 5}}})
			if err != nil || !resp.Settling || len(resp.Grants) != 0 || resp.TermMs != 5_000 {
				t.Errorf("Lease right after the election: %v, %v; want settling, term 5 s", resp, err)
			}

			_, err = q.RecordUsage(ctx, batch)
			if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "does not admit tenants' commands") {
				t.Fatalf("RecordUsage before any tenant command: %v, want FAILED_PRECONDITION", err)
			}
			if got := r.srv.fsm.Config().GetMinVersion(); got != "" && fsm.AtLeast(got, fsm.TenantsVersion) {
				t.Fatalf("a usage batch opened the gate: min_version %q", got)
			}
			// An operator's command opens the gate, where every server can.
			_, err = llmgwv1.NewAdminServiceClient(r.conn).PutTenant(ctx, &llmgwv1.PutTenantRequest{Tenant: &llmgwv1.Tenant{Name: "acme"}, Create: true})
			if !tt.ok {
				if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "c1 (v0.1.0)") {
					t.Fatalf("PutTenant: %v, want FAILED_PRECONDITION naming c1 (v0.1.0)", err)
				}
				if got := r.srv.fsm.UsageTokens("acme", "", 0); got != 0 {
					t.Fatalf("a refused batch reached the roll-up: %d tokens", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := q.RecordUsage(ctx, batch); err != nil {
				t.Fatal(err)
			}
			// Sent again after a lost answer: applied once.
			if _, err := q.RecordUsage(ctx, batch); err != nil {
				t.Fatal(err)
			}
			if got := r.srv.fsm.UsageTokens("acme", "", hour); got != 15 {
				t.Errorf("roll-up holds %d tokens of acme, want 15", got)
			}
		})
	}
}
