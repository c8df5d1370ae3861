//go:build llmgw_upgrade_old

package fsm

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestKnownSetOld: the "old" build (-tags llmgw_upgrade_old) does not know
// SET_NODE_LABELS, cannot propose it, and stops on meeting one.
func TestKnownSetOld(t *testing.T) {
	typ := llmgwv1.CommandType_COMMAND_TYPE_SET_NODE_LABELS
	if Known(typ) || Introduced(typ) != "" || CommandVersion(typ) != 0 {
		t.Fatalf("old build knows %s", typ)
	}
	if !Known(llmgwv1.CommandType_COMMAND_TYPE_UPSERT_MODEL) {
		t.Fatal("old build does not know UPSERT_MODEL")
	}
	if _, err := NewCommand(typ, &llmgwv1.SetNodeLabelsCommand{Id: "n1"}); !errors.Is(err, ErrUnknownCommand) {
		t.Fatalf("NewCommand: %v, want ErrUnknownCommand", err)
	}
	// The entry a new leader would write.
	p, _ := proto.Marshal(&llmgwv1.SetNodeLabelsCommand{Id: "n1", Set: map[string]string{"a": "1"}})
	b, _ := proto.Marshal(&llmgwv1.Command{Type: typ, Version: 1, Payload: p})
	f := New(Config{})
	if _, err := f.Apply(1, b); !IsFatal(err) {
		t.Fatalf("Apply: %v, want a fatal unknown command", err)
	}
}
