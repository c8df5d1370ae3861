package main

import (
	"fmt"
	"path"
	"strings"
)

const module = "github.com/llmgw/llmgw"

// rule is one line of the dependency table of design §3: what the packages
// under Prefix may import. Every rule covering a package applies to it, so a
// rule for a subpackage (router/scheduler) only adds to the rule of its
// component (router), and never relaxes it.
type rule struct {
	// Prefix is a package path relative to the module root. The rule covers
	// that package and every package below it; "" covers the whole module.
	Prefix string
	// Exact narrows the rule to the package at Prefix alone, for a package
	// whose subpackages have rules of their own (controlplane/service and
	// controlplane/service/admin): a rule covering a tree would have to allow
	// what every package below it imports.
	Exact bool
	// InRepo lists the in-repo trees (paths relative to the module root, each
	// with everything below it) a covered package may import besides its own
	// tree (Prefix/...) and the shared trees. Empty: none. Ignored when
	// AnyInRepo is set.
	InRepo []string
	// AnyInRepo lifts the in-repo restriction: the rule only denies (Deny).
	AnyInRepo bool
	// Leaves makes each package under Prefix a leaf: it may not import the
	// other packages of its own tree or the shared trees either, only InRepo.
	Leaves bool
	// Deny lists import paths no covered package may import, stdlib and
	// outside modules included: "net" is that package alone, "net/http/..."
	// net/http and everything below it, "github.com/hashicorp/raft..." every
	// path beginning so (raft, raft-boltdb, raft-autopilot).
	Deny []string
	// Why is printed with each violation: what the rule protects, citing
	// the design.
	Why string
}

// sharedTrees may be imported by any package: the stdlib-only helpers of
// internal/ (design §3).
var sharedTrees = []string{"internal"}

// networked is what "imports nothing networked" forbids: the stdlib's
// sockets and HTTP, and every networking library in go.mod. net/url and
// net/netip are values, not sockets, and stay allowed.
var networked = []string{
	"net",
	"net/http/...",
	"net/rpc/...",
	"google.golang.org/grpc/...",
	"github.com/hashicorp/memberlist/...",
	"github.com/go-zeromq/zmq4/...",
	"github.com/coder/websocket/...",
}

