//go:build !llmgw_upgrade_old

package store

import (
	"errors"
	"testing"

	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

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
			if tt.stops && (!errors.Is(fatal, ErrBelowMinVersion) || !fsm.IsFatal(fatal)) {
				t.Fatalf("fatal error %v does not say why", fatal)
			}
		})
	}
}
