package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// raftCmd is the Raft configuration as the leader holds it (design §5.2). Every
// call is answered by the leader, wherever --addr points, so two operators
// looking at different servers see the same peers.
func (c *cli) raftCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "raft", Short: "The Raft configuration: list peers, remove a peer, transfer leadership"}
	cmd.AddCommand(c.listPeersCmd(), c.removePeerCmd(), c.transferLeadershipCmd())
	return cmd
}

func (c *cli) listPeersCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "list-peers",
		Short: "List Raft peers with autopilot's health, contact and index",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.admin(cmd.Context(), func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				resp, err := a.ListPeers(ctx, &llmgwv1.ListPeersRequest{})
				if err != nil {
					return fmt.Errorf("raft list-peers: %w", err)
				}
				peers := append([]*llmgwv1.RaftPeer(nil), resp.Peers...)
				sort.Slice(peers, func(i, j int) bool { return peers[i].Id < peers[j].Id })
				if c.output == "json" {
					return c.printItems(messages(peers), nil)
				}
				rows := make([][]string, 0, len(peers))
				for _, p := range peers {
					rows = append(rows, []string{p.Id, p.Address, role(p), strconv.FormatBool(p.Healthy),
						contact(p.LastContactMs), strconv.FormatUint(p.LastIndex, 10),
						stableFor(p), orDash(p.Version)})
				}
				return c.printTable([]string{"ID", "ADDRESS", "ROLE", "HEALTHY", "LAST CONTACT", "LAST INDEX", "STABLE", "VERSION"}, rows)
			})
		},
	}
}

// contact is a peer's last contact for people: milliseconds while it is
// heard from, a rounded duration once it has been silent for seconds, and
// "never" when this leader has not heard from it.
func contact(ms int64) string {
	switch d := time.Duration(ms) * time.Millisecond; {
	case ms < 0:
		return "never"
	case d < 10*time.Second:
		return strconv.FormatInt(ms, 10) + "ms"
	default:
		return d.Round(time.Second).String()
	}
}

// role names a peer's place in the configuration: a non-voter is a server
// autopilot has not promoted yet (or will not, while it is unhealthy).
func role(p *llmgwv1.RaftPeer) string {
	switch {
	case p.Leader:
		return "leader"
	case p.Voter:
		return "voter"
	default:
		return "non-voter"
	}
}

// removePeerCmd removes a server from the Raft configuration, for a server
// that is dead and will not come back (autopilot does the same on its own
// once it is safe, never below the quorum the cluster was bootstrapped with).
// A server that is alive would be added back from gossip: `leave` is the verb
// for it.
func (c *cli) removePeerCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "remove-peer ID",
		Short: "Remove a dead server from the Raft configuration",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := strings.TrimSpace(args[0])
			if id == "" {
				return errors.New("raft remove-peer: ID: a server id is required")
			}
			return c.adminGated(cmd, llmgwv1.CommandType_COMMAND_TYPE_SET_SERVER_REMOVED, func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				resp, err := a.RemovePeer(ctx, &llmgwv1.RemovePeerRequest{Id: id})
				if err != nil {
					return fmt.Errorf("raft remove-peer %s: %w", id, err)
				}
				if c.output == "json" {
					return c.printJSON(resp)
				}
				_, err = fmt.Fprintf(c.out, "removed peer %s from the Raft configuration\n", id)
				return err
			})
		},
	}
}

// transferLeadershipCmd hands leadership to another voter: a planned move
// costs tens of milliseconds of writes where a crash costs an election
// (design §13.3), so upgrades and maintenance start with it.
func (c *cli) transferLeadershipCmd() *cobra.Command {
	var to string
	cmd := &cobra.Command{
		Use:   "transfer-leadership [--to ID]",
		Short: "Hand Raft leadership to another voter (--to names it; otherwise Raft chooses)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.admin(cmd.Context(), func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				resp, err := a.TransferLeadership(ctx, &llmgwv1.TransferLeadershipRequest{To: strings.TrimSpace(to)})
				if err != nil {
					return fmt.Errorf("raft transfer-leadership: %w", err)
				}
				if c.output == "json" {
					return c.printJSON(resp)
				}
				_, err = fmt.Fprintf(c.out, "leadership transferred to %s\n", orDash(resp.Leader))
				return err
			})
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "id of the voter to hand leadership to")
	return cmd
}

// stableFor is how long a peer has been stable, "-" while it is not
// healthy (autopilot's 0, which is no duration).
func stableFor(p *llmgwv1.RaftPeer) string {
	if !p.Healthy {
		return "-"
	}
	return (time.Duration(p.StableSeconds) * time.Second).String()
}
