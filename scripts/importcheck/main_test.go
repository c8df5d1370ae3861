package main

import (
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestCheck runs the project's table: for each kind of rule, a package that
// keeps it and a deliberate violation that must be reported.
func TestCheck(t *testing.T) {
	const m = module + "/"
	tests := []struct {
		name string
		p    pkg
		// want lists a substring of each violation, in order; none when
		// the imports are allowed.
		want []string
	}{
		// Between components (top-level trees).
		{"router may import proto and vllm", pkg{ImportPath: m + "router/api", Imports: []string{m + "proto/llmgw/v1", m + "vllm", "net/http"}}, nil},
		{"router may not import agent", pkg{ImportPath: m + "router", Imports: []string{m + "agent"}}, []string{"imports " + m + "agent"}},
		{"a test of controlplane may not import router", pkg{ImportPath: m + "controlplane", TestImports: []string{m + "router/watch"}}, []string{"router/watch"}},
		{"fsm may not import controlplane", pkg{ImportPath: m + "fsm", XTestImports: []string{m + "controlplane"}}, []string{"imports " + m + "controlplane"}},
		{"sim may not import proto", pkg{ImportPath: m + "sim", Imports: []string{m + "proto/llmgw/v1"}}, []string{"proto/llmgw/v1"}},
		{"proto may import nothing of the repository", pkg{ImportPath: m + "proto/llmgw/v1", Imports: []string{m + "fsm", "google.golang.org/grpc"}}, []string{"imports " + m + "fsm"}},
		{"cmd may import anything", pkg{ImportPath: m + "cmd/llmgw", Imports: []string{m + "agent", m + "router", "net/http"}}, nil},
		{"own subpackages are fine", pkg{ImportPath: m + "agent/engine", Imports: []string{m + "agent/supervisor"}}, nil},
		{"an external test importing its own package is fine", pkg{ImportPath: m + "vllm", XTestImports: []string{m + "vllm"}}, nil},
		{"a repeated import is reported once", pkg{ImportPath: m + "sim", Imports: []string{m + "fsm"}, TestImports: []string{m + "fsm"}}, []string{"imports " + m + "fsm"}},
		{"a lookalike prefix is another tree", pkg{ImportPath: m + "routerx", Imports: []string{m + "agent"}}, nil},

		// internal: anyone may import it, it imports nothing of the repository.
		{"router may import internal", pkg{ImportPath: m + "router/watch", Imports: []string{m + "internal/backoff", m + "internal/addrs"}}, nil},
		{"controlplane may import internal", pkg{ImportPath: m + "controlplane", Imports: []string{m + "internal/grpcstop"}}, nil},
		{"internal may use the stdlib and outside modules", pkg{ImportPath: m + "internal/configfile", Imports: []string{"reflect", "go.yaml.in/yaml/v3"}}, nil},
		{"internal may not import a component", pkg{ImportPath: m + "internal/backoff", Imports: []string{m + "router"}}, []string{"rule \"internal\""}},
		{"internal may not import proto", pkg{ImportPath: m + "internal/grpcstop", Imports: []string{m + "proto/llmgw/v1"}}, []string{"rule \"internal\""}},
		{"an internal leaf may not import another", pkg{ImportPath: m + "internal/addrs", TestImports: []string{m + "internal/backoff"}}, []string{"imports " + m + "internal/backoff"}},
		{"an internal leaf may import atomicfile", pkg{ImportPath: m + "internal/mtls", Imports: []string{m + "internal/atomicfile"}}, nil},
		{"atomicfile may not import another leaf", pkg{ImportPath: m + "internal/atomicfile", Imports: []string{m + "internal/backoff"}}, []string{"imports " + m + "internal/backoff"}},
		{"a leaf's test helper may import the leaf", pkg{ImportPath: m + "internal/mtls/mtlstest", Imports: []string{m + "internal/mtls"}}, nil},
		{"a leaf's test helper may not import another leaf", pkg{ImportPath: m + "internal/mtls/mtlstest", Imports: []string{m + "internal/backoff"}}, []string{"imports " + m + "internal/backoff"}},
		{"a lookalike helper is not one", pkg{ImportPath: m + "internal/backoff/mtlstest", Imports: []string{m + "internal/mtls"}}, []string{"imports " + m + "internal/mtls"}},

		// router/scheduler: nothing networked, on top of the router rule.
		{"the scheduler may import the prefix tree, proto and metrics", pkg{ImportPath: m + "router/scheduler", Imports: []string{m + "router/prefix", m + "proto/llmgw/v1", "github.com/prometheus/client_golang/prometheus", "math/rand/v2", "net/url", "net/netip"}}, nil},
		{"the scheduler may not import net/http", pkg{ImportPath: m + "router/scheduler", Imports: []string{"net/http"}}, []string{"imports net/http: denied by net/http/..."}},
		{"the scheduler's tests may not import httptest", pkg{ImportPath: m + "router/scheduler", TestImports: []string{"net/http/httptest"}}, []string{"denied by net/http/..."}},
		{"the scheduler may not import grpc", pkg{ImportPath: m + "router/scheduler", Imports: []string{"google.golang.org/grpc/status"}}, []string{"denied by google.golang.org/grpc/..."}},
		{"the scheduler may not import net", pkg{ImportPath: m + "router/scheduler/score", Imports: []string{"net"}}, []string{"imports net: denied by net "}},
		{"the scheduler still may not import agent", pkg{ImportPath: m + "router/scheduler", Imports: []string{m + "agent"}}, []string{"rule \"router\""}},
		{"the rest of router may import net/http", pkg{ImportPath: m + "router/endpoint", Imports: []string{"net/http", "google.golang.org/grpc", "net"}}, nil},

		// fsm: deterministic.
		{"fsm may import proto and protobuf", pkg{ImportPath: m + "fsm", Imports: []string{m + "proto/llmgw/v1", "google.golang.org/protobuf/proto", "net/url"}}, nil},
		{"fsm may not import raft", pkg{ImportPath: m + "fsm", Imports: []string{"github.com/hashicorp/raft"}}, []string{"denied by github.com/hashicorp/raft..."}},
		{"fsm's tests may not import raft-boltdb", pkg{ImportPath: m + "fsm", TestImports: []string{"github.com/hashicorp/raft-boltdb/v2"}}, []string{"denied by github.com/hashicorp/raft..."}},
		{"fsm may not import net/http", pkg{ImportPath: m + "fsm", Imports: []string{"net/http"}}, []string{"denied by net/http/..."}},
		{"fsm may not import net", pkg{ImportPath: m + "fsm", Imports: []string{"net"}}, []string{"denied by net "}},
		{"fsm may not draw random numbers", pkg{ImportPath: m + "fsm", Imports: []string{"math/rand/v2", "crypto/rand"}}, []string{"denied by math/rand/...", "denied by crypto/rand"}},

		// The whole module: one YAML library.
		{"go.yaml.in/yaml/v3 is the YAML library", pkg{ImportPath: m + "cmd/llmgwctl", Imports: []string{"go.yaml.in/yaml/v3"}}, nil},
		{"gopkg.in/yaml.v3 is not, even in cmd", pkg{ImportPath: m + "cmd/llmgw", Imports: []string{"gopkg.in/yaml.v3"}}, []string{"rule \"\""}},

		// An import that breaks two rules is reported under each.
		{"agent in the scheduler over http", pkg{ImportPath: m + "router/scheduler", Imports: []string{m + "agent", "net/http"}}, []string{"rule \"router\"", "denied by net/http/..."}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := check(rules, tt.p)
			if len(got) != len(tt.want) {
				t.Fatalf("check() = %q, want %d violations %q", got, len(tt.want), tt.want)
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("violation %d = %q, want it to contain %q", i, got[i], w)
				}
			}
		})
	}
}

