//go:build !llmgw_upgrade_old

package fsm

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// hour0 is an hour boundary (2026-01-01 00:00 UTC) the usage tests count
// from.
const hour0 = int64(1_767_225_600)

func hourN(n int64) int64 { return hour0 + n*3600 }

func team(name string) *llmgwv1.Tenant {
	return &llmgwv1.Tenant{Name: name, Models: []string{"demo"}, Limits: &llmgwv1.TenantLimits{Rpm: 100, DailyTokens: 1000, MonthlyTokens: 10000}}
}

func putTenant(t testing.TB, tn *llmgwv1.Tenant, create bool) []byte {
	return mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_PUT_TENANT, &llmgwv1.PutTenantCommand{Tenant: tn, Create: create})
}

func deleteTenant(t testing.TB, name string) []byte {
	return mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_DELETE_TENANT, &llmgwv1.DeleteTenantCommand{Name: name})
}

func setKeyTenant(t testing.TB, key, tenant string) []byte {
	return mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_SET_API_KEY_TENANT, &llmgwv1.SetApiKeyTenantCommand{Name: key, Tenant: tenant})
}

func putKeyIn(t testing.TB, name, secret, tenant string) []byte {
	return mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_PUT_API_KEY, &llmgwv1.PutApiKeyCommand{Key: &llmgwv1.ApiKey{
		Name: name, SecretSha256: keyHash(secret), Tenant: tenant, CreatedUnix: 1700000000}})
}

func usageBatch(t testing.TB, router string, session, seq uint64, rows ...*llmgwv1.UsageRow) []byte {
	return mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_RECORD_USAGE, &llmgwv1.RecordUsageCommand{Router: router, Session: session, Seq: seq, Rows: rows})
}

// urow is one request's row: in input and out output tokens.
func urow(tenant, model string, hour int64, in, out uint64) *llmgwv1.UsageRow {
	return &llmgwv1.UsageRow{Tenant: tenant, Model: model, HourUnix: hour, Counts: &llmgwv1.UsageCounts{Requests: 1, InputTokens: in, OutputTokens: out}}
}

// mustApply applies cmd at index and fails the test on an error.
func mustApply(t testing.TB, f *FSM, index uint64, cmd []byte) any {
	t.Helper()
	res, err := f.Apply(index, cmd)
	if err != nil {
		t.Fatalf("apply %d: %v", index, err)
	}
	return res
}

// applyUnchanged applies cmd at index and checks that it changed nothing
// but the revision: the state is as it was and no change was logged.
func applyUnchanged(t testing.TB, f *FSM, index uint64, cmd []byte) (any, error) {
	t.Helper()
	before := f.State()
	res, err := f.Apply(index, cmd)
	after := f.State()
	if after.Revision != index {
		t.Errorf("revision %d after the command, want %d", after.Revision, index)
	}
	after.Revision = before.Revision
	if !proto.Equal(before, after) {
		t.Errorf("the command (err %v) changed the state:\nbefore %v\nafter  %v", err, before, after)
	}
	if changes, ok := f.ChangesSince(before.Revision); !ok || len(changes) != 0 {
		t.Errorf("the command (err %v) logged changes %v", err, changes)
	}
	return res, err
}

// wantInvalid checks err is a validation error on field whose message
// names the field.
func wantInvalid(t testing.TB, err error, field string) {
	t.Helper()
	var ve *ValidationError
	if !errors.As(err, &ve) || ve.Field != field {
		t.Fatalf("err = %v, want a validation error on %s", err, field)
	}
	if !strings.Contains(err.Error(), field+": ") {
		t.Fatalf("err = %q does not name %s", err, field)
	}
}

