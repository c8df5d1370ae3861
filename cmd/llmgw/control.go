package main

import (
	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/controlplane"
)

// newControlCmd runs one control-plane node (design §2, §5). Values come from
// the defaults, then --config's YAML file, then the flags given.
func newControlCmd() *cobra.Command {
	cfg := controlplane.DefaultConfig()
	var configFile string
	cmd := &cobra.Command{
		Use:   "control",
		Short: "Run a control-plane node: Raft member and gRPC server for agents, routers and llmgwctl",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configFile != "" {
				if err := loadUnderFlags(cmd.Flags(), configFile, &cfg); err != nil {
					return err
				}
			}
			cfg.Version = version
			// There is no lease flag: the lease follows a lowered heartbeat
			// timeout at raft's own ratio, rather than fail validation.
			if cfg.LeaderLeaseTimeout > cfg.HeartbeatTimeout {
				cfg.LeaderLeaseTimeout = cfg.HeartbeatTimeout / 2
			}
			logger, err := newLogger(cmd)
			if err != nil {
				return err
			}
			srv, err := controlplane.New(cfg, logger)
			if err != nil {
				return err
			}
			ctx, stop := signalContext()
			defer stop()
			return srv.Run(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&configFile, "config", "", "YAML configuration file (keys as the flags, with underscores); flags override it")
	f.StringVar(&cfg.NodeID, "node-id", cfg.NodeID, "this server's id in Raft; stable across restarts (required)")
	f.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory for the Raft log and snapshots")
	f.StringVar(&cfg.GRPCAddr, "grpc-addr", cfg.GRPCAddr, "address for agents, routers and llmgwctl (host:port)")
	f.StringVar(&cfg.RaftAddr, "raft-addr", cfg.RaftAddr, "Raft transport address other servers reach (host:port, not a wildcard)")
	f.StringVar(&cfg.GossipAddr, "gossip-addr", cfg.GossipAddr, "memberlist address other servers --join (host:port); empty runs without gossip")
	f.StringVar(&cfg.GossipKeyFile, "gossip-key-file", cfg.GossipKeyFile, "file holding a base64 key (16, 24 or 32 bytes; llmgwctl keyring generate) that encrypts gossip; the keyring persisted in --data-dir wins over it once rotated")
	f.StringVar(&cfg.HTTPAddr, "http-addr", cfg.HTTPAddr, "address for /metrics, /healthz, /readyz and the web console /ui/ (host:port; the console over HTTPS with an admin certificate under TLS, to loopback callers without)")
	f.StringSliceVar(&cfg.ConsoleRouters, "console-router", cfg.ConsoleRouters, "a router's base URL (http://host:port) whose routing decisions the web console shows; repeatable or comma-separated")
	f.BoolVar(&cfg.Bootstrap, "bootstrap", cfg.Bootstrap, "start a single-node cluster if this node has no Raft state")
	f.IntVar(&cfg.BootstrapExpect, "bootstrap-expect", cfg.BootstrapExpect, "bootstrap once this many servers (same value on each) see each other over gossip; also the minimum quorum autopilot keeps")
	f.StringSliceVar(&cfg.Join, "join", cfg.Join, "other servers' gossip addresses, comma-separated; retried in the background until one answers")
	f.DurationVar(&cfg.ServerStabilizationTime, "server-stabilization-time", cfg.ServerStabilizationTime, "how long a new server must be healthy before autopilot makes it a voter")
	f.BoolVar(&cfg.CleanupDeadServers, "cleanup-dead-servers", cfg.CleanupDeadServers, "let autopilot remove servers gossip reports dead (never below --bootstrap-expect voters)")
	f.DurationVar(&cfg.RPCHoldTimeout, "rpc-hold-timeout", cfg.RPCHoldTimeout, "how long a write is held and retried while there is no leader, before UNAVAILABLE")
	f.DurationVar(&cfg.HeartbeatTimeout, "heartbeat-timeout", cfg.HeartbeatTimeout, "Raft heartbeat timeout")
	f.DurationVar(&cfg.ElectionTimeout, "election-timeout", cfg.ElectionTimeout, "Raft election timeout")
	f.StringVar(&cfg.TLS.CA, "tls-ca", cfg.TLS.CA, "CA certificate: with --tls-cert and --tls-key, mutual TLS on gRPC and Raft, callers authorized by their certificates' roles")
	f.StringVar(&cfg.TLS.Cert, "tls-cert", cfg.TLS.Cert, "this server's certificate (role server, named as --node-id)")
	f.StringVar(&cfg.TLS.Key, "tls-key", cfg.TLS.Key, "the key of --tls-cert")
	f.BoolVar(&cfg.Insecure, "insecure", cfg.Insecure, "allow plain-text gRPC, Raft and gossip beyond loopback (anyone who can reach them may act as any server, agent or admin)")
	traceFlags(f, &cfg.Tracing, "a span per gRPC call served or made to a peer", "this node starts", "a call's")
	traceTLSFlags(f, &cfg.Tracing)
	l := &cfg.Limits
	f.IntVar(&l.GRPCMaxRecvBytes, "grpc-max-recv-bytes", l.GRPCMaxRecvBytes, "largest gRPC message accepted (an agent's full copy is the largest legitimate one)")
	f.IntVar(&l.GRPCMaxSendBytes, "grpc-max-send-bytes", l.GRPCMaxSendBytes, "largest gRPC message sent (at most what clients accept, 64 MiB)")
	f.IntVar(&l.MaxWatchStreamsPerIdentity, "max-watch-streams-per-identity", l.MaxWatchStreamsPerIdentity, "concurrent watch streams one certificate identity may hold on this server")
	f.IntVar(&l.MaxAgentSessionsPerIdentity, "max-agent-sessions-per-identity", l.MaxAgentSessionsPerIdentity, "concurrent agent sessions one certificate identity may hold on this server")
	cmd.MarkFlagsMutuallyExclusive("bootstrap", "bootstrap-expect")
	return cmd
}
