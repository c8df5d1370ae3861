//go:build !llmgw_upgrade_old

package cluster

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/controlplane/gossip"
	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestRefusal: a server below the committed minimum version is refused at
// join, as is one with another bootstrap expectation.
func TestRefusal(t *testing.T) {
	tests := []struct {
		name   string
		min    string
		meta   gossip.Meta
		reason string // substring; "" means not refused
	}{
		{"no minimum yet", "", gossip.Meta{ID: "c4", Version: "v0.1.0", Expect: 3}, ""},
		{"at the minimum", "v0.2.0", gossip.Meta{ID: "c4", Version: "v0.2.0", Expect: 3}, ""},
		{"newer", "v0.2.0", gossip.Meta{ID: "c4", Version: "v0.3.0"}, ""},
		{"older", "v0.2.0", gossip.Meta{ID: "c4", Version: "v0.1.0", Expect: 3}, "runs v0.1.0, below the cluster's minimum version v0.2.0"},
		{"unknown", "v0.2.0", gossip.Meta{ID: "c4"}, "runs an unknown version"},
		{"expect mismatch", "", gossip.Meta{ID: "c4", Version: "v0.2.0", Expect: 5}, "--bootstrap-expect 5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state := fsm.New(fsm.Config{})
			if tt.min != "" {
				b, _ := fsm.NewCommand(llmgwv1.CommandType_COMMAND_TYPE_SET_CLUSTER_CONFIG, &llmgwv1.SetClusterConfigCommand{Config: &llmgwv1.ClusterConfig{MinVersion: tt.min}})
				if _, err := state.Apply(1, b); err != nil {
					t.Fatal(err)
				}
			}
			c := New(Config{NodeID: "c1", BootstrapExpect: 3}, nil, nil, nil, state, nil, NewPool(nil), slog.New(slog.DiscardHandler), time.Now)
			got := c.refusal(tt.meta)
			if (tt.reason == "") != (got == "") || !strings.Contains(got, tt.reason) {
				t.Fatalf("refusal %q, want %q", got, tt.reason)
			}
		})
	}
}

// TestRefusalIdentity: a server announcing another cluster's id is
// refused; one announcing none yet (fresh, or of an older release) or
// ours is not; a server founded with --bootstrap refuses one started to
// form a cluster with --bootstrap-expect (design §5.2 "Cluster identity").
func TestRefusalIdentity(t *testing.T) {
	const ours, theirs = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	tests := []struct {
		name      string
		bootstrap bool
		expect    int
		meta      gossip.Meta
		reason    string
	}{
		{"same cluster", false, 3, gossip.Meta{ID: "c4", Version: "v0.2.0", Expect: 3, Cluster: ours}, ""},
		{"no id yet", false, 3, gossip.Meta{ID: "c4", Version: "v0.2.0", Expect: 3}, ""},
		{"another cluster", false, 3, gossip.Meta{ID: "c4", Version: "v0.2.0", Expect: 3, Cluster: theirs}, "belongs to cluster " + theirs},
		{"a --bootstrap server meets an HA cluster's server", true, 0, gossip.Meta{ID: "c4", Version: "v0.2.0", Expect: 3}, "--bootstrap-expect 3 to form a cluster of its own"},
		{"a --bootstrap server meets a plain joiner", true, 0, gossip.Meta{ID: "c4", Version: "v0.2.0"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state := fsm.New(fsm.Config{})
			b, _ := fsm.NewCommand(llmgwv1.CommandType_COMMAND_TYPE_SET_CLUSTER_CONFIG, &llmgwv1.SetClusterConfigCommand{Config: &llmgwv1.ClusterConfig{ClusterId: ours}})
			if _, err := state.Apply(1, b); err != nil {
				t.Fatal(err)
			}
			c := New(Config{NodeID: "c1", BootstrapExpect: tt.expect, Bootstrap: tt.bootstrap}, nil, nil, nil, state, nil, NewPool(nil), slog.New(slog.DiscardHandler), time.Now)
			got := c.refusal(tt.meta)
			if (tt.reason == "") != (got == "") || !strings.Contains(got, tt.reason) {
				t.Fatalf("refusal %q, want %q", got, tt.reason)
			}
		})
	}
}
