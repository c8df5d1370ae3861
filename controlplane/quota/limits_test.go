package quota

import (
	"testing"
	"time"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// fakeState holds tenants and answers UsageTokens with the period start it
// was asked for, so the test sees which one StateLimits reads.
type fakeState struct {
	tenants map[string]*llmgwv1.Tenant
	asked   []int64
}

func (f *fakeState) Tenant(name string) (*llmgwv1.Tenant, bool) {
	t, ok := f.tenants[name]
	return t, ok
}

func (f *fakeState) UsageTokens(tenant, model string, fromUnix int64) uint64 {
	f.asked = append(f.asked, fromUnix)
	if tenant == "acme" && model == "" {
		return 42
	}
	return 7
}

// TestStateLimits: each kind reads its field, a model scope its model's
// limits, and nothing for what has none.
func TestStateLimits(t *testing.T) {
	st := &fakeState{tenants: map[string]*llmgwv1.Tenant{"acme": {
		Name:   "acme",
		Limits: &llmgwv1.TenantLimits{Rpm: 1, InputTpm: 2, OutputTpm: 3, WeightedTpm: 4, Concurrency: 5, DailyTokens: 6, MonthlyTokens: 7},
		ModelLimits: []*llmgwv1.TenantModelLimits{
			{Model: "a", Limits: &llmgwv1.TenantLimits{Rpm: 10}},
			{Model: "m", Limits: &llmgwv1.TenantLimits{Rpm: 11, DailyTokens: 16}},
			{Model: "z", Limits: &llmgwv1.TenantLimits{Rpm: 12}},
		},
	}}}
	l := StateLimits{State: st}
	tests := []struct {
		tenant, model string
		kind          llmgwv1.LimitKind
		want          uint64
		wantOK        bool
	}{
		{"acme", "", llmgwv1.LimitKind_LIMIT_KIND_RPM, 1, true},
		{"acme", "", llmgwv1.LimitKind_LIMIT_KIND_INPUT_TPM, 2, true},
		{"acme", "", llmgwv1.LimitKind_LIMIT_KIND_OUTPUT_TPM, 3, true},
		{"acme", "", llmgwv1.LimitKind_LIMIT_KIND_WEIGHTED_TPM, 4, true},
		{"acme", "", llmgwv1.LimitKind_LIMIT_KIND_CONCURRENCY, 5, true},
		{"acme", "", llmgwv1.LimitKind_LIMIT_KIND_DAILY_TOKENS, 6, true},
		{"acme", "", llmgwv1.LimitKind_LIMIT_KIND_MONTHLY_TOKENS, 7, true},
		{"acme", "", llmgwv1.LimitKind_LIMIT_KIND_UNSPECIFIED, 0, false},
		{"acme", "m", llmgwv1.LimitKind_LIMIT_KIND_RPM, 11, true},
		{"acme", "m", llmgwv1.LimitKind_LIMIT_KIND_DAILY_TOKENS, 16, true},
		{"acme", "z", llmgwv1.LimitKind_LIMIT_KIND_RPM, 12, true},
		{"acme", "m", llmgwv1.LimitKind_LIMIT_KIND_INPUT_TPM, 0, false}, // the model's limit is 0: none
		{"acme", "b", llmgwv1.LimitKind_LIMIT_KIND_RPM, 0, false},       // a model without limits of its own
		{"other", "", llmgwv1.LimitKind_LIMIT_KIND_RPM, 0, false},
	}
	for _, tt := range tests {
		got, ok := l.Limit(&llmgwv1.Scope{Tenant: tt.tenant, Model: tt.model, Kind: tt.kind})
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("Limit(%s/%s %v) = %d, %v; want %d, %v", tt.tenant, tt.model, tt.kind, got, ok, tt.want, tt.wantOK)
		}
	}

	now := time.Date(2026, 3, 10, 12, 34, 56, 0, time.FixedZone("x", 5*3600))
	if got := l.Committed("acme", "", llmgwv1.LimitKind_LIMIT_KIND_DAILY_TOKENS, now); got != 42 {
		t.Errorf("daily committed %d, want 42", got)
	}
	if got := l.Committed("acme", "m", llmgwv1.LimitKind_LIMIT_KIND_MONTHLY_TOKENS, now); got != 7 {
		t.Errorf("monthly committed %d, want 7", got)
	}
	if got := l.Committed("acme", "", llmgwv1.LimitKind_LIMIT_KIND_RPM, now); got != 0 {
		t.Errorf("a rate's committed %d, want 0", got)
	}
	// 12:34 at UTC+5 is 07:34 UTC on the 10th.
	day := time.Date(2026, 3, 10, 0, 0, 0, 0, time.UTC).Unix()
	month := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC).Unix()
	if len(st.asked) != 2 || st.asked[0] != day || st.asked[1] != month {
		t.Errorf("asked for the tokens from %v, want the UTC day's and month's starts %d, %d", st.asked, day, month)
	}
	// 02:00 at UTC+5 on the 1st is still the last day of the month before in UTC.
	early := time.Date(2026, 3, 1, 2, 0, 0, 0, time.FixedZone("x", 5*3600))
	if from, _ := PeriodStart(llmgwv1.LimitKind_LIMIT_KIND_MONTHLY_TOKENS, early); !from.Equal(time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("month of %v starts %v, want February's", early, from)
	}
}
