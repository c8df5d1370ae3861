//go:build llmgw_upgrade_old

package fsm

import llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"

// NodeLabelsVersion is empty in the "old" build: it predates the command.
const NodeLabelsVersion = ""

// ServerRemovedVersion is empty in the "old" build: it predates the
// command.
const ServerRemovedVersion = ""

// APIKeysVersion is empty in the "old" build: it predates the commands.
const APIKeysVersion = ""

// TenantsVersion is empty in the "old" build: it predates the commands.
const TenantsVersion = ""

// gatedCommands is empty in the "old" build (tag llmgw_upgrade_old): this
// tree as the release before any gated command existed. A
// SET_NODE_LABELS, SET_SERVER_REMOVED, PUT_API_KEY, DELETE_API_KEY or
// SET_API_KEYS_REQUIRED entry, one of tenants (PUT_TENANT,
// DELETE_TENANT, SET_API_KEY_TENANT, RECORD_USAGE), of elastic capacity
// (SET_MODEL_SCALE, SET_REPLICA_SLEEPING) or of model aliases (PUT_ALIAS,
// DELETE_ALIAS), stops it loudly, as an unknown command must.
var gatedCommands = map[llmgwv1.CommandType]gatedCommand{}