// TestSubpackageRule shows the lead's way to constrain a new subpackage: a
// line keyed by its prefix, which adds to its component's rule.
func TestSubpackageRule(t *testing.T) {
	const m = module + "/"
	// The real table's control-plane lines are left out: the test's own
	// lines stand for them.
	var table []rule
	for _, r := range rules {
		if !strings.HasPrefix(r.Prefix, "controlplane/") {
			table = append(table, r)
		}
	}
	table = append(table,
		rule{
			Prefix: "controlplane/store",
			InRepo: []string{"fsm", "proto"},
			Deny:   networked,
			Why:    "test: the raft store knows neither membership nor the gRPC services",
		},
		rule{
			Prefix: "controlplane/service",
			Exact:  true,
			InRepo: []string{"proto", "fsm", "controlplane/store"},
			Why:    "test: the services see the store, and nothing else of the control plane",
		},
		rule{
			Prefix: "controlplane/service/admin",
			InRepo: []string{"proto", "fsm", "controlplane/service", "controlplane/snapfile"},
			Why:    "test: the admin service also writes snapshot files",
		},
	)
	tests := []struct {
		name string
		p    pkg
		bad  int
	}{
		{"the store may import fsm and proto", pkg{ImportPath: m + "controlplane/store", Imports: []string{m + "fsm", m + "proto/llmgw/v1", "github.com/hashicorp/raft"}}, 0},
		{"the store may not import a sibling", pkg{ImportPath: m + "controlplane/store", Imports: []string{m + "controlplane/membership"}}, 1},
		{"the store may not import grpc", pkg{ImportPath: m + "controlplane/store/boltlog", Imports: []string{"google.golang.org/grpc"}}, 1},
		{"the store may import its own subpackages", pkg{ImportPath: m + "controlplane/store", Imports: []string{m + "controlplane/store/boltlog"}}, 0},
		{"the store may import internal", pkg{ImportPath: m + "controlplane/store", Imports: []string{m + "internal/backoff"}}, 0},
		{"a sibling may import the store", pkg{ImportPath: m + "controlplane/service", Imports: []string{m + "controlplane/store", "google.golang.org/grpc"}}, 0},
		{"an exact rule holds for its package", pkg{ImportPath: m + "controlplane/service", Imports: []string{m + "controlplane/snapfile"}}, 1},
		{"an exact rule leaves the packages below it to their own rules", pkg{ImportPath: m + "controlplane/service/admin", Imports: []string{m + "controlplane/service", m + "controlplane/snapfile"}}, 0},
		{"the rule below still holds", pkg{ImportPath: m + "controlplane/service/admin", Imports: []string{m + "controlplane/store"}}, 1},
		{"a package with no rule of its own keeps its component's", pkg{ImportPath: m + "controlplane/leader", Imports: []string{m + "controlplane/snapfile", m + "fsm"}}, 0},
		{"the store still may not import router", pkg{ImportPath: m + "controlplane/store", Imports: []string{m + "router"}}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := check(table, tt.p); len(got) != tt.bad {
				t.Fatalf("check() = %q, want %d violations", got, tt.bad)
			}
		})
	}
}