// TestValidateTenant: every limit is bounded, the field named as the flag
// spells it (prefixed for a model's); a day's budget cannot pass its
// month's; models are listed once; per-model limits are sorted, each
// model once; weights are bounded and not all zero; priority classes are
// empty or of the class shape.
func TestValidateTenant(t *testing.T) {
	type limitField struct {
		name string
		set  func(*llmgwv1.TenantLimits, uint64)
		max  uint64
	}
	fields := []limitField{
		{"rpm", func(l *llmgwv1.TenantLimits, v uint64) { l.Rpm = v }, MaxRequestsLimit},
		{"input_tpm", func(l *llmgwv1.TenantLimits, v uint64) { l.InputTpm = v }, MaxTokensLimit},
		{"output_tpm", func(l *llmgwv1.TenantLimits, v uint64) { l.OutputTpm = v }, MaxTokensLimit},
		{"weighted_tpm", func(l *llmgwv1.TenantLimits, v uint64) { l.WeightedTpm = v }, MaxTokensLimit},
		{"concurrency", func(l *llmgwv1.TenantLimits, v uint64) { l.Concurrency = v }, MaxConcurrencyLimit},
		{"daily_tokens", func(l *llmgwv1.TenantLimits, v uint64) { l.DailyTokens = v }, MaxTokensLimit},
		{"monthly_tokens", func(l *llmgwv1.TenantLimits, v uint64) { l.MonthlyTokens = v }, MaxTokensLimit},
	}
	type tc struct {
		name    string
		tenant  *llmgwv1.Tenant
		invalid string // "" = valid
	}
	with := func(edit func(*llmgwv1.Tenant)) *llmgwv1.Tenant {
		tn := &llmgwv1.Tenant{Name: "team-a"}
		edit(tn)
		return tn
	}
	limits := func(f limitField, v uint64) *llmgwv1.TenantLimits {
		l := &llmgwv1.TenantLimits{}
		f.set(l, v)
		return l
	}
	var tests []tc
	for _, f := range fields {
		tests = append(tests,
			tc{f.name + " at its bound", with(func(tn *llmgwv1.Tenant) { tn.Limits = limits(f, f.max) }), ""},
			tc{f.name + " above its bound", with(func(tn *llmgwv1.Tenant) { tn.Limits = limits(f, f.max+1) }), f.name},
			tc{"model's " + f.name + " at its bound", with(func(tn *llmgwv1.Tenant) {
				tn.ModelLimits = []*llmgwv1.TenantModelLimits{{Model: "demo", Limits: limits(f, f.max)}}
			}), ""},
			tc{"model's " + f.name + " above its bound", with(func(tn *llmgwv1.Tenant) {
				tn.ModelLimits = []*llmgwv1.TenantModelLimits{{Model: "a"}, {Model: "demo", Limits: limits(f, f.max+1)}}
			}), "model_limits[1]." + f.name},
		)
	}
	manyModels := make([]string, MaxAPIKeyModels+1)
	for i := range manyModels {
		manyModels[i] = fmt.Sprintf("m%d", i)
	}
	// Sorted, each once: only their number is wrong.
	manyLimits := make([]*llmgwv1.TenantModelLimits, MaxTenantModelLimits+1)
	for i := range manyLimits {
		manyLimits[i] = &llmgwv1.TenantModelLimits{Model: fmt.Sprintf("m%04d", i)}
	}
	tests = append(tests, []tc{
		{"nil", nil, "tenant"},
		{"name only", with(func(*llmgwv1.Tenant) {}), ""},
		{"full", team("team-a"), ""},
		{"no name", &llmgwv1.Tenant{}, "name"},
		{"bad name", &llmgwv1.Tenant{Name: "Team A"}, "name"},
		{"daily above monthly", with(func(tn *llmgwv1.Tenant) { tn.Limits = &llmgwv1.TenantLimits{DailyTokens: 11, MonthlyTokens: 10} }), "daily_tokens"},
		{"daily equal to monthly", with(func(tn *llmgwv1.Tenant) { tn.Limits = &llmgwv1.TenantLimits{DailyTokens: 10, MonthlyTokens: 10} }), ""},
		{"daily without monthly", with(func(tn *llmgwv1.Tenant) { tn.Limits = &llmgwv1.TenantLimits{DailyTokens: 11} }), ""},
		{"model's daily above monthly", with(func(tn *llmgwv1.Tenant) {
			tn.ModelLimits = []*llmgwv1.TenantModelLimits{{Model: "demo", Limits: &llmgwv1.TenantLimits{DailyTokens: 11, MonthlyTokens: 10}}}
		}), "model_limits[0].daily_tokens"},
		{"model twice", with(func(tn *llmgwv1.Tenant) { tn.Models = []string{"demo", "chat", "demo"} }), "models[2]"},
		{"bad model", with(func(tn *llmgwv1.Tenant) { tn.Models = []string{"demo", "Not/A/Name"} }), "models[1]"},
		{"too many models", with(func(tn *llmgwv1.Tenant) { tn.Models = manyModels }), "models"},
		{"model limits sorted", with(func(tn *llmgwv1.Tenant) {
			tn.ModelLimits = []*llmgwv1.TenantModelLimits{{Model: "a"}, {Model: "b"}, {Model: "c"}}
		}), ""},
		{"model limits unsorted", with(func(tn *llmgwv1.Tenant) {
			tn.ModelLimits = []*llmgwv1.TenantModelLimits{{Model: "a"}, {Model: "c"}, {Model: "b"}}
		}), "model_limits[2].model"},
		{"model limits twice", with(func(tn *llmgwv1.Tenant) {
			tn.ModelLimits = []*llmgwv1.TenantModelLimits{{Model: "a"}, {Model: "a"}}
		}), "model_limits[1].model"},
		{"model limits without a model", with(func(tn *llmgwv1.Tenant) {
			tn.ModelLimits = []*llmgwv1.TenantModelLimits{{Limits: &llmgwv1.TenantLimits{Rpm: 1}}}
		}), "model_limits[0].model"},
		{"too many model limits", with(func(tn *llmgwv1.Tenant) { tn.ModelLimits = manyLimits }), "model_limits"},
		{"weights", with(func(tn *llmgwv1.Tenant) {
			tn.Weights = &llmgwv1.TokenWeights{InputMilli: 1000, CachedMilli: 100, OutputMilli: 4000}
		}), ""},
		{"one weight", with(func(tn *llmgwv1.Tenant) { tn.Weights = &llmgwv1.TokenWeights{OutputMilli: 1} }), ""},
		{"weights all zero", with(func(tn *llmgwv1.Tenant) { tn.Weights = &llmgwv1.TokenWeights{} }), "weights"},
		{"weights at the bound", with(func(tn *llmgwv1.Tenant) {
			tn.Weights = &llmgwv1.TokenWeights{InputMilli: MaxWeightMilli, CachedMilli: MaxWeightMilli, OutputMilli: MaxWeightMilli}
		}), ""},
		{"input weight above the bound", with(func(tn *llmgwv1.Tenant) { tn.Weights = &llmgwv1.TokenWeights{InputMilli: MaxWeightMilli + 1} }), "weights.input"},
		{"cached weight above the bound", with(func(tn *llmgwv1.Tenant) {
			tn.Weights = &llmgwv1.TokenWeights{InputMilli: 1, CachedMilli: MaxWeightMilli + 1}
		}), "weights.cached"},
		{"output weight above the bound", with(func(tn *llmgwv1.Tenant) { tn.Weights = &llmgwv1.TokenWeights{OutputMilli: MaxWeightMilli + 1} }), "weights.output"},
		{"both classes", with(func(tn *llmgwv1.Tenant) { tn.DefaultClass, tn.MaxClass = "standard", "interactive" }), ""},
		{"default class alone", with(func(tn *llmgwv1.Tenant) { tn.DefaultClass = "batch" }), ""},
		{"max class alone", with(func(tn *llmgwv1.Tenant) { tn.MaxClass = "batch" }), ""},
	}...)
	// A class's name, as default_class and as max_class: the shape alone,
	// as the control plane does not know the routers' flow.classes.
	for _, c := range []struct {
		name, class string
		ok          bool
	}{
		{"a letter", "a", true},
		{"digits, dash and underscore", "tier-1_b", true},
		{"at the length bound", strings.Repeat("c", MaxClassLen), true},
		{"past the length bound", strings.Repeat("c", MaxClassLen+1), false},
		{"upper case", "Interactive", false},
		{"starts with a digit", "1st", false},
		{"starts with a dash", "-batch", false},
		{"starts with an underscore", "_batch", false},
		{"a space", "best effort", false},
		{"a dot", "batch.low", false},
		{"a slash", "a/b", false},
		{"non-ASCII", "bätch", false},
		{"a trailing newline", "batch\n", false},
	} {
		for _, field := range []string{"default_class", "max_class"} {
			invalid := ""
			if !c.ok {
				invalid = field
			}
			tests = append(tests, tc{field + " " + c.name, with(func(tn *llmgwv1.Tenant) {
				if field == "default_class" {
					tn.DefaultClass = c.class
				} else {
					tn.MaxClass = c.class
				}
			}), invalid})
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidateTenant(tt.tenant)
			if tt.invalid == "" {
				if err != nil {
					t.Fatalf("ValidateTenant: %v", err)
				}
				return
			}
			wantInvalid(t, err, tt.invalid)
		})
	}
}

