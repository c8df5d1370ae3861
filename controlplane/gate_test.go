//go:build !llmgw_upgrade_old

package controlplane

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
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
			if got := gateBlockers(tt.want, tt.versions); !slices.Equal(got, tt.blockers) {
				t.Fatalf("blockers %v, want %v", got, tt.blockers)
			}
		})
	}
}

// TestRefusal: a server below the committed minimum version is refused at
// join, as is one with another bootstrap expectation.
func TestRefusal(t *testing.T) {
	tests := []struct {
		name   string
		min    string
		meta   serverMeta
		reason string // substring; "" means not refused
	}{
		{"no minimum yet", "", serverMeta{ID: "c4", Version: "v0.1.0", Expect: 3}, ""},
		{"at the minimum", "v0.2.0", serverMeta{ID: "c4", Version: "v0.2.0", Expect: 3}, ""},
		{"newer", "v0.2.0", serverMeta{ID: "c4", Version: "v0.3.0"}, ""},
		{"older", "v0.2.0", serverMeta{ID: "c4", Version: "v0.1.0", Expect: 3}, "runs v0.1.0, below the cluster's minimum version v0.2.0"},
		{"unknown", "v0.2.0", serverMeta{ID: "c4"}, "runs an unknown version"},
		{"expect mismatch", "", serverMeta{ID: "c4", Version: "v0.2.0", Expect: 5}, "--bootstrap-expect 5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.NodeID, cfg.BootstrapExpect = "c1", 3
			s, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				t.Fatal(err)
			}
			if tt.min != "" {
				b, _ := fsm.NewCommand(llmgwv1.CommandType_COMMAND_TYPE_SET_CLUSTER_CONFIG, &llmgwv1.SetClusterConfigCommand{Config: &llmgwv1.ClusterConfig{MinVersion: tt.min}})
				if _, err := s.fsm.Apply(1, b); err != nil {
					t.Fatal(err)
				}
			}
			got := s.refusal(tt.meta)
			if (tt.reason == "") != (got == "") || !strings.Contains(got, tt.reason) {
				t.Fatalf("refusal %q, want %q", got, tt.reason)
			}
		})
	}
}

// TestBelowMinVersionStops: a server that applies (or restores) a minimum
// version above its own stops loudly and applies nothing more.
func TestBelowMinVersionStops(t *testing.T) {
	tests := []struct {
		name    string
		version string
		min     string
		stops   bool
	}{
		{"older build", "v0.1.0", "v0.2.0", true},
		{"same", "v0.2.0", "v0.2.0", false},
		{"dev build", "dev", "v0.2.0", false},
		{"no minimum", "v0.1.0", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var fatal error
			a := &fsmAdapter{fsm: fsm.New(fsm.Config{}), version: tt.version, fatal: func(err error) { fatal = err }}
			b, _ := fsm.NewCommand(llmgwv1.CommandType_COMMAND_TYPE_SET_CLUSTER_CONFIG, &llmgwv1.SetClusterConfigCommand{Config: &llmgwv1.ClusterConfig{MinVersion: tt.min}})
			if _, err := a.fsm.Apply(1, b); err != nil {
				t.Fatal(err)
			}
			a.checkMinVersion()
			if tt.stops != (fatal != nil) || tt.stops != a.stopped.Load() {
				t.Fatalf("fatal %v, stopped %v; want stop %v", fatal, a.stopped.Load(), tt.stops)
			}
			if tt.stops && (!errors.Is(fatal, errBelowMinVersion) || !fsm.IsFatal(fatal)) {
				t.Fatalf("fatal error %v does not say why", fatal)
			}
		})
	}
}

// TestGatedCommandOnOneServer: SetNodeLabels is refused with
// FAILED_PRECONDITION naming the server while it runs a release older than
// the command; on a release that has it, it is accepted, and the gate's
// release is committed as the cluster's minimum version first.
func TestGatedCommandOnOneServer(t *testing.T) {
	tests := []struct {
		version string
		ok      bool
	}{
		{"v0.1.0", false},
		{fsm.NodeLabelsVersion, true},
	}
	for _, tt := range tests {
		t.Run(tt.version, func(t *testing.T) {
			cfg := testConfig(t, t.TempDir(), freeAddr(t))
			cfg.Version = tt.version
			r := start(t, cfg)
			defer r.stop(t)
			ctx := context.Background()
			if _, _, err := r.srv.propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_REGISTER_NODE, &llmgwv1.RegisterNodeCommand{Node: &llmgwv1.Node{Id: "n1", Gpus: 1, Labels: map[string]string{"zone": "a"}}}); err != nil {
				t.Fatal(err)
			}
			admin := llmgwv1.NewAdminServiceClient(r.conn)
			resp, err := admin.SetNodeLabels(ctx, &llmgwv1.SetNodeLabelsRequest{Id: "n1", Set: map[string]string{"zone": "b"}})
			st, _ := admin.ClusterStatus(ctx, &llmgwv1.ClusterStatusRequest{})
			if !tt.ok {
				if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "c1 (v0.1.0)") {
					t.Fatalf("SetNodeLabels: %v, want FAILED_PRECONDITION naming c1 (v0.1.0)", err)
				}
				if st.MinVersion != "" {
					t.Fatalf("min_version %q committed by a refused write", st.MinVersion)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if resp.Node.Labels["zone"] != "b" || !resp.Node.LabelsByOperator {
				t.Fatalf("node after relabel: %v", resp.Node)
			}
			if st.MinVersion != fsm.NodeLabelsVersion {
				t.Fatalf("min_version %q, want %q", st.MinVersion, fsm.NodeLabelsVersion)
			}
		})
	}
}
