//go:build !llmgw_upgrade_old

package controlplane

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

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
			if _, _, err := r.srv.store.Propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_REGISTER_NODE, &llmgwv1.RegisterNodeCommand{Node: &llmgwv1.Node{Id: "n1", Gpus: 1, Labels: map[string]string{"zone": "a"}}}); err != nil {
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
