//go:build !llmgw_upgrade_old

package admin

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// The FSM is what the server hands the service as its state.
var _ Desired = (*fsm.FSM)(nil)

// applyProposer commits each command straight to an FSM, one index each,
// as the leader's store would, and counts the commands proposed.
type applyProposer struct {
	f         *fsm.FSM
	at        int64
	proposals int
}

func (p *applyProposer) Propose(_ context.Context, t llmgwv1.CommandType, payload proto.Message) (any, uint64, error) {
	p.proposals++
	data, err := fsm.NewCommand(t, payload)
	if err != nil {
		return nil, 0, err
	}
	idx := p.f.Revision() + 1
	res, err := p.f.ApplyAt(idx, p.at, data)
	return res, idx, err
}

// tenantService is a Service over a fresh FSM, its clock fixed.
func tenantService(t *testing.T) (*Service, *fsm.FSM, *applyProposer) {
	t.Helper()
	f := fsm.New(fsm.Config{})
	p := &applyProposer{f: f, at: 1_700_000_000}
	clock := func() time.Time { return time.Unix(1_700_000_123, 0) }
	return New("c1", Deps{Propose: p, State: f, Now: clock}, slog.New(slog.DiscardHandler)), f, p
}

// wantCode fails unless err has code and, when want is given, a message
// holding it.
func wantCode(t *testing.T, what string, err error, code codes.Code, want string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), want) {
		t.Fatalf("%s: %v, want %s with %q", what, err, code, want)
	}
}

func tenantsJSON(f *fsm.FSM) string {
	var b strings.Builder
	for _, t := range f.Tenants() {
		b.WriteString(protojson.Format(t))
	}
	return b.String()
}

