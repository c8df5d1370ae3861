package controlplane

import (
	"github.com/llmgw/llmgw/chunking"
	"github.com/llmgw/llmgw/controlplane/limits"
	"github.com/llmgw/llmgw/controlplane/service/agent"
	"github.com/llmgw/llmgw/controlplane/snapfile"
	"github.com/llmgw/llmgw/internal/configfile"
)

// LimitsConfig bounds what a peer can make this node hold (design §11
// "Limits", docs/operations.md "Limits"): gRPC message sizes and streams,
// streams per caller, and each agent session's reports. Its keys sit at the
// top level of the config file.
type LimitsConfig struct {
	// GRPCMaxRecvBytes bounds one message received. The largest a peer
	// legitimately sends is an agent's full copy (statuses plus its
	// replicas' KV block sets); 4 MiB, gRPC's own default, holds some
	// 400 k KV hashes. Each message received costs about five times its
	// size on the heap while it is decoded, per concurrent session.
	GRPCMaxRecvBytes int `yaml:"grpc_max_recv_bytes"`
	// GRPCMaxSendBytes bounds one message sent: the largest is a watch
	// stream's full copy of one node's reports or a DesiredReplicas, both
	// bounded by the per-session limits below to well under it. Clients
	// accept up to chunking.MaxMessageBytes, which bounds it.
	GRPCMaxSendBytes int `yaml:"grpc_max_send_bytes"`
	// GRPCMaxStreamsPerConn bounds concurrent streams on one connection;
	// a client holds a few, a peer server forwarding calls some hundreds
	// at most.
	GRPCMaxStreamsPerConn uint32 `yaml:"grpc_max_streams_per_conn"`

	// Concurrent streams per caller (package limits): by certificate
	// identity, and for plain-text callers by IP address.
	MaxWatchStreamsPerIdentity  int `yaml:"max_watch_streams_per_identity"`
	MaxAgentSessionsPerIdentity int `yaml:"max_agent_sessions_per_identity"`
	MaxWatchStreamsPerAddress   int `yaml:"max_watch_streams_per_address"`
	MaxAgentSessionsPerAddress  int `yaml:"max_agent_sessions_per_address"`

	// What one agent session may make this node hold (package agent,
	// design §5.4): statuses for at most its node's desired replicas plus
	// AgentReplicaSlack (replicas it still runs, or was just given),
	// AgentAdaptersPerReplica adapter statuses for each,
	// AgentKVBlocksPerReplica KV hashes for each desired replica (a
	// replica's cache, host-memory offload included: 2 Mi blocks of 16
	// tokens are 32 M tokens; a server holds some 38 bytes a hash), and no
	// status over AgentMaxStatusBytes. A session past any of them is ended
	// and its reports dropped.
	AgentReplicaSlack       int `yaml:"agent_replica_slack"`
	AgentAdaptersPerReplica int `yaml:"agent_adapters_per_replica"`
	AgentKVBlocksPerReplica int `yaml:"agent_kv_blocks_per_replica"`
	AgentMaxStatusBytes     int `yaml:"agent_max_status_bytes"`

	// EphemeralChunkBytes is the chunk budget of ephemeral updates (design
	// §5.4 "Chunks"): an update larger than it — a node's full copy with
	// its KV block sets — travels agent → server, server → server and
	// server → router as chunks of at most this size, so no message grows
	// with the fleet. Peers of an earlier release get whole updates.
	// At most half of grpc_max_recv_bytes: a chunk may pass its budget
	// by one status (agent_max_status_bytes) and its framing.
	EphemeralChunkBytes int `yaml:"ephemeral_chunk_bytes"`

	// SnapshotRestoreMaxBytes bounds a restored file's body, checked
	// against the header's declared length before the body is read.
	SnapshotRestoreMaxBytes int `yaml:"snapshot_restore_max_bytes"`

	// Listeners bounds the connections of the node's listeners
	// (listeners.go).
	Listeners ListenerLimits `yaml:",inline"`
}

