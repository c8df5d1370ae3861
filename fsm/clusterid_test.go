package fsm

import (
	"errors"
	"testing"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func TestValidClusterID(t *testing.T) {
	tests := []struct {
		id   string
		want bool
	}{
		{"0123456789abcdef0123456789abcdef", true},
		{"", false},
		{"0123456789abcdef0123456789abcde", false},
		{"0123456789ABCDEF0123456789abcdef", false},
		{"0123456789abcdef0123456789abcdeg", false},
		{"0123456789abcdef0123456789abcdef0", false},
		{"-123456789abcdef0123456789abcdef", false},
	}
	for _, tt := range tests {
		if got := ValidClusterID(tt.id); got != tt.want {
			t.Errorf("ValidClusterID(%q) = %v, want %v", tt.id, got, tt.want)
		}
	}
}

// TestClusterIDSetOnce: the first config write with an identity sets it;
// a later write without one keeps it; a write with another is refused and
// changes nothing; a malformed one is refused naming the key.
func TestClusterIDSetOnce(t *testing.T) {
	const id, other = "0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210"
	set := func(f *FSM, index uint64, c *llmgwv1.ClusterConfig) error {
		t.Helper()
		_, err := f.Apply(index, mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_SET_CLUSTER_CONFIG, &llmgwv1.SetClusterConfigCommand{Config: c}))
		return err
	}
	f := New(Config{})
	var verr *ValidationError
	if err := set(f, 1, &llmgwv1.ClusterConfig{ClusterId: "NOT-HEX"}); !errors.As(err, &verr) || verr.Field != "cluster_id" {
		t.Fatalf("malformed id: got %v, want a validation error naming cluster_id", err)
	}
	if got := f.Config().GetClusterId(); got != "" {
		t.Fatalf("a refused write set the id to %q", got)
	}
	if err := set(f, 2, &llmgwv1.ClusterConfig{ClusterId: id}); err != nil {
		t.Fatal(err)
	}
	if err := set(f, 3, &llmgwv1.ClusterConfig{DefaultBlockSize: 16}); err != nil {
		t.Fatal(err)
	}
	if got := f.Config().GetClusterId(); got != id {
		t.Fatalf("after a write without an id: %q, want %q kept", got, id)
	}
	if err := set(f, 4, &llmgwv1.ClusterConfig{ClusterId: other}); !errors.As(err, &verr) || verr.Field != "cluster_id" {
		t.Fatalf("another id: got %v, want a validation error naming cluster_id", err)
	}
	if got := f.Config(); got.GetClusterId() != id || got.GetDefaultBlockSize() != 16 {
		t.Fatalf("a refused write changed the config: %v", got)
	}
}

// TestRestoreKeepsClusterID: a restore into a cluster that has an identity
// keeps it, whatever the snapshot holds; an empty FSM (a server starting)
// takes the snapshot's.
func TestRestoreKeepsClusterID(t *testing.T) {
	const id, other = "0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210"
	snapshotOf := func(clusterID string) []byte {
		t.Helper()
		src := New(Config{})
		if _, err := src.Apply(1, mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_SET_CLUSTER_CONFIG, &llmgwv1.SetClusterConfigCommand{Config: &llmgwv1.ClusterConfig{ClusterId: clusterID, DefaultBlockSize: 32}})); err != nil {
			t.Fatal(err)
		}
		b, err := src.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tests := []struct {
		name, held, snapshot, want string
	}{
		{"empty FSM takes the snapshot's", "", other, other},
		{"another cluster's backup keeps ours", id, other, id},
		{"a backup from before identities keeps ours", id, "", id},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := New(Config{})
			if tt.held != "" {
				if _, err := f.Apply(1, mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_SET_CLUSTER_CONFIG, &llmgwv1.SetClusterConfigCommand{Config: &llmgwv1.ClusterConfig{ClusterId: tt.held}})); err != nil {
					t.Fatal(err)
				}
			}
			var snap []byte
			if tt.snapshot != "" {
				snap = snapshotOf(tt.snapshot)
			} else {
				src := New(Config{})
				if _, err := src.Apply(1, mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_SET_CLUSTER_CONFIG, &llmgwv1.SetClusterConfigCommand{Config: &llmgwv1.ClusterConfig{DefaultBlockSize: 32}})); err != nil {
					t.Fatal(err)
				}
				snap, _ = src.Snapshot()
			}
			if err := f.Restore(snap); err != nil {
				t.Fatal(err)
			}
			if got := f.Config(); got.GetClusterId() != tt.want || got.GetDefaultBlockSize() != 32 {
				t.Fatalf("after restore: %v; want cluster id %s and the snapshot's other settings", got, tt.want)
			}
		})
	}
}
