package controlplane

import (
	"strings"
	"testing"
	"time"
)

func TestDecodeConfig(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		wantErr string
		check   func(t *testing.T, c Config)
	}{
		{"empty keeps defaults", "", "", func(t *testing.T, c Config) {
			d := DefaultConfig()
			if c.GRPCAddr != d.GRPCAddr || c.HeartbeatTimeout != d.HeartbeatTimeout || c.NodeID != "" {
				t.Fatalf("changed: %+v", c)
			}
		}},
		{"fields and durations", "node_id: c1\ngrpc_addr: 10.0.0.1:7400\nbootstrap: true\nheartbeat_timeout: 200ms\njoin: [a:1, b:2]\n", "", func(t *testing.T, c Config) {
			if c.NodeID != "c1" || c.GRPCAddr != "10.0.0.1:7400" || !c.Bootstrap || c.HeartbeatTimeout != 200*time.Millisecond || len(c.Join) != 2 {
				t.Fatalf("decoded %+v", c)
			}
			if c.ElectionTimeout != DefaultConfig().ElectionTimeout {
				t.Fatal("an absent key lost its default")
			}
		}},
		{"unknown key", "grpc_adr: x:1\n", "grpc_adr", nil},
		{"bad duration", "election_timeout: soon\n", "line 1", nil},
		{"version is not from the file", "version: 9\n", "version", nil},
		{"two documents", "node_id: a\n---\nnode_id: b\n", "more than one", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			err := DecodeConfig(strings.NewReader(tt.yaml), &c)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("DecodeConfig: %v, want an error mentioning %q", err, tt.wantErr)
				}
				if c.GRPCAddr != DefaultConfig().GRPCAddr || c.NodeID != "" {
					t.Fatal("a refused file changed the config")
				}
				return
			}
			if err != nil {
				t.Fatalf("DecodeConfig: %v", err)
			}
			tt.check(t, c)
		})
	}
}

// FuzzDecodeConfig: the file is outside input; no panic, and a refusal
// leaves the config as it was.
func FuzzDecodeConfig(f *testing.F) {
	f.Add("node_id: c1\nheartbeat_timeout: 200ms\njoin: [a:1]\n")
	f.Add("{")
	f.Add("watch_queue: -1\n")
	f.Fuzz(func(t *testing.T, doc string) {
		c := DefaultConfig()
		if err := DecodeConfig(strings.NewReader(doc), &c); err != nil {
			if c.GRPCAddr != DefaultConfig().GRPCAddr || c.NodeID != "" {
				t.Fatal("a refused file changed the config")
			}
			return
		}
		_ = c.Validate()
	})
}