// TestPutTenant: a create stores the tenant with its per-model limits
// sorted and this server's clock as its creation time; an update replaces
// it whole and keeps that time. Bad input — a name in use, an unknown
// tenant to update, a limit above its bound, a daily budget above the
// monthly one, a weight beyond 1000 ×, a model limited twice, a priority
// class not of the class shape — is refused naming the field (after
// sorting, so indices are the stored order), and nothing is applied: a
// shape the service can check costs no log entry. The priority classes
// pass through to the stored tenant.
func TestPutTenant(t *testing.T) {
	a, f, p := tenantService(t)
	ctx := context.Background()
	resp, err := a.PutTenant(ctx, &llmgwv1.PutTenantRequest{Create: true, Tenant: &llmgwv1.Tenant{
		Name: "team-a", Models: []string{"demo"}, Limits: &llmgwv1.TenantLimits{Rpm: 60, DailyTokens: 1000, MonthlyTokens: 20000},
		ModelLimits: []*llmgwv1.TenantModelLimits{
			{Model: "zeta", Limits: &llmgwv1.TenantLimits{Rpm: 5}},
			{Model: "demo", Limits: &llmgwv1.TenantLimits{InputTpm: 100}},
		},
		Weights:      &llmgwv1.TokenWeights{InputMilli: 1000, CachedMilli: 100, OutputMilli: 4000},
		DefaultClass: "standard", MaxClass: "interactive",
		CreatedUnix: 5, Revision: 99,
	}})
	if err != nil {
		t.Fatal(err)
	}
	got := resp.Tenant
	if got.CreatedUnix != 1_700_000_123 || got.Revision != resp.Revision || got.ModelLimits[0].Model != "demo" || got.ModelLimits[1].Model != "zeta" {
		t.Fatalf("created %v at %d: want the clock's time, the revision, per-model limits sorted", got, resp.Revision)
	}
	if stored, _ := f.Tenant("team-a"); got.DefaultClass != "standard" || got.MaxClass != "interactive" || !proto.Equal(stored, got) {
		t.Fatalf("created %v, stored %v: want the classes passed through", got, stored)
	}
	upd, err := a.PutTenant(ctx, &llmgwv1.PutTenantRequest{Tenant: &llmgwv1.Tenant{Name: "team-a", Shadow: true, Limits: &llmgwv1.TenantLimits{Rpm: 10},
		DefaultClass: "batch"}})
	if err != nil {
		t.Fatal(err)
	}
	if u := upd.Tenant; !u.Shadow || u.Limits.Rpm != 10 || len(u.ModelLimits) != 0 || len(u.Models) != 0 || u.CreatedUnix != 1_700_000_123 ||
		u.DefaultClass != "batch" || u.MaxClass != "" {
		t.Fatalf("updated %v: want it replaced whole (classes too), its creation time kept", u)
	}

	before, proposals := tenantsJSON(f), p.proposals
	for _, tt := range []struct {
		name string
		req  *llmgwv1.PutTenantRequest
		code codes.Code
		want string
	}{
		{"no tenant", &llmgwv1.PutTenantRequest{Create: true}, codes.InvalidArgument, "tenant: required"},
		{"bad name", &llmgwv1.PutTenantRequest{Create: true, Tenant: &llmgwv1.Tenant{Name: "Team B"}}, codes.InvalidArgument, "name: must match"},
		{"absurd input_tpm", &llmgwv1.PutTenantRequest{Create: true, Tenant: &llmgwv1.Tenant{Name: "b",
			Limits: &llmgwv1.TenantLimits{InputTpm: fsm.MaxTokensLimit + 1}}}, codes.InvalidArgument, "input_tpm: at most 1000000000000"},
		{"absurd concurrency", &llmgwv1.PutTenantRequest{Create: true, Tenant: &llmgwv1.Tenant{Name: "b",
			Limits: &llmgwv1.TenantLimits{Concurrency: fsm.MaxConcurrencyLimit + 1}}}, codes.InvalidArgument, "concurrency: at most"},
		{"daily above monthly", &llmgwv1.PutTenantRequest{Create: true, Tenant: &llmgwv1.Tenant{Name: "b",
			Limits: &llmgwv1.TenantLimits{DailyTokens: 2000, MonthlyTokens: 1000}}}, codes.InvalidArgument, "daily_tokens: 2000 is above monthly_tokens 1000"},
		// Sorted first: "a" is model_limits[0] whatever its place in the request.
		{"absurd model limit", &llmgwv1.PutTenantRequest{Create: true, Tenant: &llmgwv1.Tenant{Name: "b", ModelLimits: []*llmgwv1.TenantModelLimits{
			{Model: "z", Limits: &llmgwv1.TenantLimits{Rpm: 1}}, {Model: "a", Limits: &llmgwv1.TenantLimits{Rpm: fsm.MaxRequestsLimit + 1}}}}},
			codes.InvalidArgument, "model_limits[0].rpm: at most"},
		{"model limited twice", &llmgwv1.PutTenantRequest{Create: true, Tenant: &llmgwv1.Tenant{Name: "b", ModelLimits: []*llmgwv1.TenantModelLimits{
			{Model: "a"}, {Model: "a"}}}}, codes.InvalidArgument, "model_limits[1].model"},
		{"absurd weight", &llmgwv1.PutTenantRequest{Create: true, Tenant: &llmgwv1.Tenant{Name: "b",
			Weights: &llmgwv1.TokenWeights{InputMilli: 1000, CachedMilli: fsm.MaxWeightMilli + 1}}}, codes.InvalidArgument, "weights.cached: at most 1000"},
		{"all weights zero", &llmgwv1.PutTenantRequest{Create: true, Tenant: &llmgwv1.Tenant{Name: "b", Weights: &llmgwv1.TokenWeights{}}},
			codes.InvalidArgument, "weights: at least one"},
		{"model twice", &llmgwv1.PutTenantRequest{Create: true, Tenant: &llmgwv1.Tenant{Name: "b", Models: []string{"x", "x"}}},
			codes.InvalidArgument, "models[1]"},
		{"bad default class", &llmgwv1.PutTenantRequest{Create: true, Tenant: &llmgwv1.Tenant{Name: "b", DefaultClass: "Batch"}},
			codes.InvalidArgument, `default_class: must match [a-z][a-z0-9_-]* and be at most 32 characters, got "Batch"`},
		{"bad max class", &llmgwv1.PutTenantRequest{Create: true, Tenant: &llmgwv1.Tenant{Name: "b", MaxClass: strings.Repeat("x", fsm.MaxClassLen+1)}},
			codes.InvalidArgument, "max_class: must match"},
		{"bad class on update", &llmgwv1.PutTenantRequest{Tenant: &llmgwv1.Tenant{Name: "team-a", MaxClass: "9"}},
			codes.InvalidArgument, "max_class: must match"},
		{"name in use", &llmgwv1.PutTenantRequest{Create: true, Tenant: &llmgwv1.Tenant{Name: "team-a"}}, codes.AlreadyExists, `tenant "team-a" already exists`},
		{"update of an unknown tenant", &llmgwv1.PutTenantRequest{Tenant: &llmgwv1.Tenant{Name: "nope"}}, codes.NotFound, `tenant "nope" not found: create it first`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := a.PutTenant(ctx, tt.req)
			wantCode(t, tt.name, err, tt.code, tt.want)
			if after := tenantsJSON(f); after != before {
				t.Fatalf("a refused put changed the tenants:\n%s\nwas\n%s", after, before)
			}
			if p.proposals != proposals {
				t.Fatalf("%d proposals, want %d: a put the service can refuse must cost no log entry", p.proposals, proposals)
			}
		})
	}
}