// rules is the table scripts/importcheck enforces. A package no rule covers
// (cmd, integration, scripts) may import anything but what the "" rule
// denies. To constrain a new subpackage, add a line with its Prefix; the rule
// of its component keeps applying, so the line lists the component's trees
// again next to the siblings it may use:
//
//	{Prefix: "controlplane/store", InRepo: []string{"proto", "fsm", "controlplane/logadapt"}, Why: "..."},
//	{Prefix: "controlplane/service", Exact: true, InRepo: []string{"proto", "fsm", "controlplane/store", ...}, Why: "..."},
var rules = []rule{
	{
		Prefix:    "",
		AnyInRepo: true,
		Deny:      []string{"gopkg.in/yaml.v2/...", "gopkg.in/yaml.v3/...", "sigs.k8s.io/yaml/...", "github.com/goccy/go-yaml/..."},
		Why:       "one YAML library in the module: go.yaml.in/yaml/v3, through internal/configfile",
	},
	{
		Prefix: "proto",
		Why:    "proto/llmgw/v1 is generated code and imports no other package of the repository (design §3)",
	},
	{
		Prefix: "fsm",
		InRepo: []string{"proto"},
		Deny: append([]string{
			"github.com/hashicorp/raft...",
			"math/rand/...",
			"crypto/rand",
		}, networked...),
		Why: "the FSM is deterministic: no raft, randomness or network imports, only proto (design §3, §4)",
	},
	{
		Prefix: "vllm",
		Why:    "vllm describes vLLM's wire formats and imports no other package of the repository (design §3)",
	},
	{
		Prefix: "chunking",
		InRepo: []string{"proto"},
		Why:    "chunking is the ephemeral updates' chunk framing, part of the wire contract the components share; it imports only proto (design §3, §5.4)",
	},
	{
		Prefix: "controlplane",
		InRepo: []string{"proto", "fsm", "chunking", "vllm"},
		Why:    "controlplane meets agent and router only through proto and fsm; vllm's formats only for the console's reading of engines' load (design §3)",
	},
	// The control plane split by job (design §3, §5): each package may use
	// only the siblings listed, so a new dependency between them is a
	// decision made here. The root, which wires one node, may import them
	// all; nothing below imports the root.
	cpLayer("controlplane/logadapt", false, "adapts hclog and memberlist logs to slog; a leaf"),
	cpLayer("controlplane/snapfile", false, "the snapshot file format; a leaf"),
	// The ephemeral store is a leaf; the plane and the sessions table, which
	// sit on it, are the packages below it, with lines of their own.
	leafAbove(cpLayer("controlplane/ephemeral", true, "the ephemeral store: the acceptance rule and the agents' data; a leaf")),
	cpLayer("controlplane/ephemeral/sessions", false, "who is attached where; a leaf"),
	cpLayer("controlplane/ephemeral/plane", false, "the ephemeral plane between servers, over gossip's transport", "controlplane/ephemeral", "controlplane/gossip"),
	cpLayer("controlplane/placement", false, "placement decisions are pure functions of the state; a leaf"),
	cpLayer("controlplane/gate", false, "the minimum-version gate; a leaf"),
	cpLayer("controlplane/identity", false, "the cluster identity: its file and its minting (design §5.2); a leaf"),
	cpLayer("controlplane/store", false, "the Raft store", "controlplane/logadapt"),
	cpLayer("controlplane/gossip", false, "the memberlist member; it hands the ephemeral plane its messages through an interface, and never imports it", "controlplane/logadapt"),
	cpLayer("controlplane/cluster", false, "membership: bootstrap, join, autopilot", "controlplane/gossip", "controlplane/logadapt"),
	cpLayer("controlplane/quota", false, "the leased shares of the tenants' limits (design §7.7): pure, a leaf"),
	cpLayer("controlplane/flowview", false, "the routers' flow-control queues as the leader last heard them (design §7.8): a leaf"),
	cpLayer("controlplane/autoscale", false, "the autoscaler's decision (design §5.7): pure, a leaf"),
	cpLayer("controlplane/leader", false, "the leader's loops", "controlplane/placement", "controlplane/quota", "controlplane/autoscale"),
	cpLayer("controlplane/service", true, "errors to codes in one place and forwarding; the services see the rest through the interfaces they declare",
		"controlplane/cluster", "controlplane/flowview", "controlplane/gate", "controlplane/leader", "controlplane/quota", "controlplane/store"),
	cpLayer("controlplane/service/admin", false, "AdminService", "controlplane/service", "controlplane/cluster", "controlplane/snapfile"),
	cpLayer("controlplane/service/agent", false, "AgentService", "controlplane/service", "controlplane/ephemeral"),
	cpLayer("controlplane/service/watch", false, "WatchService", "controlplane/service", "controlplane/ephemeral"),
	cpLayer("controlplane/service/adapter", false, "AdapterService", "controlplane/service"),
	cpLayer("controlplane/service/quota", false, "QuotaService", "controlplane/service"),
	// Its tests run the real table behind the service.
	cpLayer("controlplane/service/flow", false, "FlowService", "controlplane/service", "controlplane/flowview"),
	cpLayer("controlplane/service/server", false, "ServerService", "controlplane/service"),
	cpLayer("controlplane/console", false, "the read-only web console: AdminService over gRPC, engines' and routers' /metrics", "vllm"),
	{
		Prefix: "agent",
		InRepo: []string{"proto", "vllm", "chunking"},
		Why:    "agent meets controlplane and router only through proto (design §3)",
	},
	// The agent split by job (design §3, §6): the root wires one agent and
	// may import them all; the session and the replica set meet only in
	// the root, through the interfaces the session declares.
	{
		Prefix: "agent/session",
		InRepo: []string{"proto", "chunking", "agent/datadir"},
		Why:    "agent/session (the control-plane session) sees the replicas, the KV hub and the adapters through the interfaces it declares: only proto, chunking, internal and agent/datadir (design §3, §5.4)",
	},
	{
		Prefix: "agent/replicas",
		InRepo: []string{"proto", "vllm", "agent/adapters", "agent/datadir", "agent/drain", "agent/engine", "agent/kv", "agent/load", "agent/supervisor"},
		Why:    "agent/replicas (the replica set) knows nothing of the control session or the agent root: only proto, vllm, internal and the engine-side agent packages (design §3, §6)",
	},
	{
		Prefix: "router",
		InRepo: []string{"proto", "vllm", "chunking"},
		Why:    "router meets controlplane and agent only through proto (design §3)",
	},
	{
		Prefix:    "router/scheduler",
		AnyInRepo: true,
		Deny:      networked,
		Why:       "the scheduler core imports nothing networked, so it can be tested and benchmarked alone (design §3, §7.3)",
	},
	// The request pipeline (design §7.3): handler (router/api) → director →
	// scheduler → proxy. The router root builds every stage and hands each
	// the ones it runs; a stage sees the next only through an interface it
	// declares, so none imports a stage that runs before it.
	{
		Prefix: "router/api",
		InRepo: []string{"proto", "vllm", "router/auth", "router/openai", "router/endpoint", "router/tokenize", "router/director", "router/proxy",
			"router/scheduler", "router/breaker", "router/quota", "router/flow", "router/waitroom"},
		Why: "the HTTP surface runs the director and the proxy router.New hands it, knowing them by their types alone; it reads desired state " +
			"through its own Models interface and never the watch stream, the KV index or the prefix tree (scheduler and breaker are " +
			"for its tests, which build the stages as router.New does; design §7.1, §7.3)",
	},
	{
		Prefix: "router/director",
		InRepo: []string{"proto", "vllm", "router/openai", "router/endpoint", "router/scheduler", "router/breaker", "router/kvindex",
			"router/prefix", "router/tokenize"},
		Why: "the director decides where a request goes from the routing table, the scheduler and tier 2's index, each behind an interface " +
			"it declares; it never forwards (router/proxy), answers HTTP (router/api) or follows the watch stream (design §7.3, §7.5)",
	},
	{
		Prefix: "router/quota",
		InRepo: []string{"proto", "router/openai"},
		Deny:   networked,
		Why: "tenants' admission and metering decide from this router's leased shares alone: no request waits on the network, and " +
			"the control plane is a Client the router root hands it (design §7.7)",
	},
	{
		Prefix: "router/flow",
		InRepo: []string{"proto", "router/openai", "router/endpoint"},
		Deny:   networked,
		Why: "flow control decides from this router's view of its replicas' load and what the other routers last reported, " +
			"handed to it: no request waits on the network (design §7.8)",
	},
	{
		Prefix: "router/waitroom",
		InRepo: []string{"proto", "vllm", "router/openai", "router/endpoint"},
		Deny:   networked,
		Why: "the waiting room decides from the routing table it is handed and its own counts: no request waits on the network " +
			"(design §5.7)",
	},
	{
		Prefix: "router/demand",
		InRepo: []string{"proto", "router/endpoint"},
		Deny:   networked,
		Why: "the demand report is counted from the routing table and the waiting room, handed to it; the flow-share loop sends it " +
			"(design §5.7)",
	},
	{
		Prefix: "router/flowshare",
		InRepo: []string{"proto"},
		Deny:   networked,
		Why: "sharing the flow-control queues is a loop over two interfaces it declares, the router's flow control and a Reporter the " +
			"router root hands it: it knows no connection (design §7.8)",
	},
	{
		Prefix: "router/proxy",
		InRepo: []string{"router/openai", "router/endpoint", "router/scheduler", "router/breaker"},
		Why: "the proxy knows connections and bytes, not models: where to go next is the Route it declares (director.Plan), what the " +
			"client sees on a refusal is router/api's (design §7.1, §7.4)",
	},
	{
		Prefix: "sim",
		InRepo: []string{"vllm"},
		Why:    "the simulator speaks vLLM's formats and knows nothing of llmgw (design §3, §8)",
	},
	{
		Prefix: "bench",
		InRepo: []string{"proto", "vllm"},
		Why:    "bench drives a cluster through proto only, and reads engines through vllm's formats (design §3, §10)",
	},
	{
		Prefix: "internal",
		Leaves: true,
		InRepo: []string{"internal/atomicfile"},
		Why:    "internal/... are leaf helpers anyone may import; they import no package of the repository, not even each other, but for internal/atomicfile, the one helper the other leaves may use (design §3)",
	},
}

