package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// nodeDrainCmds are `node drain ID` and `node undrain ID` (design §5.5): a
// draining node gets no new replicas and its replicas move off one at a
// time, each replacement ready before the old one drains.
func (c *cli) nodeDrainCmds() []*cobra.Command {
	mk := func(use, short, verb string, undrain bool) *cobra.Command {
		return &cobra.Command{
			Use:   use + " ID",
			Short: short,
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				return c.admin(cmd.Context(), func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
					resp, err := a.DrainNode(ctx, &llmgwv1.DrainNodeRequest{Id: args[0], Undrain: undrain})
					if err != nil {
						return fmt.Errorf("node %s: %w", use, err)
					}
					if c.output == "json" {
						return c.printJSON(resp)
					}
					_, err = fmt.Fprintf(c.out, "node %s %s at revision %d\n", args[0], verb, resp.Revision)
					return err
				})
			},
		}
	}
	return []*cobra.Command{
		mk("drain", "Move a node's replicas off it one at a time; it gets no new ones", "draining", false),
		mk("undrain", "Make a draining node active again", "active", true),
	}
}
