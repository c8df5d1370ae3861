package main

import (
	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/controlplane"
)

// newControlCmd runs one control-plane node (plan §2, §5).
func newControlCmd() *cobra.Command {
	cfg := controlplane.DefaultConfig()
	cfg.Version = version
	cmd := &cobra.Command{
		Use:   "control",
		Short: "Run a control-plane node: Raft member and gRPC server for agents, routers and llmgwctl",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
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
	f.StringVar(&cfg.NodeID, "node-id", cfg.NodeID, "this server's id in Raft; stable across restarts (required)")
	f.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory for the Raft log and snapshots")
	f.StringVar(&cfg.GRPCAddr, "grpc-addr", cfg.GRPCAddr, "address for agents, routers and llmgwctl (host:port)")
	f.StringVar(&cfg.RaftAddr, "raft-addr", cfg.RaftAddr, "Raft transport address other servers reach (host:port, not a wildcard)")
	f.StringVar(&cfg.GossipAddr, "gossip-addr", cfg.GossipAddr, "memberlist address (host:port; used once HA lands)")
	f.StringVar(&cfg.HTTPAddr, "http-addr", cfg.HTTPAddr, "address for /metrics, /healthz and /readyz (host:port)")
	f.BoolVar(&cfg.Bootstrap, "bootstrap", cfg.Bootstrap, "start a single-node cluster if this node has no Raft state")
	f.IntVar(&cfg.BootstrapExpect, "bootstrap-expect", cfg.BootstrapExpect, "number of servers to bootstrap with (not yet supported)")
	f.StringSliceVar(&cfg.Join, "join", cfg.Join, "gossip addresses of servers to join, comma-separated (not yet supported)")
	f.DurationVar(&cfg.HeartbeatTimeout, "heartbeat-timeout", cfg.HeartbeatTimeout, "Raft heartbeat timeout")
	f.DurationVar(&cfg.ElectionTimeout, "election-timeout", cfg.ElectionTimeout, "Raft election timeout")
	cmd.MarkFlagsMutuallyExclusive("bootstrap", "bootstrap-expect")
	return cmd
}