// TestTenantCommands: a create makes a tenant at its entry's time and
// index; an update replaces it whole (its classes too: llmgwctl sends the
// stored ones again) but keeps when it was made; a create
// of a name in use, an update or delete of an unknown one and a malformed
// tenant are refused and change nothing but the revision.
func TestTenantCommands(t *testing.T) {
	updated := &llmgwv1.Tenant{Name: "team-a", Models: []string{"chat"}, Shadow: true, CreatedUnix: 5,
		Limits: &llmgwv1.TenantLimits{Concurrency: 4}, Weights: &llmgwv1.TokenWeights{InputMilli: 1000, OutputMilli: 4000},
		DefaultClass: "batch", MaxClass: "standard"}
	classed := team("team-a")
	classed.DefaultClass, classed.MaxClass = "standard", "interactive"
	tests := []struct {
		name    string
		cmds    []func(testing.TB) []byte // applied at 100, 101, ..., appended at 1000, 1001, ...
		want    []string                  // tenant names after, sorted
		check   func(t *testing.T, f *FSM)
		wantErr error  // of the last command
		invalid string // field of the last command's validation error
	}{
		{name: "create", cmds: []func(testing.TB) []byte{func(t testing.TB) []byte { return putTenant(t, team("team-a"), true) }},
			want: []string{"team-a"},
			check: func(t *testing.T, f *FSM) {
				want := team("team-a")
				want.CreatedUnix, want.Revision = 1000, 100
				if got, ok := f.Tenant("team-a"); !ok || !proto.Equal(got, want) {
					t.Errorf("Tenant = %v, want %v", got, want)
				}
			}},
		{name: "create keeps a given creation time", cmds: []func(testing.TB) []byte{func(t testing.TB) []byte {
			tn := team("team-a")
			tn.CreatedUnix = 7
			return putTenant(t, tn, true)
		}},
			want: []string{"team-a"},
			check: func(t *testing.T, f *FSM) {
				if got, _ := f.Tenant("team-a"); got.GetCreatedUnix() != 7 {
					t.Errorf("created_unix %d, want 7", got.GetCreatedUnix())
				}
			}},
		{name: "create two", cmds: []func(testing.TB) []byte{
			func(t testing.TB) []byte { return putTenant(t, team("zeta"), true) },
			func(t testing.TB) []byte { return putTenant(t, team("alpha"), true) }},
			want: []string{"alpha", "zeta"}},
		{name: "update replaces whole, keeps created", cmds: []func(testing.TB) []byte{
			func(t testing.TB) []byte { return putTenant(t, team("team-a"), true) },
			func(t testing.TB) []byte { return putTenant(t, updated, false) }},
			want: []string{"team-a"},
			check: func(t *testing.T, f *FSM) {
				want := proto.Clone(updated).(*llmgwv1.Tenant)
				want.CreatedUnix, want.Revision = 1000, 101
				if got, _ := f.Tenant("team-a"); !proto.Equal(got, want) {
					t.Errorf("Tenant = %v, want %v", got, want)
				}
			}},
		{name: "update without classes clears them", cmds: []func(testing.TB) []byte{
			func(t testing.TB) []byte { return putTenant(t, classed, true) },
			func(t testing.TB) []byte { return putTenant(t, team("team-a"), false) }},
			want: []string{"team-a"},
			check: func(t *testing.T, f *FSM) {
				if got, _ := f.Tenant("team-a"); got.GetDefaultClass() != "" || got.GetMaxClass() != "" {
					t.Errorf("classes %q/%q after an update without them; want them replaced (empty)", got.GetDefaultClass(), got.GetMaxClass())
				}
			}},
		{name: "update keeps classes sent again", cmds: []func(testing.TB) []byte{
			func(t testing.TB) []byte { return putTenant(t, classed, true) },
			func(t testing.TB) []byte {
				tn := proto.Clone(classed).(*llmgwv1.Tenant)
				tn.Limits.Rpm = 7
				return putTenant(t, tn, false)
			}},
			want: []string{"team-a"},
			check: func(t *testing.T, f *FSM) {
				if got, _ := f.Tenant("team-a"); got.GetDefaultClass() != "standard" || got.GetMaxClass() != "interactive" || got.GetLimits().GetRpm() != 7 {
					t.Errorf("tenant %v; want rpm 7, classes standard/interactive", got)
				}
			}},
		{name: "delete", cmds: []func(testing.TB) []byte{
			func(t testing.TB) []byte { return putTenant(t, team("a"), true) },
			func(t testing.TB) []byte { return putTenant(t, team("b"), true) },
			func(t testing.TB) []byte { return deleteTenant(t, "a") }},
			want: []string{"b"}},
		{name: "delete then create again", cmds: []func(testing.TB) []byte{
			func(t testing.TB) []byte { return putTenant(t, team("a"), true) },
			func(t testing.TB) []byte { return deleteTenant(t, "a") },
			func(t testing.TB) []byte { return putTenant(t, team("a"), true) }},
			want: []string{"a"},
			check: func(t *testing.T, f *FSM) {
				if got, _ := f.Tenant("a"); got.GetCreatedUnix() != 1002 || got.GetRevision() != 102 {
					t.Errorf("created_unix %d, revision %d; want the new tenant's 1002, 102", got.GetCreatedUnix(), got.GetRevision())
				}
			}},
		{name: "create of a name in use", cmds: []func(testing.TB) []byte{
			func(t testing.TB) []byte { return putTenant(t, team("a"), true) },
			func(t testing.TB) []byte { return putTenant(t, &llmgwv1.Tenant{Name: "a", Shadow: true}, true) }},
			want: []string{"a"}, wantErr: ErrExists},
		{name: "update of an unknown name", cmds: []func(testing.TB) []byte{
			func(t testing.TB) []byte { return putTenant(t, team("a"), true) },
			func(t testing.TB) []byte { return putTenant(t, team("b"), false) }},
			want: []string{"a"}, wantErr: ErrNotFound},
		{name: "delete of an unknown name", cmds: []func(testing.TB) []byte{
			func(t testing.TB) []byte { return deleteTenant(t, "nope") }},
			wantErr: ErrNotFound},
		{name: "no tenant", cmds: []func(testing.TB) []byte{
			func(t testing.TB) []byte { return putTenant(t, nil, true) }},
			invalid: "tenant"},
		{name: "malformed update", cmds: []func(testing.TB) []byte{
			func(t testing.TB) []byte { return putTenant(t, team("a"), true) },
			func(t testing.TB) []byte {
				tn := team("a")
				tn.Limits.Rpm = MaxRequestsLimit + 1
				return putTenant(t, tn, false)
			}},
			want: []string{"a"}, invalid: "rpm"},
		{name: "malformed class on update", cmds: []func(testing.TB) []byte{
			func(t testing.TB) []byte { return putTenant(t, classed, true) },
			func(t testing.TB) []byte {
				tn := proto.Clone(classed).(*llmgwv1.Tenant)
				tn.MaxClass = "Top"
				return putTenant(t, tn, false)
			}},
			want: []string{"team-a"}, invalid: "max_class"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := New(Config{})
			applyAll(t, f, history(t)[:1])
			var err error
			for i, c := range tt.cmds {
				index, at := uint64(100+i), int64(1000+i)
				if i < len(tt.cmds)-1 || (tt.wantErr == nil && tt.invalid == "") {
					if _, err := f.ApplyAt(index, at, c(t)); err != nil {
						t.Fatalf("command %d: %v", i, err)
					}
					continue
				}
				before := f.State()
				_, err = f.ApplyAt(index, at, c(t))
				after := f.State()
				after.Revision = before.Revision
				if !proto.Equal(before, after) || f.Revision() != index {
					t.Errorf("a refused command changed the state (or the revision %d is not %d)", f.Revision(), index)
				}
				if ch, _ := f.ChangesSince(before.Revision); len(ch) != 0 {
					t.Errorf("a refused command logged %v", ch)
				}
			}
			var names []string
			for _, tn := range f.Tenants() {
				names = append(names, tn.Name)
			}
			if !slices.Equal(names, tt.want) {
				t.Errorf("tenants = %v, want %v", names, tt.want)
			}
			switch {
			case tt.invalid != "":
				wantInvalid(t, err, tt.invalid)
			case tt.wantErr != nil:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
			case tt.check != nil:
				tt.check(t, f)
			}
		})
	}
}

