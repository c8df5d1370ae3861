// Command importcheck enforces the dependency rules of design §3: which
// packages each of the repository's packages may import, between components
// (router never imports agent) and inside them (router/scheduler imports
// nothing networked, internal/... imports nothing of the repository). The
// table is rules in rules.go. It reads `go list` rather than memory, so a
// rule broken by a new import fails `make check`.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
)

func main() {
	pkgs, err := list()
	if err != nil {
		fmt.Fprintln(os.Stderr, "importcheck:", err)
		os.Exit(2)
	}
	problems := unused(rules, pkgs)
	for _, p := range pkgs {
		problems = append(problems, check(rules, p)...)
	}
	if len(problems) > 0 {
		fmt.Fprintln(os.Stderr, "import rules of design §3 broken (scripts/importcheck/rules.go):")
		for _, v := range problems {
			fmt.Fprintln(os.Stderr, "  "+v)
		}
		os.Exit(1)
	}
}

// list is every package of the module, as `go list -json ./...` sees it.
func list() ([]pkg, error) {
	cmd := exec.Command("go", "list", "-json", "./...")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	var pkgs []pkg
	dec := json.NewDecoder(out)
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			_ = cmd.Wait()
			return nil, fmt.Errorf("decode go list: %w", err)
		}
		pkgs = append(pkgs, p)
	}
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("go list: %w", err)
	}
	return pkgs, nil
}

// unused returns one line per rule of table that covers none of pkgs: a
// misspelt or stale Prefix would otherwise be a rule that can never fail.
func unused(table []rule, pkgs []pkg) []string {
	var bad []string
	for _, r := range table {
		hit := false
		for _, p := range pkgs {
			if from, ok := rel(p.ImportPath); ok && r.covers(from) {
				hit = true
				break
			}
		}
		if !hit {
			bad = append(bad, fmt.Sprintf("rule %q covers no package of the module: misspelt, or its packages moved", r.Prefix))
		}
	}
	return bad
}
