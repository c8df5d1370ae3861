//go:build !llmgw_upgrade_old

package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/controlplane/service/admin"
	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// fsmProposer commits each command straight to an FSM, one index each, as
// the leader's store would, and counts them.
type fsmProposer struct {
	mu        sync.Mutex
	f         *fsm.FSM
	proposals int
}

func (p *fsmProposer) Propose(_ context.Context, t llmgwv1.CommandType, payload proto.Message) (any, uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.proposals++
	data, err := fsm.NewCommand(t, payload)
	if err != nil {
		return nil, 0, err
	}
	idx := p.f.Revision() + 1
	res, err := p.f.ApplyAt(idx, time.Now().Unix(), data)
	return res, idx, err
}

// serveTenantAdmin serves the real AdminService over an FSM, so the
// commands meet the server's own validation and refusals.
func serveTenantAdmin(t *testing.T) (string, *fsm.FSM, *fsmProposer) {
	t.Helper()
	f := fsm.New(fsm.Config{})
	p := &fsmProposer{f: f}
	return serveAdmin(t, noClusterStatus{admin.New("c1", admin.Deps{Propose: p, State: f}, slog.New(slog.DiscardHandler))}), f, p
}

// noClusterStatus is the AdminService without Raft: ClusterStatus, which
// reads Raft and which a gated command asks first (gateNote), is not
// served, so no note is printed.
type noClusterStatus struct{ *admin.Service }

func (noClusterStatus) ClusterStatus(context.Context, *llmgwv1.ClusterStatusRequest) (*llmgwv1.ClusterStatusResponse, error) {
	return nil, status.Error(codes.Unimplemented, "no raft in this test")
}

