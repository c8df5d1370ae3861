//go:build !llmgw_upgrade_old

package fsm

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func putAlias(t testing.TB, a *llmgwv1.Alias) []byte {
	return mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_PUT_ALIAS, &llmgwv1.PutAliasCommand{Alias: a})
}

func deleteAlias(t testing.TB, name string) []byte {
	return mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_DELETE_ALIAS, &llmgwv1.DeleteAliasCommand{Name: name})
}

// split is an alias over targets name=weight, in order.
func split(name string, targets ...any) *llmgwv1.Alias {
	a := &llmgwv1.Alias{Name: name}
	for i := 0; i < len(targets); i += 2 {
		a.Targets = append(a.Targets, &llmgwv1.AliasTarget{Target: targets[i].(string), Weight: uint32(targets[i+1].(int))})
	}
	return a
}

// TestValidateAlias: the shape of an alias, each refusal naming the field
// as the alias file spells it.
func TestValidateAlias(t *testing.T) {
	many := func(n int) *llmgwv1.Alias {
		a := &llmgwv1.Alias{Name: "prod"}
		for i := range n {
			a.Targets = append(a.Targets, &llmgwv1.AliasTarget{Target: fmt.Sprintf("m%d", i), Weight: 1})
		}
		return a
	}
	withFallbacks := func(a *llmgwv1.Alias, f ...string) *llmgwv1.Alias { a.Fallbacks = f; return a }
	withSticky := func(a *llmgwv1.Alias, s string) *llmgwv1.Alias { a.Sticky = s; return a }
	tests := []struct {
		name  string
		alias *llmgwv1.Alias
		field string // "": valid
	}{
		{"a split", split("prod", "a", 90, "b", 10), ""},
		{"one target", split("prod", "a", 1), ""},
		{"a drained target", split("prod", "a", 0, "b", 5), ""},
		{"sticky by key", withSticky(split("prod", "a", 1), "key"), ""},
		{"sticky by session, with fallbacks", withFallbacks(withSticky(split("prod", "a", 1, "b", 1), "session"), "b", "c"), ""},
		{"the most targets", many(MaxAliasTargets), ""},
		{"nil", nil, "alias"},
		{"no name", split("", "a", 1), "name"},
		{"a bad name", split("Prod!", "a", 1), "name"},
		{"no targets", &llmgwv1.Alias{Name: "prod"}, "targets"},
		{"too many targets", many(MaxAliasTargets + 1), "targets"},
		{"a bad target", split("prod", "a", 1, "B_", 1), "targets[1].target"},
		{"a target twice", split("prod", "a", 1, "a", 2), "targets[1].target"},
		{"itself", split("prod", "prod", 1), "targets[0].target"},
		{"a weight too large", split("prod", "a", MaxAliasWeight+1), "targets[0].weight"},
		{"every weight 0", split("prod", "a", 0, "b", 0), "targets"},
		{"an unknown sticky mode", withSticky(split("prod", "a", 1), "user"), "sticky"},
		{"a bad fallback", withFallbacks(split("prod", "a", 1), "ok", ""), "fallbacks[1]"},
		{"a fallback twice", withFallbacks(split("prod", "a", 1), "b", "b"), "fallbacks[1]"},
		{"a fallback to itself", withFallbacks(split("prod", "a", 1), "prod"), "fallbacks[0]"},
		{"too many fallbacks", withFallbacks(split("prod", "a", 1), "f1", "f2", "f3", "f4", "f5", "f6", "f7", "f8", "f9"), "fallbacks"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidateAlias(tt.alias)
			if tt.field == "" {
				if err != nil {
					t.Fatalf("ValidateAlias = %v, want nil", err)
				}
				return
			}
			wantInvalid(t, err, tt.field)
		})
	}
}

// aliasFSM holds models a (adapter a-sql) and b.
func aliasFSM(t *testing.T) *FSM {
	t.Helper()
	f := New(Config{})
	mustApply(t, f, 1, upsert(t, &llmgwv1.Model{Name: "a", Engine: "vllm", Model: "org/a", Replicas: 1,
		Adapters: []*llmgwv1.Adapter{{Name: "a-sql", Path: "/lora/sql"}}}))
	mustApply(t, f, 2, upsert(t, &llmgwv1.Model{Name: "b", Engine: "vllm", Model: "org/b", Replicas: 1}))
	return f
}