// pkg is the part of `go list -json` the check reads.
type pkg struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

// check returns one line per import of p, its tests included, that a rule
// of table forbids: a test that wires the router to the agent is a layering
// leak too. Each import is reported once per rule it breaks.
func check(table []rule, p pkg) []string {
	from, ok := rel(p.ImportPath)
	if !ok {
		return nil
	}
	var bad []string
	seen := map[string]bool{}
	for _, imp := range concat(p.Imports, p.TestImports, p.XTestImports) {
		if seen[imp] || imp == p.ImportPath {
			continue
		}
		seen[imp] = true
		for _, r := range table {
			if !r.covers(from) {
				continue
			}
			if why := r.forbids(from, imp); why != "" {
				bad = append(bad, fmt.Sprintf("%s imports %s: %s (rule %q: %s)", p.ImportPath, imp, why, r.Prefix, r.Why))
			}
		}
	}
	return bad
}

// forbids says why r forbids package from (relative path) importing imp, or
// "" when r allows it.
func (r rule) forbids(from, imp string) string {
	for _, d := range r.Deny {
		if matches(d, imp) {
			return "denied by " + d
		}
	}
	to, inRepo := rel(imp)
	if !inRepo || r.AnyInRepo {
		return ""
	}
	if !r.Leaves {
		if covers(r.Prefix, to) {
			return ""
		}
		for _, s := range sharedTrees {
			if covers(s, to) {
				return ""
			}
		}
	}
	for _, a := range r.InRepo {
		if covers(a, to) {
			return ""
		}
	}
	if r.Leaves && testHelperOf(from, to) {
		return ""
	}
	if r.Leaves {
		return fmt.Sprintf("from the repository, a package under %s may import %s", r.label(), orNothing(r.InRepo))
	}
	return fmt.Sprintf("from the repository, %s may import only itself, %s", r.label(), strings.Join(concat(sharedTrees, r.InRepo), ", "))
}

