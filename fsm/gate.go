package fsm

import llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"

// gatedCommand is a command type newer than the cluster's first release:
// its payload schema version and the release that introduced it. The
// control plane proposes it only when every server in the Raft
// configuration reports at least that release, and commits the release as
// ClusterConfig.min_version first (design §4, §13.3).
type gatedCommand struct {
	schema     uint32
	introduced string
}

// Known reports whether this build can apply commands of type t.
func Known(t llmgwv1.CommandType) bool {
	_, ok := knownCommand(t)
	return ok
}

// Introduced returns the release that introduced t, or "" for a type every
// release knows (and for a type this build does not know: Known says which).
func Introduced(t llmgwv1.CommandType) string {
	return gatedCommands[t].introduced
}

// knownCommand returns the payload schema version this build writes and
// applies for t.
func knownCommand(t llmgwv1.CommandType) (uint32, bool) {
	if v, ok := commandVersions[t]; ok {
		return v, true
	}
	g, ok := gatedCommands[t]
	return g.schema, ok
}

// Admitted reports whether a cluster whose committed minimum version is min
// already admits commands of type t without another gate check: this build
// knows t, and t is either known to every release or introduced at or below
// min. Background work that must never open the gate by itself (and so
// commit a minimum version the operator did not ask for) proposes a gated
// command only when it is admitted.
func Admitted(t llmgwv1.CommandType, min string) bool {
	if !Known(t) {
		return false
	}
	want := Introduced(t)
	return want == "" || (min != "" && AtLeast(min, want))
}