// TestUnused: a rule whose prefix covers no package is reported, since it
// could never fail.
func TestUnused(t *testing.T) {
	pkgs := []pkg{{ImportPath: module + "/router/scheduler"}, {ImportPath: module + "/internal/backoff"}, {ImportPath: "example.com/other/routers"}}
	table := []rule{{Prefix: "router"}, {Prefix: "router/scheduler"}, {Prefix: "internal"}, {Prefix: ""}, {Prefix: "routers"}, {Prefix: "router/schedule"}, {Prefix: "router", Exact: true}}
	got := unused(table, pkgs)
	if len(got) != 3 || !strings.Contains(got[0], `"routers"`) || !strings.Contains(got[1], `"router/schedule"`) || !strings.Contains(got[2], `"router"`) {
		t.Fatalf("unused() = %q, want the rules \"routers\", \"router/schedule\" and the exact \"router\"", got)
	}
}

// TestTable: every rule of the project's table says why it exists, and no
// prefix has two rules (the second would read as an override, and is not).
func TestTable(t *testing.T) {
	type key struct {
		prefix string
		exact  bool
	}
	seen := map[key]bool{}
	for _, r := range rules {
		if strings.TrimSpace(r.Why) == "" {
			t.Errorf("rule %q has no Why", r.Prefix)
		}
		if k := (key{r.Prefix, r.Exact}); seen[k] {
			t.Errorf("prefix %q has two rules", r.Prefix)
		} else {
			seen[k] = true
		}
		if r.AnyInRepo && (len(r.InRepo) > 0 || r.Leaves) {
			t.Errorf("rule %q: AnyInRepo ignores InRepo and Leaves", r.Prefix)
		}
	}
}

