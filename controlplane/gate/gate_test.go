//go:build !llmgw_upgrade_old

package gate

import (
	"slices"
	"testing"
)

// TestGateBlockers: which servers keep a gate closed, from the versions of
// every server in the Raft configuration.
func TestGateBlockers(t *testing.T) {
	tests := []struct {
		name     string
		want     string
		versions map[string]string
		blockers []string
	}{
		{"all new", "v0.2.0", map[string]string{"c1": "v0.2.0", "c2": "v0.2.0", "c3": "v0.3.0"}, nil},
		{"one old follower", "v0.2.0", map[string]string{"c1": "v0.2.0", "c2": "v0.1.0", "c3": "v0.2.0"}, []string{"c2 (v0.1.0)"}},
		{"all old", "v0.2.0", map[string]string{"c1": "v0.1.0", "c2": "v0.1.0"}, []string{"c1 (v0.1.0)", "c2 (v0.1.0)"}},
		{"unknown version blocks", "v0.2.0", map[string]string{"c1": "v0.2.0", "c4": ""}, []string{"c4 (unknown version)"}},
		{"pre-release is below its release", "v0.2.0", map[string]string{"c1": "v0.2.0-rc.1"}, []string{"c1 (v0.2.0-rc.1)"}},
		{"dev builds pass", "v0.2.0", map[string]string{"c1": "dev", "c2": "41e4ec2"}, nil},
		{"non-voters count too (every server given)", "v0.2.0", map[string]string{"c1": "v0.2.0", "nv": "v0.1.9"}, []string{"nv (v0.1.9)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Blockers(tt.want, tt.versions); !slices.Equal(got, tt.blockers) {
				t.Fatalf("blockers %v, want %v", got, tt.blockers)
			}
		})
	}
}