// TestTenantCommands: create sets what is given (a limit not given is no
// limit), per-model limits in any order, weights in thousandths, priority
// classes; get and list show them, -o json as numbers; update changes
// only the flags given (a class not given is kept, "" clears one); keys are created in a tenant, moved to another and back to their
// own; a tenant a key belongs to is not deleted.
func TestTenantCommands(t *testing.T) {
	addr, f, _ := serveTenantAdmin(t)
	out, err := run(addr, "tenant", "create", "team-a", "--models", "demo,chat", "--rpm", "60", "--input-tpm", "1000",
		"--weights", "input=1,cached=0.1,output=4", "--daily-tokens", "5000", "--monthly-tokens", "100000",
		"--model-limit", "zeta:rpm=5", "--model-limit", "demo:input-tpm=100,concurrency=2", "--shadow",
		"--default-class", "standard", "--max-class", "interactive")
	if err != nil || !strings.Contains(out, "tenant team-a created at revision 1") {
		t.Fatalf("create: %v\n%s", err, out)
	}
	want := &llmgwv1.Tenant{Name: "team-a", Models: []string{"demo", "chat"},
		Limits: &llmgwv1.TenantLimits{Rpm: 60, InputTpm: 1000, DailyTokens: 5000, MonthlyTokens: 100000},
		ModelLimits: []*llmgwv1.TenantModelLimits{
			{Model: "demo", Limits: &llmgwv1.TenantLimits{InputTpm: 100, Concurrency: 2}},
			{Model: "zeta", Limits: &llmgwv1.TenantLimits{Rpm: 5}},
		},
		Weights:      &llmgwv1.TokenWeights{InputMilli: 1000, CachedMilli: 100, OutputMilli: 4000},
		Shadow:       true,
		DefaultClass: "standard",
		MaxClass:     "interactive",
	}
	stored := func() *llmgwv1.Tenant {
		got, _ := f.Tenant("team-a")
		got = proto.Clone(got).(*llmgwv1.Tenant)
		got.CreatedUnix, got.Revision = 0, 0
		return got
	}
	if got := stored(); !proto.Equal(got, want) {
		t.Fatalf("stored\n%v\nwant\n%v", got, want)
	}

	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"tenant", "get", "team-a"}, []string{"weights", "input=1,cached=0.1,output=4", "demo:input-tpm=100,concurrency=2", "zeta:rpm=5",
			"output-tpm      -", "daily-tokens    5000", "shadow          true", "default-class   standard", "max-class       interactive"}},
		{[]string{"tenant", "get", "team-a", "-o", "json"}, []string{`"input_tpm": 1000`, `"cached_milli": 100`, `"model": "demo"`,
			`"default_class": "standard"`, `"max_class": "interactive"`}},
		{[]string{"tenant", "list"}, []string{"NAME", "INPUT-TPM", "MODEL LIMITS", "CLASS", "team-a", "demo,chat", "60", "standard/interactive"}},
		{[]string{"tenant", "list", "-o", "json"}, []string{`"name": "team-a"`, `"rpm": 60`, `"default_class": "standard"`, `"max_class": "interactive"`}},
	} {
		out, err := run(addr, tt.args...)
		if err != nil {
			t.Fatalf("%v: %v", tt.args, err)
		}
		for _, w := range tt.want {
			if !strings.Contains(out, w) {
				t.Errorf("%v lacks %q:\n%s", tt.args, w, out)
			}
		}
	}

	// Only what is given changes: --rpm, --shadow=false, zeta's limits
	// removed; the rest as stored.
	if out, err := run(addr, "tenant", "update", "team-a", "--rpm", "30", "--shadow=false", "--model-limit", "zeta:"); err != nil ||
		!strings.Contains(out, "tenant team-a updated at revision") {
		t.Fatalf("update: %v\n%s", err, out)
	}
	want.Limits.Rpm, want.Shadow, want.ModelLimits = 30, false, want.ModelLimits[:1]
	if got := stored(); !proto.Equal(got, want) {
		t.Fatalf("after update\n%v\nwant\n%v", got, want)
	}
	if _, err := run(addr, "tenant", "update", "team-a", "--model-limit", "demo:rpm=7", "--models", ""); err != nil {
		t.Fatal(err)
	}
	want.Models, want.ModelLimits = nil, []*llmgwv1.TenantModelLimits{{Model: "demo", Limits: &llmgwv1.TenantLimits{Rpm: 7}}}
	if got := stored(); !proto.Equal(got, want) {
		t.Fatalf("after the second update\n%v\nwant\n%v", got, want)
	}

	// A class given alone changes alone; "" clears it.
	if _, err := run(addr, "tenant", "update", "team-a", "--max-class", ""); err != nil {
		t.Fatal(err)
	}
	want.MaxClass = ""
	if got := stored(); !proto.Equal(got, want) {
		t.Fatalf("after clearing --max-class\n%v\nwant\n%v", got, want)
	}
	if _, err := run(addr, "tenant", "update", "team-a", "--default-class", "batch"); err != nil {
		t.Fatal(err)
	}
	want.DefaultClass = "batch"
	if got := stored(); !proto.Equal(got, want) {
		t.Fatalf("after --default-class batch\n%v\nwant\n%v", got, want)
	}

	if _, err := run(addr, "tenant", "create", "team-b"); err != nil {
		t.Fatal(err)
	}
	// CLASS: default/max, - for one not set, - alone for neither.
	out, err = run(addr, "tenant", "list")
	if err != nil {
		t.Fatal(err)
	}
	classCol := map[string]string{}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	header := strings.Fields(strings.ReplaceAll(lines[0], "MODEL LIMITS", "MODEL_LIMITS"))
	col := slices.Index(header, "CLASS")
	for _, l := range lines[1:] {
		f := strings.Fields(strings.ReplaceAll(l, "every model", "every_model"))
		if col < 0 || len(f) != len(header) {
			t.Fatalf("tenant list: %q does not line up with %q", l, lines[0])
		}
		classCol[f[0]] = f[col]
	}
	if classCol["team-a"] != "batch/-" || classCol["team-b"] != "-" {
		t.Fatalf("CLASS column %v, want team-a batch/-, team-b -:\n%s", classCol, out)
	}
	if out, err := run(addr, "tenant", "get", "team-b"); err != nil || !strings.Contains(out, "default-class   - (the routers' flow.default_class)") ||
		!strings.Contains(out, "max-class       - (the default class)") {
		t.Fatalf("tenant get of a tenant without classes: %v\n%s", err, out)
	}
	out, err = run(addr, "apikey", "create", "k1", "--tenant", "team-a")
	if err != nil || !strings.Contains(out, "in tenant team-a") {
		t.Fatalf("apikey create --tenant: %v\n%s", err, out)
	}
	if out, err := run(addr, "apikey", "list"); err != nil || !strings.Contains(out, "TENANT") || !strings.Contains(out, "team-a") {
		t.Fatalf("apikey list: %v\n%s", err, out)
	}
	if _, err := run(addr, "tenant", "delete", "team-a"); err == nil || !strings.Contains(err.Error(), "keys [k1] belong to it") || exitCode(err) != exitError {
		t.Fatalf("delete a tenant a key belongs to: %v (exit %d)", err, exitCode(err))
	}
	if out, err := run(addr, "apikey", "update", "k1", "--tenant", "team-b"); err != nil || !strings.Contains(out, "api key k1 moved to tenant team-b") {
		t.Fatalf("apikey update: %v\n%s", err, out)
	}
	if out, err := run(addr, "tenant", "delete", "team-a"); err != nil || !strings.Contains(out, "tenant team-a deleted at revision") {
		t.Fatalf("delete: %v\n%s", err, out)
	}
	if out, err := run(addr, "apikey", "update", "k1", "--tenant", ""); err != nil || !strings.Contains(out, "moved to tenant k1 (own)") {
		t.Fatalf("apikey update --tenant \"\": %v\n%s", err, out)
	}
	if k := f.State().ApiKeys[0]; k.Tenant != "" {
		t.Fatalf("k1's tenant is %q after moving back to its own", k.Tenant)
	}
}