// TestPutTenantResult: the result is the stored tenant, a copy the caller
// may change.
func TestPutTenantResult(t *testing.T) {
	f := New(Config{})
	res := mustApply(t, f, 3, putTenant(t, team("a"), true))
	got, ok := res.(*llmgwv1.Tenant)
	if stored, _ := f.Tenant("a"); !ok || !proto.Equal(got, stored) {
		t.Fatalf("result %v, stored %v", res, stored)
	}
	got.Models = nil
	if stored, _ := f.Tenant("a"); len(stored.Models) != 1 {
		t.Fatal("changing the result changed the stored tenant")
	}
}

// TestDeleteTenantWithKeys: a tenant a key belongs to cannot be deleted,
// and the refusal names every such key (and no other); once they are moved
// away or revoked, it can.
func TestDeleteTenantWithKeys(t *testing.T) {
	f := New(Config{})
	mustApply(t, f, 1, putTenant(t, team("team"), true))
	mustApply(t, f, 2, putTenant(t, team("other"), true))
	mustApply(t, f, 3, putKeyIn(t, "key-b", "s1", "team"))
	mustApply(t, f, 4, putKeyIn(t, "key-a", "s2", "team"))
	mustApply(t, f, 5, putKeyIn(t, "key-c", "s3", ""))
	mustApply(t, f, 6, putKeyIn(t, "key-d", "s4", "other"))

	refused := func(index uint64, keys ...string) {
		t.Helper()
		_, err := applyUnchanged(t, f, index, deleteTenant(t, "team"))
		if !errors.Is(err, ErrConflict) {
			t.Fatalf("delete: %v, want ErrConflict", err)
		}
		if want := "keys [" + strings.Join(keys, " ") + "] belong to it"; !strings.Contains(err.Error(), want) {
			t.Fatalf("delete: %q does not say %q", err, want)
		}
	}
	refused(7, "key-a", "key-b")
	mustApply(t, f, 8, setKeyTenant(t, "key-a", "other"))
	refused(9, "key-b")
	mustApply(t, f, 10, deleteKey(t, "key-b"))
	mustApply(t, f, 11, deleteTenant(t, "team"))
	if _, ok := f.Tenant("team"); ok {
		t.Fatal("tenant still there after its delete")
	}

	// Moving its keys to their own tenants frees the other one.
	mustApply(t, f, 12, setKeyTenant(t, "key-a", ""))
	if _, err := applyUnchanged(t, f, 13, deleteTenant(t, "other")); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "[key-d]") {
		t.Fatalf("delete of other: %v, want ErrConflict naming key-d", err)
	}
	mustApply(t, f, 14, setKeyTenant(t, "key-d", ""))
	mustApply(t, f, 15, deleteTenant(t, "other"))
	if n := len(f.Tenants()); n != 0 {
		t.Fatalf("%d tenants left, want 0", n)
	}
}

// TestPutAPIKeyTenant: a key may name a tenant that exists; an unknown one
// is refused and nothing of the command is applied (not the key, not the
// keys-required switch its first key would turn on).
func TestPutAPIKeyTenant(t *testing.T) {
	f := New(Config{})
	applyAll(t, f, history(t)[:1])
	_, err := applyUnchanged(t, f, 10, putKeyIn(t, "a", "s1", "nope"))
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), `tenant "nope"`) {
		t.Fatalf("put with an unknown tenant: %v, want ErrNotFound naming it", err)
	}
	if _, ok := f.APIKey("a"); ok || f.Config().GetApiKeysRequired() {
		t.Fatal("a refused key was applied")
	}
	_, err = applyUnchanged(t, f, 11, putKeyIn(t, "a", "s1", "Bad Tenant"))
	wantInvalid(t, err, "tenant")

	mustApply(t, f, 12, putTenant(t, team("team"), true))
	res := mustApply(t, f, 13, putKeyIn(t, "a", "s1", "team"))
	if k, _ := f.APIKey("a"); k.GetTenant() != "team" || !proto.Equal(k, res.(*llmgwv1.ApiKey)) {
		t.Fatalf("key = %v, result %v; want tenant team", k, res)
	}
}

// TestSetAPIKeyTenant: a key moves to a tenant that exists or to its own
// (""), with its revision and a change; an unknown key or tenant is
// refused and changes nothing.
func TestSetAPIKeyTenant(t *testing.T) {
	f := New(Config{})
	mustApply(t, f, 1, putTenant(t, team("team"), true))
	mustApply(t, f, 2, putKey(t, "a", "s1", "demo"))

	if _, err := applyUnchanged(t, f, 3, setKeyTenant(t, "a", "nope")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("to an unknown tenant: %v, want ErrNotFound", err)
	}
	if _, err := applyUnchanged(t, f, 4, setKeyTenant(t, "nope", "team")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("an unknown key: %v, want ErrNotFound", err)
	}
	res := mustApply(t, f, 5, setKeyTenant(t, "a", "team"))
	k, _ := f.APIKey("a")
	want := &llmgwv1.ApiKey{Name: "a", SecretSha256: keyHash("s1"), Models: []string{"demo"}, CreatedUnix: 1700000000, Tenant: "team", Revision: 5}
	if !proto.Equal(k, want) || !proto.Equal(res.(*llmgwv1.ApiKey), want) {
		t.Fatalf("key = %v, result %v; want %v", k, res, want)
	}
	if ch, _ := f.ChangesSince(4); len(ch) != 1 || ch[0].Op != llmgwv1.ChangeOp_CHANGE_OP_PUT || !proto.Equal(ch[0].GetApiKey(), want) {
		t.Fatalf("changes = %v, want the key's put", ch)
	}
	mustApply(t, f, 6, setKeyTenant(t, "a", ""))
	if k, _ := f.APIKey("a"); k.GetTenant() != "" || k.GetRevision() != 6 || EffectiveTenant(k) != "a" {
		t.Fatalf("key = %v, want its own tenant at revision 6", k)
	}
}

