//go:build !llmgw_upgrade_old

package fsm

import (
	"errors"
	"testing"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestKnownSetNew: this build knows SET_NODE_LABELS and
// SET_SERVER_REMOVED, introduced in NodeLabelsVersion and
// ServerRemovedVersion, and tenants' four commands, in TenantsVersion;
// every older type needs no version.
func TestKnownSetNew(t *testing.T) {
	tests := []struct {
		typ        llmgwv1.CommandType
		known      bool
		introduced string
	}{
		{llmgwv1.CommandType_COMMAND_TYPE_UPSERT_MODEL, true, ""},
		{llmgwv1.CommandType_COMMAND_TYPE_SET_ADAPTER_PLACEMENT, true, ""},
		{llmgwv1.CommandType_COMMAND_TYPE_SET_NODE_LABELS, true, "v0.2.0"},
		{llmgwv1.CommandType_COMMAND_TYPE_SET_SERVER_REMOVED, true, "v0.2.0"},
		{llmgwv1.CommandType_COMMAND_TYPE_PUT_TENANT, true, "v0.2.0"},
		{llmgwv1.CommandType_COMMAND_TYPE_DELETE_TENANT, true, "v0.2.0"},
		{llmgwv1.CommandType_COMMAND_TYPE_SET_API_KEY_TENANT, true, "v0.2.0"},
		{llmgwv1.CommandType_COMMAND_TYPE_RECORD_USAGE, true, "v0.2.0"},
		{llmgwv1.CommandType_COMMAND_TYPE_UNSPECIFIED, false, ""},
		{llmgwv1.CommandType(999), false, ""},
	}
	for _, tt := range tests {
		if got := Known(tt.typ); got != tt.known {
			t.Errorf("Known(%s) = %v, want %v", tt.typ, got, tt.known)
		}
		if got := Introduced(tt.typ); got != tt.introduced {
			t.Errorf("Introduced(%s) = %q, want %q", tt.typ, got, tt.introduced)
		}
	}
}

// TestAdmitted: a gated command is admitted once the committed minimum
// version reaches the release that introduced it; an ungated one always;
// an unknown one never.
func TestAdmitted(t *testing.T) {
	labels, removed := llmgwv1.CommandType_COMMAND_TYPE_SET_NODE_LABELS, llmgwv1.CommandType_COMMAND_TYPE_SET_SERVER_REMOVED
	usage := llmgwv1.CommandType_COMMAND_TYPE_RECORD_USAGE
	tests := []struct {
		typ  llmgwv1.CommandType
		min  string
		want bool
	}{
		{llmgwv1.CommandType_COMMAND_TYPE_UPSERT_MODEL, "", true},
		{removed, "", false},
		{removed, "v0.1.0", false},
		{removed, ServerRemovedVersion, true},
		{removed, "v0.3.0", true},
		{labels, NodeLabelsVersion, true},
		{usage, "", false},
		{usage, "v0.1.0", false},
		{usage, TenantsVersion, true},
		{usage, "v0.3.0", true},
		{llmgwv1.CommandType(999), "v9.0.0", false},
	}
	for _, tt := range tests {
		if got := Admitted(tt.typ, tt.min); got != tt.want {
			t.Errorf("Admitted(%s, %q) = %v, want %v", tt.typ, tt.min, got, tt.want)
		}
	}
}

func TestSetNodeLabels(t *testing.T) {
	labels := func(id string, set map[string]string, remove ...string) []byte {
		return mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_SET_NODE_LABELS, &llmgwv1.SetNodeLabelsCommand{Id: id, Set: set, Remove: remove})
	}
	tests := []struct {
		name    string
		cmds    [][]byte
		want    map[string]string
		invalid string
		err     error
	}{
		{name: "set and remove", cmds: [][]byte{labels("n1", map[string]string{"zone": "b", "gpu": "h100"}), labels("n1", nil, "zone")}, want: map[string]string{"gpu": "h100", "rack": "1"}},
		{name: "survives re-registration", cmds: [][]byte{labels("n1", map[string]string{"zone": "b"}), registerLabeled(t, "n1", map[string]string{"zone": "agent"})}, want: map[string]string{"zone": "b", "rack": "1"}},
		{name: "unknown node", cmds: [][]byte{labels("n9", map[string]string{"a": "1"})}, err: ErrNotFound},
		{name: "set and remove one key", cmds: [][]byte{labels("n1", map[string]string{"a": "1"}, "a")}, invalid: "remove"},
		{name: "bad key", cmds: [][]byte{labels("n1", map[string]string{"a=b": "1"})}, invalid: `labels["a=b"]`},
		{name: "nothing to do", cmds: [][]byte{labels("n1", nil)}, invalid: "labels"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := New(Config{})
			if _, err := f.Apply(1, registerLabeled(t, "n1", map[string]string{"rack": "1"})); err != nil {
				t.Fatal(err)
			}
			var err error
			for i, c := range tt.cmds {
				if _, err = f.Apply(uint64(i+2), c); err != nil {
					break
				}
			}
			var ve *ValidationError
			switch {
			case tt.invalid != "":
				if !errors.As(err, &ve) || ve.Field != tt.invalid {
					t.Fatalf("err = %v, want a validation error on %s", err, tt.invalid)
				}
				return
			case tt.err != nil:
				if !errors.Is(err, tt.err) {
					t.Fatalf("err = %v, want %v", err, tt.err)
				}
				return
			case err != nil:
				t.Fatal(err)
			}
			n, _ := f.Node("n1")
			if !n.LabelsByOperator || len(n.Labels) != len(tt.want) {
				t.Fatalf("labels %v (by operator %v), want %v", n.Labels, n.LabelsByOperator, tt.want)
			}
			for k, v := range tt.want {
				if n.Labels[k] != v {
					t.Fatalf("labels %v, want %v", n.Labels, tt.want)
				}
			}
		})
	}
}

func registerLabeled(t testing.TB, id string, labels map[string]string) []byte {
	return mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_REGISTER_NODE, &llmgwv1.RegisterNodeCommand{Node: &llmgwv1.Node{Id: id, Address: "127.0.0.1", Gpus: 1, Labels: labels}})
}
