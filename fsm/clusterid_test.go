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
