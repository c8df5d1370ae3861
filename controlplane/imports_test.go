package controlplane

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestLayoutRules checks design §3 for controlplane and its subpackages: in
// this repository they import only proto, fsm, the stdlib-only helpers of
// internal and each other — never agent or router, which they meet only
// through proto.
func TestLayoutRules(t *testing.T) {
	const mod = "github.com/llmgw/llmgw/"
	allowed := []string{mod + "proto/", mod + "fsm", mod + "internal/", mod + "controlplane"}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
			return err
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if !strings.HasPrefix(p, mod) {
				continue
			}
			ok := false
			for _, a := range allowed {
				ok = ok || strings.HasPrefix(p, a)
			}
			if !ok {
				t.Errorf("%s imports %s: controlplane may import only proto, fsm and internal (design §3)", path, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// layers says which controlplane packages each controlplane package may
// import (its tests included): the split by job of the package doc. The
// root, which wires one node, may import them all; nothing imports the
// root. The services see the rest only through the interfaces they
// declare, and import other packages for their error values and names
// alone (package service maps errors to codes in one place).
var layers = map[string][]string{
	"logadapt":        {},
	"snapfile":        {},
	"ephemeral":       {},
	"placement":       {},
	"sessions":        {},
	"gate":            {},
	"plane":           {"ephemeral"},
	"store":           {"logadapt"},
	"gossip":          {"logadapt", "plane"},
	"cluster":         {"gossip", "logadapt"},
	"leader":          {"placement"},
	"service":         {"cluster", "gate", "leader", "store"},
	"service/admin":   {"service", "cluster", "snapfile"},
	"service/agent":   {"service", "ephemeral"},
	"service/watch":   {"service", "ephemeral"},
	"service/adapter": {"service"},
	"service/server":  {"service"},
}

// TestPackageLayers checks layers: a new import between the control
// plane's packages is a decision, made here, not by accident.
func TestPackageLayers(t *testing.T) {
	const root = "github.com/llmgw/llmgw/controlplane"
	seen := map[string]bool{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
			return err
		}
		pkg := filepath.ToSlash(filepath.Dir(path))
		if pkg == "." {
			return nil // the root wires everything
		}
		rules, ok := layers[pkg]
		if !ok {
			t.Errorf("%s: package %s has no entry in layers; say what it may import", path, pkg)
			return nil
		}
		seen[pkg] = true
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			rest, ok := strings.CutPrefix(p, root)
			if !ok || (rest != "" && rest[0] != '/') {
				continue
			}
			to := strings.TrimPrefix(rest, "/")
			if to == "" {
				t.Errorf("%s imports the root controlplane package: only cmd wires a node", path)
				continue
			}
			if to != pkg && !slices.Contains(rules, to) {
				t.Errorf("%s imports controlplane/%s; controlplane/%s may import only %v (imports_test.go layers)", path, to, pkg, rules)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for pkg := range layers {
		if !seen[pkg] {
			t.Errorf("layers names %s, which has no Go files", pkg)
		}
	}
}