func TestEffectiveTenant(t *testing.T) {
	tests := []struct {
		key  *llmgwv1.ApiKey
		want string
	}{
		{nil, ""},
		{&llmgwv1.ApiKey{Name: "a"}, "a"},
		{&llmgwv1.ApiKey{Name: "a", Tenant: "team"}, "team"},
	}
	for _, tt := range tests {
		if got := EffectiveTenant(tt.key); got != tt.want {
			t.Errorf("EffectiveTenant(%v) = %q, want %q", tt.key, got, tt.want)
		}
	}
}

// counts is a row's counts for comparison: requests, input, output.
func counts(rows []*llmgwv1.UsageRow) map[usageKey][3]uint64 {
	m := map[usageKey][3]uint64{}
	for _, r := range rows {
		m[usageKey{r.Tenant, r.Model, r.HourUnix}] = [3]uint64{r.Counts.GetRequests(), r.Counts.GetInputTokens(), r.Counts.GetOutputTokens()}
	}
	return m
}

// TestRecordUsage: a batch adds its rows (rows of one key within it add
// up); the same (router, session, seq) sent again, or a lower seq, adds
// nothing and changes nothing; another session or router adds.
func TestRecordUsage(t *testing.T) {
	f := New(Config{})
	k := func(tenant, model string, n int64) usageKey { return usageKey{tenant, model, hourN(n)} }
	steps := []struct {
		name    string
		cmd     []byte
		applied bool
		want    map[usageKey][3]uint64
	}{
		{"first batch", usageBatch(t, "r1", 1, 1, urow("a", "demo", hourN(0), 10, 1), urow("a", "demo", hourN(0), 5, 2), urow("", "", hourN(1), 3, 0)), true,
			map[usageKey][3]uint64{k("a", "demo", 0): {2, 15, 3}, k("", "", 1): {1, 3, 0}}},
		{"sent again", usageBatch(t, "r1", 1, 1, urow("a", "demo", hourN(0), 10, 1), urow("a", "demo", hourN(0), 5, 2), urow("", "", hourN(1), 3, 0)), false,
			map[usageKey][3]uint64{k("a", "demo", 0): {2, 15, 3}, k("", "", 1): {1, 3, 0}}},
		{"next seq", usageBatch(t, "r1", 1, 3, urow("a", "demo", hourN(1), 1, 1)), true,
			map[usageKey][3]uint64{k("a", "demo", 0): {2, 15, 3}, k("a", "demo", 1): {1, 1, 1}, k("", "", 1): {1, 3, 0}}},
		{"lower seq", usageBatch(t, "r1", 1, 2, urow("a", "demo", hourN(1), 100, 100)), false,
			map[usageKey][3]uint64{k("a", "demo", 0): {2, 15, 3}, k("a", "demo", 1): {1, 1, 1}, k("", "", 1): {1, 3, 0}}},
		{"another session of the router", usageBatch(t, "r1", 2, 1, urow("a", "demo", hourN(1), 1, 1)), true,
			map[usageKey][3]uint64{k("a", "demo", 0): {2, 15, 3}, k("a", "demo", 1): {2, 2, 2}, k("", "", 1): {1, 3, 0}}},
		{"another router", usageBatch(t, "r2", 1, 3, urow("b", "chat", hourN(1), 7, 0)), true,
			map[usageKey][3]uint64{k("a", "demo", 0): {2, 15, 3}, k("a", "demo", 1): {2, 2, 2}, k("", "", 1): {1, 3, 0}, k("b", "chat", 1): {1, 7, 0}}},
		{"an empty batch moves the cursor", usageBatch(t, "r2", 1, 4), true,
			map[usageKey][3]uint64{k("a", "demo", 0): {2, 15, 3}, k("a", "demo", 1): {2, 2, 2}, k("", "", 1): {1, 3, 0}, k("b", "chat", 1): {1, 7, 0}}},
		{"after the empty batch", usageBatch(t, "r2", 1, 4, urow("b", "chat", hourN(1), 7, 0)), false,
			map[usageKey][3]uint64{k("a", "demo", 0): {2, 15, 3}, k("a", "demo", 1): {2, 2, 2}, k("", "", 1): {1, 3, 0}, k("b", "chat", 1): {1, 7, 0}}},
	}
	for i, s := range steps {
		index := uint64(10 + i)
		var res any
		var err error
		if s.applied {
			res, err = f.Apply(index, s.cmd)
		} else {
			res, err = applyUnchanged(t, f, index, s.cmd)
		}
		if err != nil || res != s.applied {
			t.Fatalf("%s: result %v, %v; want %v", s.name, res, err, s.applied)
		}
		if got := counts(f.Usage("", "", 0)); !maps.Equal(got, s.want) {
			t.Fatalf("%s: rows %v, want %v", s.name, got, s.want)
		}
	}
	want := []*llmgwv1.UsageCursor{
		{Router: "r1", Session: 1, Seq: 3, HourUnix: hourN(1)},
		{Router: "r1", Session: 2, Seq: 1, HourUnix: hourN(1)},
		{Router: "r2", Session: 1, Seq: 4, HourUnix: hourN(1)},
	}
	if got := f.State().UsageCursors; !slices.EqualFunc(got, want, func(a, b *llmgwv1.UsageCursor) bool { return proto.Equal(a, b) }) {
		t.Fatalf("cursors = %v, want %v", got, want)
	}
}

// TestUsageSaturates: counts stop at the largest uint64 rather than wrap,
// in a row and in a period's sum.
func TestUsageSaturates(t *testing.T) {
	const top = math.MaxUint64
	into := &llmgwv1.UsageCounts{Requests: top - 1, Refused: top, ShadowRefused: 1, InputTokens: top - 5, CachedTokens: 3, OutputTokens: top}
	AddUsage(into, &llmgwv1.UsageCounts{Requests: 2, Refused: 1, ShadowRefused: 2, InputTokens: 5, CachedTokens: top, OutputTokens: top})
	want := &llmgwv1.UsageCounts{Requests: top, Refused: top, ShadowRefused: 3, InputTokens: top, CachedTokens: top, OutputTokens: top}
	if !proto.Equal(into, want) {
		t.Fatalf("AddUsage = %v, want %v", into, want)
	}
	AddUsage(into, nil)
	if !proto.Equal(into, want) {
		t.Fatalf("AddUsage of nil changed %v", into)
	}

	f := New(Config{})
	mustApply(t, f, 1, usageBatch(t, "r1", 1, 1, urow("a", "demo", hourN(0), top-1, 0)))
	mustApply(t, f, 2, usageBatch(t, "r1", 1, 2, urow("a", "demo", hourN(0), 10, 0), urow("a", "chat", hourN(0), 0, top-1)))
	if rows := f.Usage("a", "demo", 0); len(rows) != 1 || rows[0].Counts.InputTokens != top || rows[0].Counts.Requests != 2 {
		t.Fatalf("rows = %v, want input tokens saturated", rows)
	}
	if n := f.UsageTokens("a", "", hourN(0)); n != top {
		t.Fatalf("UsageTokens = %d, want saturated", n)
	}
}

