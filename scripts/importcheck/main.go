// Command importcheck enforces the dependency rules of plan §3: which of the
// repository's packages each package may import. It reads `go list` rather
// than memory, so a rule broken by a new import fails `make check`.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
)

const module = "github.com/llmgw/llmgw"

// allowed maps a top-level directory to the top-level directories it may
// import. A directory missing here may import anything (cmd, integration,
// scripts: wiring and tests across processes).
var allowed = map[string][]string{
	"proto":        {},
	"fsm":          {"proto"},
	"vllm":         {},
	"controlplane": {"proto", "fsm"},
	"agent":        {"proto", "vllm"},
	"router":       {"proto", "vllm"},
	"sim":          {"vllm"},
	"bench":        {"proto"},
}

type pkg struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

func main() {
	cmd := exec.Command("go", "list", "-json", "./...")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		fail(err)
	}
	if err := cmd.Start(); err != nil {
		fail(err)
	}
	var violations []string
	dec := json.NewDecoder(out)
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			fail(err)
		}
		violations = append(violations, check(p)...)
	}
	if err := cmd.Wait(); err != nil {
		fail(err)
	}
	if len(violations) > 0 {
		fmt.Fprintln(os.Stderr, "import rules of plan §3 broken:")
		for _, v := range violations {
			fmt.Fprintln(os.Stderr, "  "+v)
		}
		os.Exit(1)
	}
}

// check returns one line per forbidden in-repo import of p, its tests
// included: a test that wires the router to the agent is a layering leak too.
func check(p pkg) []string {
	from := top(p.ImportPath)
	rules, ok := allowed[from]
	if !ok {
		return nil
	}
	var bad []string
	seen := map[string]bool{}
	for _, imp := range concat(p.Imports, p.TestImports, p.XTestImports) {
		to := top(imp)
		if to == "" || to == from || seen[imp] {
			continue
		}
		seen[imp] = true
		if !contains(rules, to) {
			bad = append(bad, fmt.Sprintf("%s imports %s (%s may import only %v)", p.ImportPath, imp, from, rules))
		}
	}
	return bad
}

// top is the repository's top-level directory of an import path, or "" for
// an import from outside the module (and for the module root).
func top(path string) string {
	rest, ok := strings.CutPrefix(path, module+"/")
	if !ok {
		return ""
	}
	first, _, _ := strings.Cut(rest, "/")
	return first
}

func concat(lists ...[]string) []string {
	var all []string
	for _, l := range lists {
		all = append(all, l...)
	}
	return all
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "importcheck:", err)
	os.Exit(2)
}