// TestTenantBadInput (issue 28's must-show): unknown tenants, negative
// and absurd limits, a daily budget above the monthly one, a key moved to
// a deleted tenant: each is refused with a message naming the flag, exits
// non-zero, and applies nothing.
func TestTenantBadInput(t *testing.T) {
	addr, f, p := serveTenantAdmin(t)
	for _, args := range [][]string{
		{"tenant", "create", "team-a", "--monthly-tokens", "100000"},
		{"tenant", "create", "gone"},
		{"apikey", "create", "k1", "--tenant", "gone"},
		{"apikey", "update", "k1", "--tenant", ""},
		{"tenant", "delete", "gone"},
	} {
		if out, err := run(addr, args...); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	for _, tt := range []struct {
		name string
		args []string
		want string
		exit int
	}{
		{"negative rpm", []string{"tenant", "create", "b", "--rpm=-5"}, "tenant create b: --rpm: must not be negative, got -5", exitUsage},
		{"negative rpm on update", []string{"tenant", "update", "team-a", "--rpm", "-5"}, "--rpm: must not be negative, got -5", exitUsage},
		{"not a number", []string{"tenant", "create", "b", "--concurrency", "lots"}, `invalid argument "lots" for "--concurrency"`, exitUsage},
		{"absurd input-tpm", []string{"tenant", "create", "b", "--input-tpm", "1000000000001"}, "--input-tpm: at most 1000000000000, got 1000000000001", exitUsage},
		{"absurd concurrency", []string{"tenant", "create", "b", "--concurrency", "9999999999"}, "--concurrency: at most 1000000", exitUsage},
		{"daily above monthly", []string{"tenant", "create", "b", "--daily-tokens", "10", "--monthly-tokens", "5"},
			"--daily-tokens: 10 is above --monthly-tokens 5", exitUsage},
		{"daily above the stored monthly", []string{"tenant", "update", "team-a", "--daily-tokens", "200000"},
			"tenant update team-a: --daily-tokens: 200000 is above --monthly-tokens 100000", exitUsage},
		{"absurd model limit", []string{"tenant", "create", "b", "--model-limit", "zeta:rpm=1", "--model-limit", "demo:rpm=100000001"},
			"--model-limit demo:rpm: at most 100000000", exitUsage},
		{"model limit daily above monthly", []string{"tenant", "create", "b", "--model-limit", "demo:daily-tokens=9,monthly-tokens=3"},
			"--model-limit demo:daily-tokens: 9 is above monthly-tokens 3", exitUsage},
		{"negative model limit", []string{"tenant", "create", "b", "--model-limit", "demo:rpm=-1"}, "--model-limit demo:rpm: must not be negative, got -1", exitUsage},
		{"unknown model limit", []string{"tenant", "create", "b", "--model-limit", "demo:tpm=1"}, `--model-limit demo: "tpm=1" is not one of rpm`, exitUsage},
		{"model limit without a model", []string{"tenant", "create", "b", "--model-limit", "rpm=1"}, `--model-limit: "rpm=1" is not of the form MODEL:`, exitUsage},
		{"bad model limit name", []string{"tenant", "create", "b", "--model-limit", "Demo:rpm=1"}, "--model-limit Demo: must match", exitUsage},
		{"negative weight", []string{"tenant", "create", "b", "--weights", "cached=-1"}, "--weights cached: must not be negative, got -1", exitUsage},
		{"absurd weight", []string{"tenant", "create", "b", "--weights", "output=5000"}, "--weights output: at most 1000 (1000 ×), got 5000", exitUsage},
		{"unknown weight", []string{"tenant", "create", "b", "--weights", "prompt=1"}, `--weights: "prompt=1" is not input=N`, exitUsage},
		{"zero weights", []string{"tenant", "create", "b", "--weights", "input=0,cached=0,output=0"}, "--weights: at least one weight must be above 0", exitUsage},
		{"model twice", []string{"tenant", "create", "b", "--models", "demo,demo"}, `--models: "demo" is listed twice`, exitUsage},
		{"bad name", []string{"tenant", "create", "Team B"}, "tenant create Team B: NAME: must match", exitUsage},
		{"bad default class", []string{"tenant", "create", "b", "--default-class", "Interactive"},
			`tenant create b: --default-class: must match [a-z][a-z0-9_-]* and be at most 32 characters, got "Interactive"`, exitUsage},
		{"bad max class", []string{"tenant", "create", "b", "--max-class", "1st"}, `--max-class: must match`, exitUsage},
		{"long class", []string{"tenant", "create", "b", "--max-class", strings.Repeat("x", fsm.MaxClassLen+1)}, `--max-class: must match`, exitUsage},
		{"bad class on update", []string{"tenant", "update", "team-a", "--default-class", "best effort"},
			`tenant update team-a: --default-class: must match`, exitUsage},
		{"name in use", []string{"tenant", "create", "team-a"}, `tenant create team-a: tenant "team-a" already exists (llmgwctl tenant update team-a changes it)`, exitError},
		{"update of an unknown tenant", []string{"tenant", "update", "nope", "--rpm", "1"}, `tenant update nope: tenant "nope" not found`, exitNotFound},
		{"update without a flag", []string{"tenant", "update", "team-a"}, "no flag given: nothing to change", exitUsage},
		{"get an unknown tenant", []string{"tenant", "get", "nope"}, `tenant "nope" not found`, exitNotFound},
		{"delete an unknown tenant", []string{"tenant", "delete", "nope"}, `tenant "nope" not found`, exitNotFound},
		{"key in an unknown tenant", []string{"apikey", "create", "k2", "--tenant", "nope"},
			`tenant "nope" not found: create it first (llmgwctl tenant create nope)`, exitNotFound},
		{"key in a malformed tenant", []string{"apikey", "create", "k2", "--tenant", "No Such"}, "apikey create: --tenant: must match", exitError},
		{"key moved to a deleted tenant", []string{"apikey", "update", "k1", "--tenant", "gone"}, `tenant "gone" not found: create it first`, exitNotFound},
		{"unknown key moved", []string{"apikey", "update", "nokey", "--tenant", "team-a"}, `api key "nokey" not found`, exitNotFound},
		{"key moved without --tenant", []string{"apikey", "update", "k1"}, "--tenant: required", exitUsage},
		{"key moved to a malformed tenant", []string{"apikey", "update", "k1", "--tenant", "No Such"}, "--tenant: must match", exitUsage},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before, proposals, rev := stateJSON(f), p.proposals, f.Revision()
			_, err := run(addr, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("%v: %v, want %q", tt.args, err, tt.want)
			}
			if got := exitCode(err); got != tt.exit {
				t.Errorf("%v: exit %d, want %d (%v)", tt.args, got, tt.exit, err)
			}
			if stateJSON(f) != before {
				t.Fatalf("%v changed the state", tt.args)
			}
			// Refusals the client or the service can make cost no log
			// entry; only the FSM's own (an unknown key) do.
			if tt.name != "unknown key moved" && (p.proposals != proposals || f.Revision() != rev) {
				t.Fatalf("%v proposed %d commands", tt.args, p.proposals-proposals)
			}
		})
	}
}