// TestValidateUsageBatch: a batch names its router, a seq above 0, a
// bounded number of rows, each of a name-shaped tenant and model (or "")
// on an hour boundary. Apply refuses a malformed batch and changes
// nothing, its cursor included.
func TestValidateUsageBatch(t *testing.T) {
	ok := func() *llmgwv1.RecordUsageCommand {
		return &llmgwv1.RecordUsageCommand{Router: "router-1", Session: 7, Seq: 1, Rows: []*llmgwv1.UsageRow{urow("a", "demo", hourN(0), 1, 1), urow("", "", hourN(1), 1, 1)}}
	}
	with := func(edit func(*llmgwv1.RecordUsageCommand)) *llmgwv1.RecordUsageCommand {
		p := ok()
		edit(p)
		return p
	}
	rows := func(n int) []*llmgwv1.UsageRow {
		out := make([]*llmgwv1.UsageRow, n)
		for i := range out {
			out[i] = urow("a", "demo", hourN(int64(i)), 1, 1)
		}
		return out
	}
	tests := []struct {
		name    string
		batch   *llmgwv1.RecordUsageCommand
		invalid string
	}{
		{"valid", ok(), ""},
		{"no rows", with(func(p *llmgwv1.RecordUsageCommand) { p.Rows = nil }), ""},
		{"session 0", with(func(p *llmgwv1.RecordUsageCommand) { p.Session = 0 }), ""},
		{"most rows", with(func(p *llmgwv1.RecordUsageCommand) { p.Rows = rows(MaxUsageRows) }), ""},
		{"router missing", with(func(p *llmgwv1.RecordUsageCommand) { p.Router = "" }), "router"},
		{"router too long", with(func(p *llmgwv1.RecordUsageCommand) { p.Router = strings.Repeat("r", MaxNameLen+1) }), "router"},
		{"seq 0", with(func(p *llmgwv1.RecordUsageCommand) { p.Seq = 0 }), "seq"},
		{"too many rows", with(func(p *llmgwv1.RecordUsageCommand) { p.Rows = rows(MaxUsageRows + 1) }), "rows"},
		{"hour not on the hour", with(func(p *llmgwv1.RecordUsageCommand) { p.Rows[1].HourUnix += 60 }), "rows[1].hour_unix"},
		{"hour 0", with(func(p *llmgwv1.RecordUsageCommand) { p.Rows[0].HourUnix = 0 }), "rows[0].hour_unix"},
		{"hour before 1970", with(func(p *llmgwv1.RecordUsageCommand) { p.Rows[0].HourUnix = -3600 }), "rows[0].hour_unix"},
		{"bad tenant", with(func(p *llmgwv1.RecordUsageCommand) { p.Rows[1].Tenant = "Team A" }), "rows[1].tenant"},
		{"bad model", with(func(p *llmgwv1.RecordUsageCommand) { p.Rows[0].Model = "a model" }), "rows[0].model"},
		{"tenant too long", with(func(p *llmgwv1.RecordUsageCommand) { p.Rows[0].Tenant = strings.Repeat("t", MaxNameLen+1) }), "rows[0].tenant"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidateUsageBatch(tt.batch)
			if tt.invalid == "" {
				if err != nil {
					t.Fatalf("ValidateUsageBatch: %v", err)
				}
				return
			}
			wantInvalid(t, err, tt.invalid)
			f := New(Config{})
			mustApply(t, f, 1, usageBatch(t, "router-1", 7, 1, urow("a", "demo", hourN(0), 1, 1)))
			bad := proto.Clone(tt.batch).(*llmgwv1.RecordUsageCommand)
			if bad.Seq != 0 {
				bad.Seq = 2
			}
			_, err = applyUnchanged(t, f, 2, mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_RECORD_USAGE, bad))
			wantInvalid(t, err, tt.invalid)
			// The refused batch left the cursor where it was: seq 2 still applies.
			if res := mustApply(t, f, 3, usageBatch(t, "router-1", 7, 2)); res != true {
				t.Fatalf("seq 2 after a refused seq 2: %v, want applied", res)
			}
		})
	}
}

// TestUsageRetention: rows more than UsageRetentionHours behind the newest
// hour any batch carried, and the cursors of sessions silent 48 hours, are
// dropped as newer batches arrive.
func TestUsageRetention(t *testing.T) {
	f := New(Config{})
	index := uint64(0)
	apply := func(router string, seq uint64, hour int64) {
		t.Helper()
		index++
		mustApply(t, f, index, usageBatch(t, router, 1, seq, urow("a", "demo", hour, 1, 1)))
	}
	hours := func() []int64 {
		var out []int64
		for _, r := range f.Usage("", "", 0) {
			out = append(out, r.HourUnix)
		}
		return out
	}
	routers := func() []string {
		var out []string
		for _, c := range f.State().UsageCursors {
			out = append(out, c.Router)
		}
		return out
	}
	apply("r1", 1, hourN(0))
	apply("r2", 1, hourN(48))
	if got := routers(); !slices.Equal(got, []string{"r1", "r2"}) {
		t.Fatalf("cursors %v after 48 h, want r1's kept", got)
	}
	apply("r2", 2, hourN(49))
	if got := routers(); !slices.Equal(got, []string{"r2"}) {
		t.Fatalf("cursors %v after 49 h, want r1's dropped", got)
	}
	// A batch of an older hour does not move the retention back.
	apply("r3", 1, hourN(1))
	apply("r2", 3, hourN(UsageRetentionHours))
	if got := hours(); !slices.Equal(got, []int64{hourN(0), hourN(1), hourN(48), hourN(49), hourN(UsageRetentionHours)}) {
		t.Fatalf("hours %v at the retention, want every one kept", got)
	}
	if got := routers(); !slices.Equal(got, []string{"r2"}) {
		t.Fatalf("cursors %v, want r3's (hour 1) dropped", got)
	}
	apply("r2", 4, hourN(UsageRetentionHours+1))
	if got := hours(); !slices.Equal(got, []int64{hourN(1), hourN(48), hourN(49), hourN(UsageRetentionHours), hourN(UsageRetentionHours + 1)}) {
		t.Fatalf("hours %v past the retention, want hour 0 dropped", got)
	}
	apply("r2", 5, hourN(UsageRetentionHours+100))
	if got := hours(); !slices.Equal(got, []int64{hourN(UsageRetentionHours), hourN(UsageRetentionHours + 1), hourN(UsageRetentionHours + 100)}) {
		t.Fatalf("hours %v, want those within the retention", got)
	}
}