// TestAliasCommands: an alias is created, replaced whole and deleted;
// each change is logged for watchers, keyed by the alias's name; its
// targets and fallbacks must be models or adapters when it is applied,
// and its name none of them. A refused command changes nothing but the
// revision.
func TestAliasCommands(t *testing.T) {
	f := aliasFSM(t)
	res := mustApply(t, f, 3, putAlias(t, split("prod", "a", 90, "b", 10)))
	if a, ok := res.(*llmgwv1.Alias); !ok || a.Revision != 3 || len(a.Targets) != 2 {
		t.Fatalf("put result %v, want the alias at revision 3", res)
	}
	changes, _ := f.ChangesSince(2)
	if len(changes) != 1 || changes[0].GetAlias().GetName() != "prod" || changes[0].Op != llmgwv1.ChangeOp_CHANGE_OP_PUT {
		t.Fatalf("changes %v, want one PUT of alias prod", changes)
	}

	// Replaced whole: a weight moved, an adapter target, stickiness and
	// a fallback added.
	next := split("prod", "a", 50, "a-sql", 50)
	next.Sticky, next.Fallbacks = "key", []string{"b"}
	mustApply(t, f, 4, putAlias(t, next))
	got, ok := f.Alias("prod")
	next.Revision = 4
	if !ok || !proto.Equal(got, next) {
		t.Fatalf("stored %v, want %v", got, next)
	}

	refusals := []struct {
		name  string
		cmd   []byte
		field string
		is    error
	}{
		{"an unknown target", putAlias(t, split("prod", "a", 1, "nope", 1)), "targets[1].target", nil},
		{"an unknown fallback", putAlias(t, &llmgwv1.Alias{Name: "prod", Targets: []*llmgwv1.AliasTarget{{Target: "a", Weight: 1}}, Fallbacks: []string{"nope"}}), "fallbacks[0]", nil},
		{"an alias named like a model", putAlias(t, split("b", "a", 1)), "name", nil},
		{"an alias named like an adapter", putAlias(t, split("a-sql", "a", 1)), "name", nil},
		{"an alias of an alias", putAlias(t, split("canary", "prod", 1)), "targets[0].target", nil},
		{"a bad shape", putAlias(t, split("prod", "a", 0)), "targets", nil},
		{"a model named like an alias", upsert(t, &llmgwv1.Model{Name: "prod", Engine: "vllm", Model: "org/p", Replicas: 1}), "name", nil},
		{"an adapter named like an alias", upsert(t, &llmgwv1.Model{Name: "b", Engine: "vllm", Model: "org/b", Replicas: 1,
			Adapters: []*llmgwv1.Adapter{{Name: "prod", Path: "/lora/p"}}}), "adapters[0].name", nil},
		{"deleting an unknown alias", deleteAlias(t, "nope"), "", ErrNotFound},
	}
	idx := uint64(5)
	for _, tt := range refusals {
		t.Run(tt.name, func(t *testing.T) {
			_, err := applyUnchanged(t, f, idx, tt.cmd)
			idx++
			if tt.is != nil {
				if !errors.Is(err, tt.is) {
					t.Fatalf("err = %v, want %v", err, tt.is)
				}
				return
			}
			wantInvalid(t, err, tt.field)
		})
	}

	// A target deleted later leaves the alias as it is: routers skip it.
	mustApply(t, f, 20, mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_DELETE_MODEL, &llmgwv1.DeleteModelCommand{Name: "b"}))
	if got, _ := f.Alias("prod"); !proto.Equal(got, next) {
		t.Fatalf("after its fallback's model was deleted the alias is %v, want %v unchanged", got, next)
	}
	mustApply(t, f, 21, deleteAlias(t, "prod"))
	if _, ok := f.Alias("prod"); ok || len(f.Aliases()) != 0 {
		t.Fatal("the alias outlived its delete")
	}
	changes, _ = f.ChangesSince(20)
	if len(changes) != 1 || changes[0].Op != llmgwv1.ChangeOp_CHANGE_OP_DELETE || changes[0].GetAlias().GetName() != "prod" {
		t.Fatalf("changes %v, want one DELETE of alias prod", changes)
	}
	// Its name is free for a model again.
	mustApply(t, f, 22, upsert(t, &llmgwv1.Model{Name: "prod", Engine: "vllm", Model: "org/p", Replicas: 1}))
}

// TestAliasSnapshot: aliases are in the state, sorted by name, and a
// restore brings them back byte for byte.
func TestAliasSnapshot(t *testing.T) {
	f := aliasFSM(t)
	mustApply(t, f, 3, putAlias(t, split("zeta", "b", 1)))
	mustApply(t, f, 4, putAlias(t, split("alpha", "a", 3, "b", 1)))
	st := f.State()
	if len(st.Aliases) != 2 || st.Aliases[0].Name != "alpha" || st.Aliases[1].Name != "zeta" {
		t.Fatalf("state aliases %v, want alpha, zeta", st.Aliases)
	}
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	g := New(Config{})
	if err := g.Restore(snap); err != nil {
		t.Fatal(err)
	}
	again, _ := g.Snapshot()
	if string(again) != string(snap) {
		t.Fatal("a restored FSM's snapshot differs")
	}
	if a, ok := g.Alias("alpha"); !ok || a.Targets[0].Weight != 3 {
		t.Fatalf("restored alpha %v", a)
	}
	// The restored FSM still keeps the namespace.
	if _, err := g.Apply(5, upsert(t, &llmgwv1.Model{Name: "zeta", Engine: "vllm", Model: "org/z", Replicas: 1})); err == nil ||
		!strings.Contains(err.Error(), "alias") {
		t.Fatalf("a model named like a restored alias: %v, want a refusal", err)
	}
}

// TestAliasGated: both commands are behind the minimum-version gate, at
// the release of tenants.
func TestAliasGated(t *testing.T) {
	for _, typ := range []llmgwv1.CommandType{llmgwv1.CommandType_COMMAND_TYPE_PUT_ALIAS, llmgwv1.CommandType_COMMAND_TYPE_DELETE_ALIAS} {
		if !Known(typ) || Introduced(typ) != TenantsVersion || Admitted(typ, "") || !Admitted(typ, TenantsVersion) {
			t.Errorf("%s: known %v, introduced %q, admitted at none %v, at %s %v", typ, Known(typ), Introduced(typ),
				Admitted(typ, ""), TenantsVersion, Admitted(typ, TenantsVersion))
		}
	}
}