// stateJSON is the tenants and keys as the FSM holds them, revisions aside.
func stateJSON(f *fsm.FSM) string {
	st := f.State()
	var b strings.Builder
	for _, t := range st.Tenants {
		b.WriteString(protojson.Format(t))
	}
	for _, k := range st.ApiKeys {
		b.WriteString(protojson.Format(k))
	}
	return b.String()
}

// refusingAdmin refuses every PutTenant with one INVALID_ARGUMENT, as a
// server with other bounds than this llmgwctl's would.
type refusingAdmin struct {
	llmgwv1.UnimplementedAdminServiceServer
	msg string
}

func (r *refusingAdmin) PutTenant(context.Context, *llmgwv1.PutTenantRequest) (*llmgwv1.PutTenantResponse, error) {
	return nil, status.Error(codes.InvalidArgument, r.msg)
}

// TestTenantServerFieldNames: a server's INVALID_ARGUMENT names a field in
// the FSM's spelling; llmgwctl says the flag instead, the model of a
// per-model limit by the order it sent them in.
func TestTenantServerFieldNames(t *testing.T) {
	for _, tt := range []struct{ msg, want string }{
		{"input_tpm: at most 5, got 6", "tenant create b: --input-tpm: at most 5, got 6"},
		{"model_limits[1].rpm: at most 5, got 6", "--model-limit zeta:rpm: at most 5, got 6"},
		{"model_limits[0].daily_tokens: 9 is above monthly_tokens 3", "--model-limit demo:daily-tokens: 9 is above monthly-tokens 3"},
		{"weights.cached: at most 1000 (1000 ×), got 2000.000", "--weights cached: at most 1000"},
		{"daily_tokens: 9 is above monthly_tokens 3", "--daily-tokens: 9 is above --monthly-tokens 3"},
		{"models[0]: must match", "--models: must match"},
		{"default_class: must match [a-z]", "--default-class: must match [a-z]"},
		{"max_class: must match [a-z]", "--max-class: must match [a-z]"},
		{"something else entirely", "tenant create b: something else entirely"},
	} {
		addr := serveAdmin(t, &refusingAdmin{msg: tt.msg})
		_, err := run(addr, "tenant", "create", "b", "--model-limit", "zeta:rpm=1", "--model-limit", "demo:rpm=1")
		if err == nil || !strings.Contains(err.Error(), tt.want) || exitCode(err) != exitError {
			t.Errorf("server says %q: llmgwctl says %v (exit %d), want %q", tt.msg, err, exitCode(err), tt.want)
		}
	}
}