// TestUsageTokensAndFilter: UsageTokens sums a tenant's input + output
// tokens from an hour on, one model's or every one's; Usage lists rows of
// a tenant, a model, from the hour holding since, sorted.
func TestUsageTokensAndFilter(t *testing.T) {
	f := New(Config{})
	mustApply(t, f, 1, usageBatch(t, "r1", 1, 1,
		urow("b", "demo", hourN(1), 1000, 1000),
		urow("a", "demo", hourN(2), 1, 2),
		urow("a", "chat", hourN(0), 10, 20),
		urow("a", "demo", hourN(0), 100, 200),
		urow("a", "chat", hourN(2), 1000, 2000),
		&llmgwv1.UsageRow{Tenant: "a", Model: "demo", HourUnix: hourN(1), Counts: &llmgwv1.UsageCounts{InputTokens: 5, CachedTokens: 5, Requests: 1}},
	))
	tokens := []struct {
		tenant, model string
		from          int64
		want          uint64
	}{
		{"a", "", hourN(0), 3338},
		{"a", "", hourN(1), 3008},
		{"a", "demo", hourN(0), 308},
		{"a", "demo", hourN(2), 3},
		{"a", "", hourN(3), 0},
		{"b", "", hourN(0), 2000},
		{"c", "", hourN(0), 0},
		{"a", "nope", hourN(0), 0},
	}
	for _, tt := range tokens {
		if got := f.UsageTokens(tt.tenant, tt.model, tt.from); got != tt.want {
			t.Errorf("UsageTokens(%q, %q, hour %d) = %d, want %d", tt.tenant, tt.model, (tt.from-hour0)/3600, got, tt.want)
		}
	}
	type id struct {
		tenant, model string
		hour          int64
	}
	ids := func(rows []*llmgwv1.UsageRow) []id {
		var out []id
		for _, r := range rows {
			out = append(out, id{r.Tenant, r.Model, (r.HourUnix - hour0) / 3600})
		}
		return out
	}
	usage := []struct {
		tenant, model string
		since         int64
		want          []id
	}{
		{"", "", 0, []id{{"a", "chat", 0}, {"a", "chat", 2}, {"a", "demo", 0}, {"a", "demo", 1}, {"a", "demo", 2}, {"b", "demo", 1}}},
		{"a", "", 0, []id{{"a", "chat", 0}, {"a", "chat", 2}, {"a", "demo", 0}, {"a", "demo", 1}, {"a", "demo", 2}}},
		{"", "demo", 0, []id{{"a", "demo", 0}, {"a", "demo", 1}, {"a", "demo", 2}, {"b", "demo", 1}}},
		{"a", "demo", hourN(1) + 1799, []id{{"a", "demo", 1}, {"a", "demo", 2}}},
		{"", "", hourN(2), []id{{"a", "chat", 2}, {"a", "demo", 2}}},
		{"", "", hourN(3), nil},
		{"c", "", 0, nil},
	}
	for _, tt := range usage {
		if got := ids(f.Usage(tt.tenant, tt.model, tt.since)); !slices.Equal(got, tt.want) {
			t.Errorf("Usage(%q, %q, %d) = %v, want %v", tt.tenant, tt.model, tt.since, got, tt.want)
		}
	}
	// The rows are copies.
	f.Usage("a", "demo", 0)[0].Counts.InputTokens = 0
	if got := f.UsageTokens("a", "demo", hourN(0)); got != 308 {
		t.Fatalf("changing a returned row changed the roll-up: %d", got)
	}
}

// tenantHistory is history plus tenants, keys in them and usage batches
// from four router sessions, applied by applyAll at 2, 4, ... The last
// batch is of an hour older than the newest one by more than a cursor's
// 48 h: its cursor stays until a batch of a newer hour arrives.
func tenantHistory(t testing.TB) [][]byte {
	return append(history(t),
		putTenant(t, team("zeta"), true),
		putTenant(t, team("alpha"), true),
		putTenant(t, &llmgwv1.Tenant{Name: "zeta", Shadow: true, ModelLimits: []*llmgwv1.TenantModelLimits{{Model: "demo", Limits: &llmgwv1.TenantLimits{Rpm: 5}}},
			DefaultClass: "batch", MaxClass: "standard"}, false),
		putTenant(t, team("gone"), true),
		putKeyIn(t, "k1", "s1", "zeta"),
		putKeyIn(t, "k2", "s2", ""),
		setKeyTenant(t, "k2", "alpha"),
		deleteTenant(t, "gone"),
		usageBatch(t, "r2", 9, 1, urow("zeta", "demo", hourN(0), 1, 2), urow("alpha", "other", hourN(1), 3, 4), urow("", "", hourN(0), 5, 6)),
		usageBatch(t, "r1", 3, 1, urow("zeta", "demo", hourN(0), 1, 2), urow("k2", "demo", hourN(2), 3, 4)),
		usageBatch(t, "r1", 4, 1, urow("zeta", "other", hourN(1), 1, 2)),
		usageBatch(t, "r2", 9, 2, urow("zeta", "demo", hourN(2), 1, 2)),
		usageBatch(t, "r2", 9, 3, urow("zeta", "demo", hourN(100), 1, 2)),
		usageBatch(t, "r4", 1, 1, urow("alpha", "demo", hourN(1), 1, 2)),
	)
}

