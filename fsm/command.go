package fsm

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// commandVersions is the payload schema version this build writes and
// understands for each command type. A type introduced (or changed) in a
// later version is proposed only once every server knows it (design §13.3);
// until then an older server that meets it stops rather than guess.
var commandVersions = map[llmgwv1.CommandType]uint32{
	llmgwv1.CommandType_COMMAND_TYPE_UPSERT_MODEL:         1,
	llmgwv1.CommandType_COMMAND_TYPE_DELETE_MODEL:         1,
	llmgwv1.CommandType_COMMAND_TYPE_REGISTER_NODE:        1,
	llmgwv1.CommandType_COMMAND_TYPE_SET_NODE_STATE:       1,
	llmgwv1.CommandType_COMMAND_TYPE_PLACE_REPLICA:        1,
	llmgwv1.CommandType_COMMAND_TYPE_REMOVE_REPLICA:       1,
	llmgwv1.CommandType_COMMAND_TYPE_SET_CLUSTER_CONFIG:   1,
	llmgwv1.CommandType_COMMAND_TYPE_SET_REPLICA_DRAINING: 1,
	// New with LoRA adapters (design §7.6): a server without it stops at the
	// first one, so it is proposed only after a cluster upgrade (§13.3).
	llmgwv1.CommandType_COMMAND_TYPE_SET_ADAPTER_PLACEMENT: 1,
}

// CommandVersion returns the version this build writes for t, or 0 when it
// does not know t.
func CommandVersion(t llmgwv1.CommandType) uint32 {
	v, _ := knownCommand(t)
	return v
}

// NewCommand encodes one Raft log entry: the envelope {type, version,
// payload} around payload. The payload must be the message type belongs to;
// a mismatch is caught here, on the proposer, rather than on every node.
func NewCommand(t llmgwv1.CommandType, payload proto.Message) ([]byte, error) {
	v, ok := knownCommand(t)
	if !ok {
		return nil, fmt.Errorf("encode command: %w", &UnknownCommandError{Type: t})
	}
	if want := payloadFor(t); want.ProtoReflect().Descriptor().FullName() != payload.ProtoReflect().Descriptor().FullName() {
		return nil, fmt.Errorf("encode command %s: payload is %s, want %s", t, payload.ProtoReflect().Descriptor().FullName(), want.ProtoReflect().Descriptor().FullName())
	}
	return encodeEnvelope(&llmgwv1.Command{Type: t, Version: v}, payload)
}

// NewIgnorableCommand is NewCommand for a command older servers may skip
// without diverging (it only adds information they would not use).
func NewIgnorableCommand(t llmgwv1.CommandType, version uint32, payload proto.Message) ([]byte, error) {
	return encodeEnvelope(&llmgwv1.Command{Type: t, Version: version, Ignorable: true}, payload)
}

func encodeEnvelope(c *llmgwv1.Command, payload proto.Message) ([]byte, error) {
	det := proto.MarshalOptions{Deterministic: true}
	p, err := det.Marshal(payload)
	if err != nil {
		return nil, fmt.Errorf("encode command %s payload: %w", c.Type, err)
	}
	c.Payload = p
	b, err := det.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encode command %s: %w", c.Type, err)
	}
	return b, nil
}

// payloadFor returns an empty payload message for a known type, nil otherwise.
func payloadFor(t llmgwv1.CommandType) proto.Message {
	switch t {
	case llmgwv1.CommandType_COMMAND_TYPE_UPSERT_MODEL:
		return &llmgwv1.UpsertModelCommand{}
	case llmgwv1.CommandType_COMMAND_TYPE_DELETE_MODEL:
		return &llmgwv1.DeleteModelCommand{}
	case llmgwv1.CommandType_COMMAND_TYPE_REGISTER_NODE:
		return &llmgwv1.RegisterNodeCommand{}
	case llmgwv1.CommandType_COMMAND_TYPE_SET_NODE_STATE:
		return &llmgwv1.SetNodeStateCommand{}
	case llmgwv1.CommandType_COMMAND_TYPE_PLACE_REPLICA:
		return &llmgwv1.PlaceReplicaCommand{}
	case llmgwv1.CommandType_COMMAND_TYPE_REMOVE_REPLICA:
		return &llmgwv1.RemoveReplicaCommand{}
	case llmgwv1.CommandType_COMMAND_TYPE_SET_CLUSTER_CONFIG:
		return &llmgwv1.SetClusterConfigCommand{}
	case llmgwv1.CommandType_COMMAND_TYPE_SET_REPLICA_DRAINING:
		return &llmgwv1.SetReplicaDrainingCommand{}
	case llmgwv1.CommandType_COMMAND_TYPE_SET_ADAPTER_PLACEMENT:
		return &llmgwv1.SetAdapterPlacementCommand{}
	case llmgwv1.CommandType_COMMAND_TYPE_SET_NODE_LABELS:
		return &llmgwv1.SetNodeLabelsCommand{}
	case llmgwv1.CommandType_COMMAND_TYPE_SET_SERVER_REMOVED:
		return &llmgwv1.SetServerRemovedCommand{}
	case llmgwv1.CommandType_COMMAND_TYPE_PUT_API_KEY:
		return &llmgwv1.PutApiKeyCommand{}
	case llmgwv1.CommandType_COMMAND_TYPE_DELETE_API_KEY:
		return &llmgwv1.DeleteApiKeyCommand{}
	case llmgwv1.CommandType_COMMAND_TYPE_SET_API_KEYS_REQUIRED:
		return &llmgwv1.SetApiKeysRequiredCommand{}
	case llmgwv1.CommandType_COMMAND_TYPE_PUT_TENANT:
		return &llmgwv1.PutTenantCommand{}
	case llmgwv1.CommandType_COMMAND_TYPE_DELETE_TENANT:
		return &llmgwv1.DeleteTenantCommand{}
	case llmgwv1.CommandType_COMMAND_TYPE_SET_API_KEY_TENANT:
		return &llmgwv1.SetApiKeyTenantCommand{}
	case llmgwv1.CommandType_COMMAND_TYPE_RECORD_USAGE:
		return &llmgwv1.RecordUsageCommand{}
	case llmgwv1.CommandType_COMMAND_TYPE_SET_MODEL_SCALE:
		return &llmgwv1.SetModelScaleCommand{}
	case llmgwv1.CommandType_COMMAND_TYPE_SET_REPLICA_SLEEPING:
		return &llmgwv1.SetReplicaSleepingCommand{}
	case llmgwv1.CommandType_COMMAND_TYPE_PUT_ALIAS:
		return &llmgwv1.PutAliasCommand{}
	case llmgwv1.CommandType_COMMAND_TYPE_DELETE_ALIAS:
		return &llmgwv1.DeleteAliasCommand{}
	}
	return &llmgwv1.Command{} // never a payload; only for the descriptor check
}
