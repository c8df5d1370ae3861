//go:build !llmgw_upgrade_old

package admin

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestAliases: an alias is applied (created, then replaced whole), listed
// and deleted; bad input — a bad shape, an unknown target, a name a model
// holds — is refused naming the field with nothing proposed; an unknown
// alias's delete is NOT_FOUND, also without a proposal.
func TestAliases(t *testing.T) {
	a, f, p := tenantService(t)
	ctx := context.Background()
	for _, m := range []string{"a", "b"} {
		if _, err := a.ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: &llmgwv1.Model{Name: m, Engine: "sim", Model: "org/" + m, Replicas: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	prod := &llmgwv1.Alias{Name: "prod", Targets: []*llmgwv1.AliasTarget{{Target: "a", Weight: 90}, {Target: "b", Weight: 10}},
		Sticky: "key", Fallbacks: []string{"b"}, Revision: 77} // a caller's revision is ignored
	resp, err := a.ApplyAlias(ctx, &llmgwv1.ApplyAliasRequest{Alias: prod})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Revision != f.Revision() || resp.Alias.GetRevision() != resp.Revision || resp.Alias.GetSticky() != "key" {
		t.Fatalf("apply = %v at revision %d", resp, f.Revision())
	}
	cut := &llmgwv1.Alias{Name: "prod", Targets: []*llmgwv1.AliasTarget{{Target: "b", Weight: 1}}}
	if _, err := a.ApplyAlias(ctx, &llmgwv1.ApplyAliasRequest{Alias: cut}); err != nil {
		t.Fatal(err)
	}
	list, err := a.ListAliases(ctx, &llmgwv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := proto.Clone(cut).(*llmgwv1.Alias)
	want.Revision = f.Revision()
	if len(list.Aliases) != 1 || !proto.Equal(list.Aliases[0], want) || list.Revision != f.Revision() {
		t.Fatalf("list = %v, want only %v (replaced whole)", list, want)
	}

	before := p.proposals
	for _, tc := range []struct {
		name  string
		alias *llmgwv1.Alias
		want  string
	}{
		{"none", nil, "alias: required"},
		{"a bad weight", &llmgwv1.Alias{Name: "x", Targets: []*llmgwv1.AliasTarget{{Target: "a", Weight: fsm.MaxAliasWeight + 1}}}, "targets[0].weight"},
		{"an unknown target", &llmgwv1.Alias{Name: "x", Targets: []*llmgwv1.AliasTarget{{Target: "nope", Weight: 1}}}, "targets[0].target"},
		{"an unknown fallback", &llmgwv1.Alias{Name: "x", Targets: []*llmgwv1.AliasTarget{{Target: "a", Weight: 1}}, Fallbacks: []string{"nope"}}, "fallbacks[0]"},
		{"a model's name", &llmgwv1.Alias{Name: "a", Targets: []*llmgwv1.AliasTarget{{Target: "b", Weight: 1}}}, "name: \"a\" is a model"},
		{"a bad sticky mode", &llmgwv1.Alias{Name: "x", Targets: []*llmgwv1.AliasTarget{{Target: "a", Weight: 1}}, Sticky: "ip"}, "sticky"},
	} {
		_, err := a.ApplyAlias(ctx, &llmgwv1.ApplyAliasRequest{Alias: tc.alias})
		wantCode(t, tc.name, err, codes.InvalidArgument, tc.want)
	}
	_, err = a.DeleteAlias(ctx, &llmgwv1.DeleteAliasRequest{Name: "nope"})
	wantCode(t, "delete of an unknown alias", err, codes.NotFound, "nope")
	_, err = a.DeleteAlias(ctx, &llmgwv1.DeleteAliasRequest{})
	wantCode(t, "delete without a name", err, codes.InvalidArgument, "name")
	if p.proposals != before {
		t.Fatalf("%d commands proposed for refused input", p.proposals-before)
	}
	// A model named like the alias is refused by the FSM, naming the field.
	_, err = a.ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: &llmgwv1.Model{Name: "prod", Engine: "sim", Model: "org/p", Replicas: 1}})
	wantCode(t, "a model named like an alias", err, codes.InvalidArgument, "name: \"prod\" is an alias")

	if _, err := a.DeleteAlias(ctx, &llmgwv1.DeleteAliasRequest{Name: "prod"}); err != nil {
		t.Fatal(err)
	}
	if list, _ := a.ListAliases(ctx, &llmgwv1.ListRequest{}); len(list.Aliases) != 0 {
		t.Fatalf("after delete: %v", list.Aliases)
	}
}