// TestTenantsSnapshot: two FSMs fed the same entries, tenants and usage
// included, give identical snapshots; a restore keeps tenants, rows and
// cursors, so a batch sent again after it is still dropped, and the next
// entries apply alike on the restored FSM and the original (the
// retention's reference, the newest hour, came through the restore).
func TestTenantsSnapshot(t *testing.T) {
	cmds := tenantHistory(t)
	a, b := New(Config{}), New(Config{})
	applyAll(t, a, cmds)
	applyAll(t, b, cmds)
	sa, err := a.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if sb, _ := b.Snapshot(); !bytes.Equal(sa, sb) {
		t.Fatal("two FSMs fed the same commands gave different snapshots")
	}
	st := a.State()
	if len(st.Tenants) != 2 || st.Tenants[0].Name != "alpha" || st.Tenants[1].Name != "zeta" || !st.Tenants[1].Shadow ||
		st.Tenants[1].DefaultClass != "batch" || st.Tenants[1].MaxClass != "standard" {
		t.Fatalf("tenants = %v", st.Tenants)
	}
	if len(st.Usage) != 8 || len(st.UsageCursors) != 2 {
		t.Fatalf("%d rows and %d cursors (%v), want 8 and 2", len(st.Usage), len(st.UsageCursors), st.UsageCursors)
	}

	c := New(Config{})
	if err := c.Restore(sa); err != nil {
		t.Fatal(err)
	}
	if sc, _ := c.Snapshot(); !bytes.Equal(sa, sc) {
		t.Fatal("snapshot -> restore -> snapshot differs")
	}
	if !proto.Equal(c.State(), st) {
		t.Fatal("the restored state differs")
	}
	index := c.Revision() + 1
	resent := usageBatch(t, "r2", 9, 2, urow("zeta", "demo", hourN(2), 1, 2))
	if res, err := applyUnchanged(t, c, index, resent); err != nil || res != false {
		t.Fatalf("a batch sent again after the restore: %v, %v; want dropped", res, err)
	}
	if res, err := a.Apply(index, resent); err != nil || res != false {
		t.Fatalf("a batch sent again to the original: %v, %v; want dropped", res, err)
	}
	more := [][]byte{
		usageBatch(t, "r5", 1, 1, urow("alpha", "other", hourN(99), 1, 1)),
		usageBatch(t, "r1", 3, 2, urow("zeta", "demo", hourN(1), 1, 1)),
		usageBatch(t, "r3", 1, 1, urow("alpha", "demo", hourN(UsageRetentionHours+2), 1, 1)),
		deleteTenant(t, "zeta"),
		setKeyTenant(t, "k1", ""),
		deleteTenant(t, "zeta"),
	}
	for i, cmd := range more {
		index++
		_, ea := a.Apply(index, cmd)
		_, ec := c.Apply(index, cmd)
		if (ea == nil) != (ec == nil) {
			t.Fatalf("entry %d: original %v, restored %v", i, ea, ec)
		}
		sa, _ := a.Snapshot()
		if sc, _ := c.Snapshot(); !bytes.Equal(sa, sc) {
			t.Fatalf("after entry %d the original and the restored FSM diverged:\n%v\n%v", i, a.State(), c.State())
		}
	}
	st = c.State()
	if len(st.Tenants) != 1 || len(st.Usage) != 5 || len(st.UsageCursors) != 1 || st.UsageCursors[0].Router != "r3" {
		t.Fatalf("after the retention: tenants %v, rows %v, cursors %v; want alpha, 5 rows, r3's cursor", st.Tenants, st.Usage, st.UsageCursors)
	}
}

// TestTenantChanges: tenant creates, updates and deletes reach watchers
// (a PUT of the tenant, a DELETE keyed by name); usage batches log
// nothing: routers do not watch the roll-up.
func TestTenantChanges(t *testing.T) {
	f := New(Config{})
	applyAll(t, f, history(t)[:1])
	mustApply(t, f, 10, putTenant(t, team("a"), true))
	mustApply(t, f, 11, usageBatch(t, "r1", 1, 1, urow("a", "demo", hourN(0), 1, 1)))
	mustApply(t, f, 12, putTenant(t, &llmgwv1.Tenant{Name: "a", Shadow: true}, false))
	mustApply(t, f, 13, usageBatch(t, "r1", 1, 2, urow("a", "demo", hourN(5), 1, 1)))
	mustApply(t, f, 14, deleteTenant(t, "a"))
	got, ok := f.ChangesSince(2)
	if !ok || len(got) != 3 {
		t.Fatalf("ChangesSince(2) = %v, %v; want a put, a put and a delete", got, ok)
	}
	if c := got[0]; c.Revision != 10 || c.Op != llmgwv1.ChangeOp_CHANGE_OP_PUT || c.GetTenant().GetRevision() != 10 || c.GetTenant().GetLimits().GetRpm() != 100 {
		t.Errorf("create change = %v", c)
	}
	if c := got[1]; c.Revision != 12 || c.Op != llmgwv1.ChangeOp_CHANGE_OP_PUT || !c.GetTenant().GetShadow() || c.GetTenant().GetRevision() != 12 {
		t.Errorf("update change = %v", c)
	}
	if c := got[2]; c.Revision != 14 || c.Op != llmgwv1.ChangeOp_CHANGE_OP_DELETE || !proto.Equal(c.GetTenant(), &llmgwv1.Tenant{Name: "a"}) {
		t.Errorf("delete change = %v", c)
	}
	if _, ok := got[0].Object.(*llmgwv1.Change_Tenant); !ok {
		t.Errorf("change object %T, want Change_Tenant", got[0].Object)
	}
}

// TestTenantCommandsGated: the four commands are behind the gate,
// introduced with TenantsVersion.
func TestTenantCommandsGated(t *testing.T) {
	if TenantsVersion == "" {
		t.Fatal("TenantsVersion is empty in the new build")
	}
	for _, typ := range []llmgwv1.CommandType{llmgwv1.CommandType_COMMAND_TYPE_PUT_TENANT, llmgwv1.CommandType_COMMAND_TYPE_DELETE_TENANT,
		llmgwv1.CommandType_COMMAND_TYPE_SET_API_KEY_TENANT, llmgwv1.CommandType_COMMAND_TYPE_RECORD_USAGE} {
		if !Known(typ) || Introduced(typ) != TenantsVersion || CommandVersion(typ) != 1 {
			t.Errorf("%s: known %v, introduced %q, version %d; want known, introduced %q, version 1", typ, Known(typ), Introduced(typ), CommandVersion(typ), TenantsVersion)
		}
		if Admitted(typ, "") || Admitted(typ, "v0.1.0") || !Admitted(typ, TenantsVersion) {
			t.Errorf("%s: admitted below its release or not at it", typ)
		}
	}
}

// TestRecordUsageFutureHour: a row ahead of the entry's own time by more
// than an hour (a router with a bad clock) is refused, so it cannot
// prune the roll-up; within the hour it is applied.
func TestRecordUsageFutureHour(t *testing.T) {
	f := New(Config{})
	mustApply(t, f, 1, usageBatch(t, "r1", 1, 1, urow("a", "m", hourN(0), 10, 5)))
	if _, err := f.ApplyAt(2, hourN(0)+60, usageBatch(t, "r1", 1, 2, urow("a", "m", hourN(1000), 1, 1))); err == nil {
		t.Fatal("a row 1000 hours ahead of the entry's time was applied")
	} else {
		wantInvalid(t, err, "rows[0].hour_unix")
	}
	if rows := f.Usage("", "", 0); len(rows) != 1 || rows[0].HourUnix != hourN(0) {
		t.Fatalf("roll-up after the refused batch: %v", rows)
	}
	if _, err := f.ApplyAt(3, hourN(0)+60, usageBatch(t, "r1", 1, 2, urow("a", "m", hourN(1), 1, 1))); err != nil {
		t.Fatalf("a row of the next hour was refused: %v", err)
	}
}