// countingAdmin counts the tenant calls it is sent, answering each as a
// server would for a tenant that exists.
type countingAdmin struct {
	llmgwv1.UnimplementedAdminServiceServer
	mu    sync.Mutex
	calls int
}

func (c *countingAdmin) GetTenant(_ context.Context, req *llmgwv1.GetTenantRequest) (*llmgwv1.Tenant, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	return &llmgwv1.Tenant{Name: req.Name}, nil
}

func (c *countingAdmin) PutTenant(_ context.Context, req *llmgwv1.PutTenantRequest) (*llmgwv1.PutTenantResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	return &llmgwv1.PutTenantResponse{Tenant: req.Tenant, Revision: 1}, nil
}

// TestTenantClassRefusedBeforeACall: a malformed class is refused naming
// its flag before llmgwctl sends anything, an update's read of the stored
// tenant included; a well-formed one is sent.
func TestTenantClassRefusedBeforeACall(t *testing.T) {
	srv := &countingAdmin{}
	addr := serveAdmin(t, srv)
	for _, args := range [][]string{
		{"tenant", "create", "b", "--default-class", "Batch"},
		{"tenant", "create", "b", "--max-class", "a.b"},
		{"tenant", "update", "b", "--default-class", "-batch"},
		{"tenant", "update", "b", "--rpm", "5", "--max-class", "_x"},
	} {
		_, err := run(addr, args...)
		if err == nil || exitCode(err) != exitUsage || !strings.Contains(err.Error(), "-class: must match") {
			t.Errorf("%v: %v (exit %d), want a usage error naming the flag", args, err, exitCode(err))
		}
	}
	srv.mu.Lock()
	calls := srv.calls
	srv.mu.Unlock()
	if calls != 0 {
		t.Fatalf("%d calls sent for commands refused locally", calls)
	}
	if _, err := run(addr, "tenant", "update", "b", "--default-class", "batch", "--max-class", "tier-1_b"); err != nil {
		t.Fatal(err)
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.calls != 2 {
		t.Fatalf("%d calls for an update, want a get and a put", srv.calls)
	}
}

// TestUsageCommand: the roll-up by hour with a total line per tenant, or
// in total; filtered by tenant, model and --since; the anonymous tenant
// shown as -; -o json rows with numbers; bad flags refused before a call.
func TestUsageCommand(t *testing.T) {
	addr, f, p := serveTenantAdmin(t)
	now := time.Now().Unix()
	h := now - now%3600
	if _, _, err := p.Propose(context.Background(), llmgwv1.CommandType_COMMAND_TYPE_RECORD_USAGE, &llmgwv1.RecordUsageCommand{Router: "r1", Session: 1, Seq: 1, Rows: []*llmgwv1.UsageRow{
		{Tenant: "team-a", Model: "demo", HourUnix: h - 3600, Counts: &llmgwv1.UsageCounts{Requests: 1, InputTokens: 10, OutputTokens: 1}},
		{Tenant: "team-a", Model: "demo", HourUnix: h, Counts: &llmgwv1.UsageCounts{Requests: 2, Refused: 1, InputTokens: 20, CachedTokens: 8, OutputTokens: 5}},
		{Tenant: "team-a", Model: "chat", HourUnix: h, Counts: &llmgwv1.UsageCounts{Requests: 3, ShadowRefused: 2, InputTokens: 30, OutputTokens: 7}},
		{Tenant: "", Model: "demo", HourUnix: h, Counts: &llmgwv1.UsageCounts{Requests: 4}},
		{Tenant: "team-b", Model: "demo", HourUnix: h - 48*3600, Counts: &llmgwv1.UsageCounts{Requests: 9}},
	}}); err != nil {
		t.Fatal(err)
	}
	hour := func(u int64) string { return time.Unix(u, 0).UTC().Format("2006-01-02T15Z") }
	fields := func(out string) []string {
		var lines []string
		for l := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
			lines = append(lines, strings.Join(strings.Fields(l), " "))
		}
		return lines
	}
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"usage"}, []string{
			"TENANT MODEL HOUR REQUESTS REFUSED SHADOW_REFUSED INPUT CACHED OUTPUT",
			"- demo " + hour(h) + " 4 0 0 0 0 0",
			"team-a chat " + hour(h) + " 3 0 2 30 0 7",
			"team-a demo " + hour(h-3600) + " 1 0 0 10 0 1",
			"team-a demo " + hour(h) + " 2 1 0 20 8 5",
			"team-a (all) total 6 1 2 60 8 13",
		}},
		{[]string{"usage", "--tenant", "team-a", "--by", "total"}, []string{
			"TENANT MODEL HOUR REQUESTS REFUSED SHADOW_REFUSED INPUT CACHED OUTPUT",
			"team-a chat total 3 0 2 30 0 7",
			"team-a demo total 3 1 0 30 8 6",
			"team-a (all) total 6 1 2 60 8 13",
		}},
		{[]string{"usage", "--model", "demo", "--since", "72h", "--by", "total"}, []string{
			"TENANT MODEL HOUR REQUESTS REFUSED SHADOW_REFUSED INPUT CACHED OUTPUT",
			"- demo total 4 0 0 0 0 0",
			"team-a demo total 3 1 0 30 8 6",
			"team-b demo total 9 0 0 0 0 0",
		}},
		{[]string{"usage", "--tenant", "team-b"}, []string{"no usage in the period"}},
	} {
		out, err := run(addr, tt.args...)
		if err != nil {
			t.Fatalf("%v: %v", tt.args, err)
		}
		if got := fields(out); strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
			t.Errorf("%v:\n%s\nwant\n%s", tt.args, strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
		}
	}

	out, err := run(addr, "usage", "--tenant", "team-a", "--model", "demo", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var rows []struct {
		Tenant   string `json:"tenant"`
		HourUnix int64  `json:"hour_unix"`
		Counts   struct {
			InputTokens uint64 `json:"input_tokens"`
		} `json:"counts"`
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows) != 2 || rows[1].HourUnix != h || rows[1].Counts.InputTokens != 20 {
		t.Fatalf("json %+v (%v):\n%s", rows, err, out)
	}
	rev := f.Revision()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"usage", "--by", "day"}, `--by: "day" is neither hour nor total`},
		{[]string{"usage", "--since", "-1h"}, "--since: must not be negative"},
		{[]string{"usage", "--since", "yesterday"}, `invalid argument "yesterday" for "--since"`},
	} {
		if _, err := run(addr, tt.args...); err == nil || !strings.Contains(err.Error(), tt.want) || exitCode(err) != exitUsage {
			t.Errorf("%v: %v, want a usage error %q", tt.args, err, tt.want)
		}
	}
	if f.Revision() != rev {
		t.Fatal("a read changed the state")
	}
}