func TestMatches(t *testing.T) {
	tests := []struct {
		pattern, imp string
		want         bool
	}{
		{"net", "net", true},
		{"net", "net/http", false},
		{"net", "net/url", false},
		{"net/http/...", "net/http", true},
		{"net/http/...", "net/http/httptest", true},
		{"net/http/...", "net/httpx", false},
		{"github.com/hashicorp/raft...", "github.com/hashicorp/raft", true},
		{"github.com/hashicorp/raft...", "github.com/hashicorp/raft-boltdb/v2", true},
		{"github.com/hashicorp/raft...", "github.com/hashicorp/memberlist", false},
	}
	for _, tt := range tests {
		if got := matches(tt.pattern, tt.imp); got != tt.want {
			t.Errorf("matches(%q, %q) = %v, want %v", tt.pattern, tt.imp, got, tt.want)
		}
	}
}

// TestControlPlaneLayers runs the real table's control-plane lines: a
// layer that reaches past its rule fails, one that keeps to it passes.
func TestControlPlaneLayers(t *testing.T) {
	const m = module + "/"
	tests := []struct {
		name string
		p    pkg
		want int
	}{
		{"the store may not import the services", pkg{ImportPath: m + "controlplane/store", Imports: []string{m + "controlplane/service"}}, 1},
		{"a leaf may not import a sibling", pkg{ImportPath: m + "controlplane/placement", Imports: []string{m + "controlplane/store"}}, 1},
		{"no package below imports the root", pkg{ImportPath: m + "controlplane/leader", Imports: []string{m + "controlplane"}}, 1},
		{"a service may use what its rule lists", pkg{ImportPath: m + "controlplane/service/admin", Imports: []string{m + "controlplane/service", m + "controlplane/cluster", m + "fsm", m + "internal/backoff"}}, 0},
		{"the root wires them all", pkg{ImportPath: m + "controlplane", Imports: []string{m + "controlplane/store", m + "controlplane/service/admin"}}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := check(rules, tt.p); len(got) != tt.want {
				t.Fatalf("check() = %q, want %d violations", got, tt.want)
			}
		})
	}
}

// TestRooms runs the real table's lines for the rooms of architecture
// step 2 (design §3 "Rooms by job"): each deliberate violation — the kind
// of import that would undo a split — fails, and the shape as built passes.
func TestRooms(t *testing.T) {
	const m = module + "/"
	tests := []struct {
		name string
		p    pkg
		bad  bool
	}{
		{"the agent's session may not import its replica set", pkg{ImportPath: m + "agent/session", Imports: []string{m + "agent/replicas"}}, true},
		{"the replica set may not import the session", pkg{ImportPath: m + "agent/replicas", Imports: []string{m + "agent/session"}}, true},
		{"the session may not import the agent root", pkg{ImportPath: m + "agent/session", Imports: []string{m + "agent"}}, true},
		{"the session may use chunking, proto and internal", pkg{ImportPath: m + "agent/session", Imports: []string{m + "chunking", m + "proto/llmgw/v1", m + "internal/backoff"}}, false},
		{"the HTTP surface may not reach the KV index", pkg{ImportPath: m + "router/api", Imports: []string{m + "router/kvindex"}}, true},
		{"the HTTP surface may not import the router root", pkg{ImportPath: m + "router/api", Imports: []string{m + "router"}}, true},
		{"the proxy may not import the director", pkg{ImportPath: m + "router/proxy", Imports: []string{m + "router/director"}}, true},
		{"the director may not import the proxy", pkg{ImportPath: m + "router/director", Imports: []string{m + "router/proxy"}}, true},
		{"gossip may not import the ephemeral plane", pkg{ImportPath: m + "controlplane/gossip", Imports: []string{m + "controlplane/ephemeral/plane"}}, true},
		{"gossip may not import the sessions", pkg{ImportPath: m + "controlplane/gossip", Imports: []string{m + "controlplane/ephemeral/sessions"}}, true},
		{"the ephemeral store stays a leaf", pkg{ImportPath: m + "controlplane/ephemeral", Imports: []string{m + "controlplane/ephemeral/sessions"}}, true},
		{"the plane may use the store and gossip", pkg{ImportPath: m + "controlplane/ephemeral/plane", Imports: []string{m + "controlplane/ephemeral", m + "controlplane/gossip"}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := check(rules, tt.p); (len(got) > 0) != tt.bad {
				t.Fatalf("check() = %q, want a violation: %v", got, tt.bad)
			}
		})
	}
}