// TestTenantReads: get (NOT_FOUND for an unknown name), list sorted by
// name, and the usage roll-up filtered by tenant, model and the hour
// holding since.
func TestTenantReads(t *testing.T) {
	a, f, p := tenantService(t)
	ctx := context.Background()
	for _, n := range []string{"b", "a"} {
		if _, err := a.PutTenant(ctx, &llmgwv1.PutTenantRequest{Create: true, Tenant: &llmgwv1.Tenant{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	const h = 1_700_000_000 - 1_700_000_000%3600
	if _, _, err := p.Propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_RECORD_USAGE, &llmgwv1.RecordUsageCommand{Router: "r1", Session: 1, Seq: 1, Rows: []*llmgwv1.UsageRow{
		{Tenant: "a", Model: "demo", HourUnix: h - 3600, Counts: &llmgwv1.UsageCounts{Requests: 1, InputTokens: 10}},
		{Tenant: "a", Model: "demo", HourUnix: h, Counts: &llmgwv1.UsageCounts{Requests: 2, InputTokens: 20, OutputTokens: 5}},
		{Tenant: "a", Model: "chat", HourUnix: h, Counts: &llmgwv1.UsageCounts{Requests: 3}},
		{Tenant: "", Model: "demo", HourUnix: h, Counts: &llmgwv1.UsageCounts{Requests: 4}},
	}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.GetTenant(ctx, &llmgwv1.GetTenantRequest{Name: "nope"}); status.Code(err) != codes.NotFound {
		t.Fatalf("get unknown: %v, want NOT_FOUND", err)
	}
	if _, err := a.GetTenant(ctx, &llmgwv1.GetTenantRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("get without a name: %v, want INVALID_ARGUMENT", err)
	}
	if got, err := a.GetTenant(ctx, &llmgwv1.GetTenantRequest{Name: "a"}); err != nil || got.Name != "a" {
		t.Fatalf("get a: %v, %v", got, err)
	}
	list, err := a.ListTenants(ctx, &llmgwv1.ListRequest{})
	if err != nil || len(list.Tenants) != 2 || list.Tenants[0].Name != "a" || list.Revision != f.Revision() {
		t.Fatalf("list: %v, %v", list, err)
	}
	rows := func(r *llmgwv1.UsageResponse) string {
		var s []string
		for _, x := range r.GetRows() {
			s = append(s, x.Tenant+"/"+x.Model+"@"+time.Unix(x.HourUnix, 0).UTC().Format("15"))
		}
		return strings.Join(s, " ")
	}
	hh := func(d int64) string { return time.Unix(h+d, 0).UTC().Format("15") }
	for _, tt := range []struct {
		req  *llmgwv1.UsageRequest
		want string
	}{
		{&llmgwv1.UsageRequest{}, "/demo@" + hh(0) + " a/chat@" + hh(0) + " a/demo@" + hh(-3600) + " a/demo@" + hh(0)},
		{&llmgwv1.UsageRequest{Tenant: "a", Model: "demo"}, "a/demo@" + hh(-3600) + " a/demo@" + hh(0)},
		{&llmgwv1.UsageRequest{Tenant: "a", SinceUnix: h + 59}, "a/chat@" + hh(0) + " a/demo@" + hh(0)},
		{&llmgwv1.UsageRequest{Model: "chat"}, "a/chat@" + hh(0)},
		{&llmgwv1.UsageRequest{Tenant: "b"}, ""},
	} {
		resp, err := a.Usage(ctx, tt.req)
		if err != nil || rows(resp) != tt.want {
			t.Errorf("usage %v: %q, %v; want %q", tt.req, rows(resp), err, tt.want)
		}
	}
	if _, err := a.Usage(ctx, &llmgwv1.UsageRequest{SinceUnix: -1}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("usage since -1: %v, want INVALID_ARGUMENT", err)
	}
}

// TestKeyTenants: a key is created in a tenant that exists, moved to
// another and back to its own; a tenant a key belongs to cannot be
// deleted (FAILED_PRECONDITION naming the key). Bad input — an unknown
// tenant at create or move, a key moved to a deleted tenant, an unknown
// key, a malformed tenant name — is refused saying what to do, and
// nothing is applied.
func TestKeyTenants(t *testing.T) {
	a, f, p := tenantService(t)
	ctx := context.Background()
	h := sha256.Sum256([]byte("sk-test"))
	for _, n := range []string{"team-a", "team-b"} {
		if _, err := a.PutTenant(ctx, &llmgwv1.PutTenantRequest{Create: true, Tenant: &llmgwv1.Tenant{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := a.CreateApiKey(ctx, &llmgwv1.CreateApiKeyRequest{Name: "k1", SecretSha256: h[:], Tenant: "nope"})
	wantCode(t, "create a key in an unknown tenant", err, codes.NotFound, `tenant "nope" not found: create it first (llmgwctl tenant create nope)`)
	if len(f.State().ApiKeys) != 0 {
		t.Fatal("a refused create stored a key")
	}
	created, err := a.CreateApiKey(ctx, &llmgwv1.CreateApiKeyRequest{Name: "k1", SecretSha256: h[:], Tenant: "team-a"})
	if err != nil || created.Key.Tenant != "team-a" || created.Key.CreatedUnix != 1_700_000_123 {
		t.Fatalf("create k1 in team-a: %v, %v", created, err)
	}
	proposals := p.proposals
	_, err = a.DeleteTenant(ctx, &llmgwv1.DeleteTenantRequest{Name: "team-a"})
	wantCode(t, "delete a tenant a key belongs to", err, codes.FailedPrecondition, `tenant "team-a": keys [k1] belong to it; move them (llmgwctl apikey update NAME --tenant T)`)
	if _, ok := f.Tenant("team-a"); !ok || p.proposals != proposals {
		t.Fatalf("a refused delete deleted the tenant (%v) or proposed %d commands", !ok, p.proposals-proposals)
	}
	if _, err := a.SetApiKeyTenant(ctx, &llmgwv1.SetApiKeyTenantRequest{Name: "k1", Tenant: "team-b"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.DeleteTenant(ctx, &llmgwv1.DeleteTenantRequest{Name: "team-a"}); err != nil {
		t.Fatalf("delete team-a once its key moved: %v", err)
	}

	keyTenant := func() string { return f.State().ApiKeys[0].Tenant }
	proposals = p.proposals
	for _, tt := range []struct {
		name string
		req  *llmgwv1.SetApiKeyTenantRequest
		code codes.Code
		want string
	}{
		{"to a deleted tenant", &llmgwv1.SetApiKeyTenantRequest{Name: "k1", Tenant: "team-a"}, codes.NotFound, `tenant "team-a" not found: create it first`},
		{"to an unknown tenant", &llmgwv1.SetApiKeyTenantRequest{Name: "k1", Tenant: "nope"}, codes.NotFound, "create it first"},
		{"an unknown key", &llmgwv1.SetApiKeyTenantRequest{Name: "nokey", Tenant: "team-b"}, codes.NotFound, `api key "nokey" not found`},
		{"no key", &llmgwv1.SetApiKeyTenantRequest{Tenant: "team-b"}, codes.InvalidArgument, "name: required"},
		{"a malformed tenant", &llmgwv1.SetApiKeyTenantRequest{Name: "k1", Tenant: "Team B"}, codes.InvalidArgument, "tenant: must match"},
	} {
		_, err := a.SetApiKeyTenant(ctx, tt.req)
		wantCode(t, tt.name, err, tt.code, tt.want)
		if keyTenant() != "team-b" {
			t.Fatalf("%s: the key's tenant is %q after a refused move", tt.name, keyTenant())
		}
	}
	// An unknown key is the FSM's refusal, after a log entry; the rest
	// cost none.
	if p.proposals != proposals+1 {
		t.Fatalf("refused moves proposed %d commands, want 1 (the unknown key's)", p.proposals-proposals)
	}
	_, err = a.DeleteTenant(ctx, &llmgwv1.DeleteTenantRequest{Name: "team-a"})
	wantCode(t, "delete a deleted tenant", err, codes.NotFound, `tenant "team-a" not found`)
	if _, err := a.SetApiKeyTenant(ctx, &llmgwv1.SetApiKeyTenantRequest{Name: "k1"}); err != nil || keyTenant() != "" {
		t.Fatalf("move k1 back to its own tenant: %v, tenant %q", err, keyTenant())
	}
	if _, err := a.DeleteTenant(ctx, &llmgwv1.DeleteTenantRequest{Name: "team-b"}); err != nil {
		t.Fatal(err)
	}
}
