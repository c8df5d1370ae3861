package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// joinCmd is `llmgwctl join ADDR...` and `llmgwctl server join ADDR...`: the
// server --addr names joins the gossip pool through the given gossip
// addresses (design §5.2). Raft membership follows gossip, so the joined server
// becomes a non-voter at once and a voter when autopilot finds it stable;
// this command does not wait for either.
func (c *cli) joinCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "join GOSSIP_ADDR...",
		Short: "Make the server at --addr join a cluster through servers' gossip addresses",
		Long: "Make the server at --addr join the cluster that the given gossip addresses (host:port) belong to.\n" +
			"It becomes a Raft non-voter, promoted to voter by autopilot once stable.",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			addrs, err := gossipAddrs(args)
			if err != nil {
				return err
			}
			return c.admin(cmd.Context(), func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				resp, err := a.Join(ctx, &llmgwv1.JoinRequest{GossipAddrs: addrs})
				if err != nil {
					return fmt.Errorf("join: %w", err)
				}
				// A server that answers without error but reached nobody has
				// not joined anything; say so rather than print success.
				if resp.Joined == 0 {
					return fmt.Errorf("join: none of %s answered", strings.Join(addrs, ", "))
				}
				if c.output == "json" {
					return c.printJSON(resp)
				}
				_, err = fmt.Fprintf(c.out, "joined through %d of %d address(es); autopilot promotes the server to voter once it is stable\n",
					resp.Joined, len(addrs))
				return err
			})
		},
	}
}

// gossipAddrs checks each argument is host:port with a numeric port and
// accepts comma-separated lists too, as --join does on the server.
func gossipAddrs(args []string) ([]string, error) {
	var out []string
	for _, arg := range args {
		for _, a := range strings.Split(arg, ",") {
			a = strings.TrimSpace(a)
			if a == "" {
				continue
			}
			i := strings.LastIndexByte(a, ':')
			if i <= 0 {
				return nil, fmt.Errorf("join: %q is not a gossip address (host:port)", a)
			}
			if p, err := strconv.ParseUint(a[i+1:], 10, 16); err != nil || p == 0 {
				return nil, fmt.Errorf("join: %q: the port must be 1..65535", a)
			}
			out = append(out, a)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("join: at least one gossip address (host:port) is required")
	}
	return out, nil
}

// leaveCmd is `llmgwctl leave` and `llmgwctl server leave`: the server --addr
// names leaves gracefully. The server does the work (a leader hands
// leadership over first, and the server is marked as leaving so the leader
// does not add it back from gossip); the server process keeps running until
// the operator stops it.
func (c *cli) leaveCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "leave",
		Short: "Make the server at --addr leave the cluster gracefully (a leader transfers leadership first)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.adminGated(cmd, llmgwv1.CommandType_COMMAND_TYPE_SET_SERVER_REMOVED, func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				resp, err := a.Leave(ctx, &llmgwv1.LeaveRequest{})
				if err != nil {
					return fmt.Errorf("leave: %w", err)
				}
				if c.output == "json" {
					return c.printJSON(resp)
				}
				if resp.NewLeader != "" {
					_, err = fmt.Fprintf(c.out, "left the cluster; leadership transferred to %s\n", resp.NewLeader)
					return err
				}
				_, err = fmt.Fprintln(c.out, "left the cluster")
				return err
			})
		},
	}
}

// membersCmd lists the gossip pool as the server --addr names sees it. It is
// the place to look when a server is missing from `raft list-peers`: a server
// that is not alive here is never added to Raft.
func (c *cli) membersCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "members",
		Short: "List the servers in the gossip pool, as the server at --addr sees them",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.admin(cmd.Context(), func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				resp, err := a.Members(ctx, &llmgwv1.MembersRequest{})
				if err != nil {
					return fmt.Errorf("server members: %w", err)
				}
				members := append([]*llmgwv1.Member(nil), resp.Members...)
				sort.Slice(members, func(i, j int) bool { return members[i].Id < members[j].Id })
				if c.output == "json" {
					return c.printItems(messages(members), nil)
				}
				rows := make([][]string, 0, len(members))
				for _, m := range members {
					rows = append(rows, []string{m.Id, orDash(m.GossipAddr), orDash(m.GrpcAddr), orDash(m.RaftAddr),
						orDash(m.Status), orDash(m.Version), expect(m.BootstrapExpect)})
				}
				return c.printTable([]string{"ID", "GOSSIP", "GRPC", "RAFT", "STATUS", "VERSION", "EXPECT"}, rows)
			})
		},
	}
}

func expect(n int32) string {
	if n == 0 {
		return "-"
	}
	return strconv.Itoa(int(n))
}

// serverCmd groups the operators' verbs on servers (design §5.2), as Nomad's
// `server` command does; `join` and `leave` are also top-level.
func (c *cli) serverCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "server", Short: "Control-plane servers: members, join, leave"}
	cmd.AddCommand(c.membersCmd(), c.joinCmd(), c.leaveCmd())
	return cmd
}