// testHelperOf reports whether package from is the test helper of package
// to: to/Ttest, T being to's last element, the standard library's
// net/http/httptest shape (internal/mtls/mtlstest). A leaf's test helper
// is part of the leaf: it may import it and nothing else a leaf may not.
func testHelperOf(from, to string) bool {
	return path.Dir(from) == to && path.Base(from) == path.Base(to)+"test"
}

func orNothing(trees []string) string {
	if len(trees) == 0 {
		return "nothing"
	}
	return "only " + strings.Join(trees, ", ")
}

// covers reports whether r applies to the package at relative path p.
func (r rule) covers(p string) bool {
	if r.Exact {
		return p == r.Prefix
	}
	return covers(r.Prefix, p)
}

func (r rule) label() string {
	if r.Prefix == "" {
		return "the module"
	}
	return r.Prefix
}

// rel is an import path relative to the module root ("" for the root
// package itself), and whether the path is in the module at all.
func rel(path string) (string, bool) {
	if path == module {
		return "", true
	}
	rest, ok := strings.CutPrefix(path, module+"/")
	return rest, ok
}

// covers reports whether tree (relative, "" for the whole module) holds the
// package at relative path p.
func covers(tree, p string) bool {
	return tree == "" || p == tree || strings.HasPrefix(p, tree+"/")
}

// matches reports whether import path imp matches pattern: "a/b/..." is a/b
// and everything below it, "a/b..." every path beginning with a/b, anything
// else that path alone.
func matches(pattern, imp string) bool {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return imp == base || strings.HasPrefix(imp, base+"/")
	}
	if base, ok := strings.CutSuffix(pattern, "..."); ok {
		return strings.HasPrefix(imp, base)
	}
	return imp == pattern
}

func concat(lists ...[]string) []string {
	var all []string
	for _, l := range lists {
		all = append(all, l...)
	}
	return all
}

// cpLayer is the rule of one control-plane package: proto and fsm as for
// the whole control plane, plus the sibling packages it may use.
func cpLayer(prefix string, exact bool, job string, siblings ...string) rule {
	return rule{
		Prefix: prefix,
		Exact:  exact,
		InRepo: append([]string{"proto", "fsm", "chunking"}, siblings...),
		Why:    prefix + " (" + job + ") may import only proto, fsm, chunking, internal and the control-plane packages its rule lists (design §3)",
	}
}

// leafAbove makes r's package a leaf of its own tree as well: an Exact rule
// leaves the packages below its Prefix to their own lines, but still lets
// its package import them (its own tree), and a leaf with subpackages
// (controlplane/ephemeral, the store, beneath the plane and the sessions
// table) must not. The pattern also matches the package itself, which
// never imports itself.
func leafAbove(r rule) rule {
	r.Deny = append(r.Deny, module+"/"+r.Prefix+"/...")
	return r
}
