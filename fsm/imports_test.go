package fsm

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestDeterministicImports checks design §3/§4 by reading this package's
// imports: the FSM imports only proto and internal/hostcheck (the endpoint
// policy it shares with the agent, which parses strings only), and nothing
// that could make two nodes differ (clock, randomness, network, files, raft).
func TestDeterministicImports(t *testing.T) {
	forbidden := []string{"time", "math/rand", "math/rand/v2", "crypto/rand", "net", "os", "syscall", "unsafe", "github.com/hashicorp/raft"}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			for _, bad := range forbidden {
				// net/url and net/netip only parse strings.
				if path == bad || (strings.HasPrefix(path, bad+"/") && path != "net/url" && path != "net/netip") {
					t.Errorf("%s imports %s: the FSM must stay deterministic", name, path)
				}
			}
			if strings.HasPrefix(path, "github.com/llmgw/llmgw/") && path != "github.com/llmgw/llmgw/proto/llmgw/v1" &&
				path != "github.com/llmgw/llmgw/internal/hostcheck" {
				t.Errorf("%s imports %s: fsm may import only proto and internal/hostcheck (design §3)", name, path)
			}
		}
	}
}
