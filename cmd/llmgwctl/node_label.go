package main

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// parseLabelArgs reads `key=value` (set) and `key-` (remove) arguments, as
// kubectl label does, and checks them with the FSM's own rules.
func parseLabelArgs(id string, args []string) (map[string]string, []string, error) {
	set := map[string]string{}
	var remove []string
	for _, a := range args {
		if k, v, ok := strings.Cut(a, "="); ok {
			if _, dup := set[k]; dup {
				return nil, nil, fmt.Errorf("label %q given twice", k)
			}
			set[k] = v
			continue
		}
		if k, ok := strings.CutSuffix(a, "-"); ok {
			remove = append(remove, k)
			continue
		}
		return nil, nil, fmt.Errorf("label %q: want key=value to set or key- to remove", a)
	}
	if err := fsm.ValidateNodeLabels(id, set, remove); err != nil {
		return nil, nil, err
	}
	return set, remove, nil
}

// nodeLabelCmd is `node label ID key=value ... key- ...`: an operator
// relabels a node without restarting its agent. Its labels are the
// operator's from then on. The command is new in fsm.NodeLabelsVersion and
// refused until every control server runs it (design §13.3).
func (c *cli) nodeLabelCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "label ID key=value... [key-...]",
		Short: "Set (key=value) or remove (key-) a node's labels; they then stay the operator's",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			set, remove, err := parseLabelArgs(args[0], args[1:])
			if err != nil {
				return fmt.Errorf("node label: %w", err)
			}
			return c.adminGated(cmd, llmgwv1.CommandType_COMMAND_TYPE_SET_NODE_LABELS, func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				resp, err := a.SetNodeLabels(ctx, &llmgwv1.SetNodeLabelsRequest{Id: args[0], Set: set, Remove: remove})
				if err != nil {
					return fmt.Errorf("node label %s: %w", args[0], err)
				}
				if c.output == "json" {
					return c.printJSON(resp)
				}
				kv := make([]string, 0, len(resp.Node.GetLabels()))
				for k, v := range resp.Node.GetLabels() {
					kv = append(kv, k+"="+v)
				}
				sort.Strings(kv)
				_, err = fmt.Fprintf(c.out, "node %s labels %s at revision %d\n", args[0], orDash(strings.Join(kv, ",")), resp.Revision)
				return err
			})
		},
	}
}
