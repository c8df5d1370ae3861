//go:build !llmgw_upgrade_old

package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestParseAliasFile: a file decodes strictly into an alias (a weight
// left out is 1); bad files are refused naming the key or field.
func TestParseAliasFile(t *testing.T) {
	tests := []struct {
		name string
		file string
		want *llmgwv1.Alias
		err  string
	}{
		{name: "a split, sticky, with fallbacks",
			file: "name: chat\ntargets:\n  - {target: a, weight: 90}\n  - {target: b, weight: 10}\nsticky: session\nfallbacks: [c]\n",
			want: &llmgwv1.Alias{Name: "chat", Targets: []*llmgwv1.AliasTarget{{Target: "a", Weight: 90}, {Target: "b", Weight: 10}},
				Sticky: "session", Fallbacks: []string{"c"}}},
		{name: "one target, its weight left out", file: "name: chat\ntargets: [{target: a}]\n",
			want: &llmgwv1.Alias{Name: "chat", Targets: []*llmgwv1.AliasTarget{{Target: "a", Weight: 1}}}},
		{name: "an unknown key", file: "name: chat\ntargets: [{target: a, wieght: 2}]\n", err: "wieght"},
		{name: "a negative weight", file: "name: chat\ntargets: [{target: a, weight: -1}]\n", err: "targets[0].weight"},
		{name: "a fractional weight", file: "name: chat\ntargets: [{target: a, weight: 1.5}]\n", err: "weight"},
		{name: "every weight 0", file: "name: chat\ntargets: [{target: a, weight: 0}]\n", err: "targets: at least one target must have a weight above 0"},
		{name: "an unknown sticky mode", file: "name: chat\ntargets: [{target: a}]\nsticky: ip\n", err: "sticky"},
		{name: "no targets", file: "name: chat\n", err: "targets"},
		{name: "two documents", file: "name: a\ntargets: [{target: a}]\n---\nname: b\n", err: "more than one document"},
		{name: "empty", file: "", err: "empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseAliasFile(strings.NewReader(tt.file))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("parse = %v, %v; want an error naming %q", got, err, tt.err)
				}
				return
			}
			if err != nil || !proto.Equal(got, tt.want) {
				t.Fatalf("parse = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

// TestAliasCommands: apply from a file, list (table and json), apply
// again with a new weight, delete; the server's refusal of an unknown
// target names the field; a bad file is refused before any call.
func TestAliasCommands(t *testing.T) {
	addr, f, p := serveTenantAdmin(t)
	for _, m := range []string{"a", "b"} {
		if _, _, err := p.Propose(context.Background(), llmgwv1.CommandType_COMMAND_TYPE_UPSERT_MODEL,
			&llmgwv1.UpsertModelCommand{Model: &llmgwv1.Model{Name: m, Engine: "sim", Model: "org/" + m, Replicas: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "chat.yaml")
	writeTestFile(t, file, "name: chat\ntargets:\n  - {target: a, weight: 90}\n  - {target: b, weight: 10}\nsticky: key\nfallbacks: [b]\n")
	out, err := run(addr, "alias", "apply", "-f", file)
	if err != nil || !strings.Contains(out, "alias chat applied at revision 3") {
		t.Fatalf("apply: %v\n%s", err, out)
	}
	out, err = run(addr, "alias", "list")
	if err != nil || !strings.Contains(out, "chat") || !strings.Contains(out, "a=90 (90%),b=10 (10%)") || !strings.Contains(out, "key") {
		t.Fatalf("list: %v\n%s", err, out)
	}
	writeTestFile(t, file, "name: chat\ntargets:\n  - {target: a, weight: 1}\n  - {target: b, weight: 2}\n")
	if out, err := run(addr, "alias", "apply", "-f", file); err != nil {
		t.Fatalf("apply again: %v\n%s", err, out)
	}
	out, err = run(addr, "alias", "list", "-o", "json")
	var list []struct {
		Name    string `json:"name"`
		Targets []struct {
			Target string `json:"target"`
			Weight int    `json:"weight"`
		} `json:"targets"`
		Sticky    string   `json:"sticky"`
		Fallbacks []string `json:"fallbacks"`
		Revision  int      `json:"revision"`
	}
	if err != nil || json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 || list[0].Targets[1].Weight != 2 ||
		list[0].Sticky != "" || len(list[0].Fallbacks) != 0 || list[0].Revision != 4 {
		t.Fatalf("list -o json: %v\n%s", err, out)
	}

	before := p.proposals
	bad := filepath.Join(dir, "bad.yaml")
	writeTestFile(t, bad, "name: chat\ntargets: [{target: a, weight: -3}]\n")
	if out, err := run(addr, "alias", "apply", "-f", bad); err == nil || !strings.Contains(err.Error(), "targets[0].weight") {
		t.Fatalf("a bad file: %v\n%s", err, out)
	}
	if p.proposals != before {
		t.Fatal("a bad file reached the server")
	}
	writeTestFile(t, bad, "name: chat\ntargets: [{target: nope}]\n")
	if out, err := run(addr, "alias", "apply", "-f", bad); err == nil || !strings.Contains(err.Error(), "targets[0].target") ||
		!strings.Contains(err.Error(), "not a model or an adapter") {
		t.Fatalf("an unknown target: %v\n%s", err, out)
	}
	if out, err := run(addr, "alias", "delete", "nope"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("delete of an unknown alias: %v\n%s", err, out)
	}
	out, err = run(addr, "alias", "delete", "chat")
	if err != nil || !strings.Contains(out, "alias chat deleted at revision") || len(f.Aliases()) != 0 {
		t.Fatalf("delete: %v\n%s", err, out)
	}
}

func writeTestFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
