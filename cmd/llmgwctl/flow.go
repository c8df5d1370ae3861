package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// flowCmd is `flow`: the routers' flow-control queues (design §7.8) as the
// leader last heard them, summed per model and priority class, or each
// router's own with --routers.
func (c *cli) flowCmd() *cobra.Command {
	var byRouter bool
	cmd := &cobra.Command{
		Use:   "flow [--routers]",
		Short: "Show the requests the routers hold queued, per model and priority class",
		Long: "Show the routers' flow-control queues as the leader last heard them: per model and priority class, the requests queued,\n" +
			"how long the oldest has waited, and how many routers hold some. Each router reports every 250 ms and drops out\n" +
			"3 s after its last report. --routers shows each router's own queues and when it last reported.\n" +
			"-o json prints the whole status: every router's queues and their sum.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.admin(cmd.Context(), func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				st, err := a.FlowStatus(ctx, &llmgwv1.FlowStatusRequest{})
				if err != nil {
					return fmt.Errorf("flow status: %w", err)
				}
				if c.output == "json" {
					return c.printJSON(st)
				}
				if byRouter {
					return c.printFlowRouters(st, time.Now())
				}
				return c.printFlow(st)
			})
		},
	}
	cmd.Flags().BoolVar(&byRouter, "routers", false, "a row per router and queue, with when the router last reported")
	return cmd
}

// printFlow is the fleet's queues, a row per model and class (highest
// class first within a model, as the leader sorts them).
func (c *cli) printFlow(st *llmgwv1.FlowStatusResponse) error {
	if len(st.GetTotal()) == 0 {
		_, err := fmt.Fprintf(c.out, "no request queued (%d routers reporting)\n", len(st.GetRouters()))
		return err
	}
	rows := make([][]string, 0, len(st.GetTotal()))
	for _, d := range st.GetTotal() {
		rows = append(rows, []string{orDash(d.GetModel()), orDash(d.GetClass()), strconv.FormatUint(d.GetQueued(), 10),
			waitText(d.GetOldestWaitMs()), strconv.FormatUint(uint64(d.GetRouters()), 10)})
	}
	return c.printTable([]string{"MODEL", "CLASS", "QUEUED", "OLDEST", "ROUTERS"}, rows)
}

// printFlowRouters is each router's queues, a router without any on a
// line of its own; REPORTED is how long before now its report came.
func (c *cli) printFlowRouters(st *llmgwv1.FlowStatusResponse, now time.Time) error {
	if len(st.GetRouters()) == 0 {
		_, err := fmt.Fprintln(c.out, "no router reporting")
		return err
	}
	var rows [][]string
	for _, r := range st.GetRouters() {
		ago := now.Sub(time.UnixMilli(r.GetReportedUnixMs())).Round(time.Millisecond)
		reported := max(ago, 0).String() + " ago"
		if len(r.GetDepths()) == 0 {
			rows = append(rows, []string{r.GetRouter(), "-", "-", "0", "-", reported})
		}
		for _, d := range r.GetDepths() {
			rows = append(rows, []string{r.GetRouter(), orDash(d.GetModel()), orDash(d.GetClass()), strconv.FormatUint(d.GetQueued(), 10),
				waitText(d.GetOldestWaitMs()), reported})
		}
	}
	return c.printTable([]string{"ROUTER", "MODEL", "CLASS", "QUEUED", "OLDEST", "REPORTED"}, rows)
}

// waitText is a wait in milliseconds as a duration ("1.5s", "40ms").
func waitText(ms int64) string {
	return (time.Duration(max(ms, 0)) * time.Millisecond).String()
}
