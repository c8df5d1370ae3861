//go:build !llmgw_upgrade_old

package fsm

import llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"

// NodeLabelsVersion is the release that introduced SET_NODE_LABELS.
const NodeLabelsVersion = "v0.2.0"

// ServerRemovedVersion is the release that introduced SET_SERVER_REMOVED,
// the replicated removal records of control-plane servers (servers.go). It
// ships in the same release as SET_NODE_LABELS: no release separates them,
// so the "old" build, the previous release, knows neither.
const ServerRemovedVersion = "v0.2.0"

// APIKeysVersion is the release that introduced PUT_API_KEY and
// DELETE_API_KEY, the router API keys (apikeys.go). No release has been
// cut since SET_NODE_LABELS, so they ship in the same one and the "old"
// build knows none of them.
const APIKeysVersion = "v0.2.0"

// TenantsVersion is the release that introduced tenants, a key's tenant
// and the usage roll-up (tenants.go). No release has been cut since the
// keys: the "old" build knows none of them. A tenant's priority classes
// (default_class, max_class) came before that release too, so they ride
// PUT_TENANT's gate and need none of their own.
const TenantsVersion = "v0.2.0"

// gatedCommands are the command types behind the minimum-version gate. A
// build with the tag llmgw_upgrade_old leaves them out (gate_old.go): it is
// this tree as the previous release, which the upgrade test runs as the
// "old" binary (design §12, §13.3).
var gatedCommands = map[llmgwv1.CommandType]gatedCommand{
	llmgwv1.CommandType_COMMAND_TYPE_SET_NODE_LABELS:    {schema: 1, introduced: NodeLabelsVersion},
	llmgwv1.CommandType_COMMAND_TYPE_SET_SERVER_REMOVED: {schema: 1, introduced: ServerRemovedVersion},
	llmgwv1.CommandType_COMMAND_TYPE_PUT_API_KEY:        {schema: 1, introduced: APIKeysVersion},
	llmgwv1.CommandType_COMMAND_TYPE_DELETE_API_KEY:     {schema: 1, introduced: APIKeysVersion},
	// Keys required off again (issue 28): no release cut since the keys.
	llmgwv1.CommandType_COMMAND_TYPE_SET_API_KEYS_REQUIRED: {schema: 1, introduced: APIKeysVersion},
	llmgwv1.CommandType_COMMAND_TYPE_PUT_TENANT:            {schema: 1, introduced: TenantsVersion},
	llmgwv1.CommandType_COMMAND_TYPE_DELETE_TENANT:         {schema: 1, introduced: TenantsVersion},
	llmgwv1.CommandType_COMMAND_TYPE_SET_API_KEY_TENANT:    {schema: 1, introduced: TenantsVersion},
	llmgwv1.CommandType_COMMAND_TYPE_RECORD_USAGE:          {schema: 1, introduced: TenantsVersion},
	llmgwv1.CommandType_COMMAND_TYPE_SET_MODEL_SCALE:       {schema: 1, introduced: ScaleVersion},
	llmgwv1.CommandType_COMMAND_TYPE_SET_REPLICA_SLEEPING:  {schema: 1, introduced: ScaleVersion},
	// Model aliases (aliases.go): no release cut since tenants either.
	llmgwv1.CommandType_COMMAND_TYPE_PUT_ALIAS:    {schema: 1, introduced: AliasesVersion},
	llmgwv1.CommandType_COMMAND_TYPE_DELETE_ALIAS: {schema: 1, introduced: AliasesVersion},
}
