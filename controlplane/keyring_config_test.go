package controlplane

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestValidateGossipKeyFile: a good key file passes; a missing, empty or
// wrong-sized one, or one without gossip, is reported naming the flag.
func TestValidateGossipKeyFile(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := file("good", "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n") // 32 bytes
	tests := []struct {
		name   string
		mutate func(c *Config)
		want   []string
	}{
		{"good", func(c *Config) { c.GossipKeyFile = good }, nil},
		{"missing", func(c *Config) { c.GossipKeyFile = filepath.Join(dir, "none") }, []string{"--gossip-key-file (gossip_key_file): "}},
		{"empty", func(c *Config) { c.GossipKeyFile = file("empty", "\n") }, []string{"--gossip-key-file (gossip_key_file): "}},
		{"wrong size", func(c *Config) { c.GossipKeyFile = file("short", "c2hvcnQ=") }, []string{"--gossip-key-file (gossip_key_file): "}},
		{"without gossip", func(c *Config) { c.GossipKeyFile, c.GossipAddr = good, "" }, []string{"--gossip-key-file (gossip_key_file): needs --gossip-addr"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			c.NodeID = "c1"
			tt.mutate(&c)
			got := problems(c.Validate())
			if len(got) != len(tt.want) {
				t.Fatalf("Validate reported %q, want %q", got, tt.want)
			}
			for i, want := range tt.want {
				if !strings.HasPrefix(got[i], want) {
					t.Errorf("problem %d is %q, want prefix %q", i, got[i], want)
				}
			}
		})
	}
}
