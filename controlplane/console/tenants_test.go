package console

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestTenantsPage: the tenants page reads the roll-up from the month's
// start and sums each tenant's and each model's hour, day and month (UTC)
// at the console's clock; the budgets left are the budget minus the
// period's input + output tokens, negative once spent beyond it, none
// without a budget; tenants without limits (a key's own, the anonymous
// "") are there with their usage; tenants' priority classes are there,
// empty ones too; the page's script draws it.
func TestTenantsPage(t *testing.T) {
	now := time.Date(2026, 12, 2, 19, 40, 0, 0, time.UTC)
	hour, day, month := now.Truncate(time.Hour).Unix(), time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC).Unix(), time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).Unix()
	c := func(req, refused, shadow, in, out uint64) *llmgwv1.UsageCounts {
		return &llmgwv1.UsageCounts{Requests: req, Refused: refused, ShadowRefused: shadow, InputTokens: in, OutputTokens: out}
	}
	admin := &fakeAdmin{
		tenants: []*llmgwv1.Tenant{
			{Name: "team-a", Limits: &llmgwv1.TenantLimits{Rpm: 60, DailyTokens: 1000, MonthlyTokens: 1500},
				ModelLimits: []*llmgwv1.TenantModelLimits{{Model: "demo", Limits: &llmgwv1.TenantLimits{DailyTokens: 100}}, {Model: "idle", Limits: &llmgwv1.TenantLimits{Rpm: 1}}}},
			{Name: "team-b", Shadow: true, DefaultClass: "batch", MaxClass: "standard"},
		},
		usage: []*llmgwv1.UsageRow{
			{Tenant: "team-a", Model: "demo", HourUnix: month - 3600, Counts: c(50, 0, 0, 5000, 5000)}, // last month: left out
			{Tenant: "team-a", Model: "demo", HourUnix: month, Counts: c(1, 0, 0, 600, 100)},
			{Tenant: "team-a", Model: "demo", HourUnix: day, Counts: c(2, 1, 0, 200, 50)},
			{Tenant: "team-a", Model: "demo", HourUnix: hour, Counts: c(3, 0, 0, 300, 30)},
			{Tenant: "team-a", Model: "chat", HourUnix: hour, Counts: c(4, 2, 0, 400, 40)},
			{Tenant: "team-b", Model: "demo", HourUnix: hour - 3600, Counts: c(5, 0, 3, 10, 1)},
			{Tenant: "", Model: "demo", HourUnix: hour, Counts: c(6, 0, 0, 60, 6)},
		},
	}
	con := New(admin, Access{}, nil, nil, slog.New(slog.DiscardHandler))
	con.now = func() time.Time { return now }
	mux := http.NewServeMux()
	con.Register(mux)

	pg := get(t, mux, "/ui/api/tenants")
	if admin.since != month {
		t.Fatalf("usage read from %d, want the month's start %d", admin.since, month)
	}
	for _, w := range []string{`"name":"team-b"`, `"default_class":"batch"`, `"max_class":"standard"`, `"default_class":""`} {
		if !strings.Contains(string(pg["tenants"]), w) {
			t.Fatalf("tenants lack %s: %s", w, pg["tenants"])
		}
	}
	var u TenantsUsage
	if err := json.Unmarshal(pg["usage"], &u); err != nil {
		t.Fatal(err)
	}
	if u.HourUnix != hour || u.DayUnix != day || u.MonthUnix != month {
		t.Fatalf("periods %d %d %d", u.HourUnix, u.DayUnix, u.MonthUnix)
	}
	left := func(p *int64) any {
		if p == nil {
			return nil
		}
		return *p
	}
	a := u.Tenants["team-a"]
	for _, tt := range []struct {
		what      string
		got, want any
	}{
		{"team-a this hour", a.Hour, Counts{Requests: 7, Refused: 2, InputTokens: 700, OutputTokens: 70}},
		{"team-a today", a.Today, Counts{Requests: 9, Refused: 3, InputTokens: 900, OutputTokens: 120}},
		{"team-a this month", a.Month, Counts{Requests: 10, Refused: 3, InputTokens: 1500, OutputTokens: 220}},
		{"team-a daily left", left(a.DailyLeft), int64(1000 - 1020)},
		{"team-a monthly left", left(a.MonthlyLeft), int64(1500 - 1720)},
		{"demo today", a.Models["demo"].Today, Counts{Requests: 5, Refused: 1, InputTokens: 500, OutputTokens: 80}},
		{"demo daily left", left(a.Models["demo"].DailyLeft), int64(100 - 580)},
		{"demo without a monthly budget", left(a.Models["demo"].MonthlyLeft), nil},
		{"idle model without usage", a.Models["idle"].Month, Counts{}},
		{"chat without limits", left(a.Models["chat"].DailyLeft), nil},
		{"team-b (shadow) today", u.Tenants["team-b"].Today, Counts{Requests: 5, ShadowRefused: 3, InputTokens: 10, OutputTokens: 1}},
		{"team-b without budgets", left(u.Tenants["team-b"].DailyLeft), nil},
		{"anonymous this hour", u.Tenants[""].Hour, Counts{Requests: 6, InputTokens: 60, OutputTokens: 6}},
	} {
		if tt.got != tt.want {
			t.Errorf("%s: %+v, want %+v", tt.what, tt.got, tt.want)
		}
	}

	for path, wants := range map[string][]string{
		"/ui/": {`<a href="#tenants" data-page="tenants">Tenants</a>`},
		"/ui/app.js": {"tenants: renderTenants", "function renderTenants", "Budget left today", "Shadow refused today",
			"function classText", "${classText(t)}", "data-default-class=", "data-max-class="},
	} {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.RemoteAddr = "127.0.0.1:4000"
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		for _, w := range wants {
			if !strings.Contains(rec.Body.String(), w) {
				t.Errorf("%s lacks %q", path, w)
			}
		}
	}
}