// DefaultLimits are the limits' defaults; docs/operations.md gives the
// reason for each.
func DefaultLimits() LimitsConfig {
	return LimitsConfig{
		GRPCMaxRecvBytes:      4 << 20,
		GRPCMaxSendBytes:      64 << 20,
		GRPCMaxStreamsPerConn: 1024,

		MaxWatchStreamsPerIdentity:  64,
		MaxAgentSessionsPerIdentity: 4,
		MaxWatchStreamsPerAddress:   256,
		MaxAgentSessionsPerAddress:  64,

		AgentReplicaSlack:       8,
		AgentAdaptersPerReplica: 64,
		AgentKVBlocksPerReplica: 2 << 20,
		AgentMaxStatusBytes:     64 << 10,

		EphemeralChunkBytes: 1 << 20,

		SnapshotRestoreMaxBytes: snapfile.MaxBody,

		Listeners: DefaultListenerLimits(),
	}
}

// limiterConfig is the per-caller caps, each naming its setting.
func (c LimitsConfig) limiterConfig() limits.Config {
	return limits.Config{
		PerIdentity: map[limits.Kind]limits.Cap{
			limits.Watch:  {Max: c.MaxWatchStreamsPerIdentity, Setting: configfile.Flag("max-watch-streams-per-identity")},
			limits.Attach: {Max: c.MaxAgentSessionsPerIdentity, Setting: configfile.Flag("max-agent-sessions-per-identity")},
		},
		PerAddress: map[limits.Kind]limits.Cap{
			limits.Watch:  {Max: c.MaxWatchStreamsPerAddress, Setting: "max_watch_streams_per_address"},
			limits.Attach: {Max: c.MaxAgentSessionsPerAddress, Setting: "max_agent_sessions_per_address"},
		},
	}
}

// agentBounds is what one agent session may make this node hold.
func (c LimitsConfig) agentBounds() agent.Bounds {
	return agent.Bounds{ReplicaSlack: c.AgentReplicaSlack, AdaptersPerReplica: c.AgentAdaptersPerReplica,
		KVBlocksPerReplica: c.AgentKVBlocksPerReplica, MaxStatusBytes: c.AgentMaxStatusBytes}
}

// validate adds c's problems to p.
func (c LimitsConfig) validate(p *configfile.Problems) {
	for _, v := range []struct {
		setting string
		v, min  int
	}{
		{configfile.Flag("grpc-max-recv-bytes"), c.GRPCMaxRecvBytes, 64 << 10},
		{configfile.Flag("grpc-max-send-bytes"), c.GRPCMaxSendBytes, 64 << 10},
		{"grpc_max_streams_per_conn", int(c.GRPCMaxStreamsPerConn), 16},
		{configfile.Flag("max-watch-streams-per-identity"), c.MaxWatchStreamsPerIdentity, 1},
		{configfile.Flag("max-agent-sessions-per-identity"), c.MaxAgentSessionsPerIdentity, 1},
		{"max_watch_streams_per_address", c.MaxWatchStreamsPerAddress, 1},
		{"max_agent_sessions_per_address", c.MaxAgentSessionsPerAddress, 1},
		{"agent_replica_slack", c.AgentReplicaSlack, 0},
		{"agent_adapters_per_replica", c.AgentAdaptersPerReplica, 1},
		{"agent_kv_blocks_per_replica", c.AgentKVBlocksPerReplica, 1},
		{"agent_max_status_bytes", c.AgentMaxStatusBytes, 256},
		{"snapshot_restore_max_bytes", c.SnapshotRestoreMaxBytes, 1},
		{"ephemeral_chunk_bytes", c.EphemeralChunkBytes, 16 << 10},
	} {
		if v.v < v.min {
			p.Add(v.setting, "must be at least %d, got %d", v.min, v.v)
		}
	}
	if c.GRPCMaxSendBytes > chunking.MaxMessageBytes {
		p.Add(configfile.Flag("grpc-max-send-bytes"), "must not exceed %d, what clients accept, got %d", chunking.MaxMessageBytes, c.GRPCMaxSendBytes)
	}
	if c.GRPCMaxRecvBytes >= 64<<10 && c.EphemeralChunkBytes > c.GRPCMaxRecvBytes/2 {
		p.Add("ephemeral_chunk_bytes", "must be at most half of grpc_max_recv_bytes (%d), room for a chunk's framing and one status past its budget, got %d", c.GRPCMaxRecvBytes/2, c.EphemeralChunkBytes)
	}
	if c.SnapshotRestoreMaxBytes > snapfile.MaxBody {
		p.Add("snapshot_restore_max_bytes", "must not exceed the file format's %d, got %d", snapfile.MaxBody, c.SnapshotRestoreMaxBytes)
	}
	c.Listeners.validate(p)
}
