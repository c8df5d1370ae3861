//go:build llmgw_upgrade_old

package fsm

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestKnownSetOld: the "old" build (-tags llmgw_upgrade_old) knows no
// gated command (tenants' included), cannot propose one, and stops on
// meeting one.
func TestKnownSetOld(t *testing.T) {
	if !Known(llmgwv1.CommandType_COMMAND_TYPE_UPSERT_MODEL) {
		t.Fatal("old build does not know UPSERT_MODEL")
	}
	tests := []struct {
		typ     llmgwv1.CommandType
		payload proto.Message // the entry a new leader would write
	}{
		{llmgwv1.CommandType_COMMAND_TYPE_SET_NODE_LABELS, &llmgwv1.SetNodeLabelsCommand{Id: "n1", Set: map[string]string{"a": "1"}}},
		{llmgwv1.CommandType_COMMAND_TYPE_SET_SERVER_REMOVED, &llmgwv1.SetServerRemovedCommand{ServerId: "c3", Removed: true, AtUnixNano: 1}},
		{llmgwv1.CommandType_COMMAND_TYPE_PUT_API_KEY, &llmgwv1.PutApiKeyCommand{Key: &llmgwv1.ApiKey{Name: "a", SecretSha256: make([]byte, 32)}}},
		{llmgwv1.CommandType_COMMAND_TYPE_DELETE_API_KEY, &llmgwv1.DeleteApiKeyCommand{Name: "a"}},
		{llmgwv1.CommandType_COMMAND_TYPE_SET_API_KEYS_REQUIRED, &llmgwv1.SetApiKeysRequiredCommand{Required: false}},
		{llmgwv1.CommandType_COMMAND_TYPE_PUT_TENANT, &llmgwv1.PutTenantCommand{Tenant: &llmgwv1.Tenant{Name: "team-a"}, Create: true}},
		{llmgwv1.CommandType_COMMAND_TYPE_DELETE_TENANT, &llmgwv1.DeleteTenantCommand{Name: "team-a"}},
		{llmgwv1.CommandType_COMMAND_TYPE_SET_API_KEY_TENANT, &llmgwv1.SetApiKeyTenantCommand{Name: "a", Tenant: "team-a"}},
		{llmgwv1.CommandType_COMMAND_TYPE_RECORD_USAGE, &llmgwv1.RecordUsageCommand{Router: "r1", Session: 1, Seq: 1,
			Rows: []*llmgwv1.UsageRow{{Tenant: "team-a", Model: "demo", HourUnix: 3600, Counts: &llmgwv1.UsageCounts{Requests: 1}}}}},
	}
	for _, tt := range tests {
		t.Run(tt.typ.String(), func(t *testing.T) {
			if Known(tt.typ) || Introduced(tt.typ) != "" || CommandVersion(tt.typ) != 0 || Admitted(tt.typ, "v9.0.0") {
				t.Fatalf("old build knows %s", tt.typ)
			}
			if _, err := NewCommand(tt.typ, tt.payload); !errors.Is(err, ErrUnknownCommand) {
				t.Fatalf("NewCommand: %v, want ErrUnknownCommand", err)
			}
			p, _ := proto.Marshal(tt.payload)
			b, _ := proto.Marshal(&llmgwv1.Command{Type: tt.typ, Version: 1, Payload: p})
			f := New(Config{})
			if _, err := f.Apply(1, b); !IsFatal(err) {
				t.Fatalf("Apply: %v, want a fatal unknown command", err)
			}
		})
	}
}
