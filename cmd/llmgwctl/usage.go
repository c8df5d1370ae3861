package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// usageCmd is `usage`: the usage roll-up (design §7.7), per tenant ×
// model × UTC hour as the routers metered it, or summed over the period.
func (c *cli) usageCmd() *cobra.Command {
	var tenant, model, by string
	var since time.Duration
	cmd := &cobra.Command{
		Use:   "usage [--tenant T] [--model M] [--since 24h] [--by hour|total]",
		Short: "Show requests, refusals and tokens per tenant and model, by UTC hour or in total",
		Long: "Show the usage roll-up: requests admitted, refused and (shadow mode) that would have been refused, and input, cached and output tokens\n" +
			"as the engines reported them, per tenant, model and UTC hour. The anonymous tenant (requests without a key) is shown as -.\n" +
			"The routers send their figures every few seconds, so the current hour grows until it ends.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if since < 0 {
				return usage(fmt.Errorf("--since: must not be negative, got %v", since))
			}
			if by != "hour" && by != "total" {
				return usage(fmt.Errorf("--by: %q is neither hour nor total", by))
			}
			from := time.Now().Add(-since).Unix()
			return c.admin(cmd.Context(), func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				resp, err := a.Usage(ctx, &llmgwv1.UsageRequest{Tenant: tenant, Model: model, SinceUnix: from})
				if err != nil {
					return fmt.Errorf("usage: %w", err)
				}
				rows := resp.Rows
				if by == "total" {
					rows = usageTotals(rows)
				}
				if c.output == "json" {
					return c.printItems(messages(rows), nil)
				}
				return c.printUsage(rows, by == "total")
			})
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "one tenant's rows (default: every tenant)")
	cmd.Flags().StringVar(&model, "model", "", "one model's rows (default: every model)")
	cmd.Flags().DurationVar(&since, "since", 24*time.Hour, "rows of the hours from this long ago on (the hour holding that moment included); the roll-up keeps 62 days")
	cmd.Flags().StringVar(&by, "by", "hour", "hour: a row per tenant, model and UTC hour; total: a row per tenant and model over the period")
	return cmd
}

// usageTotals sums rows (sorted by tenant, model, hour) per tenant and
// model; hour_unix is 0.
func usageTotals(rows []*llmgwv1.UsageRow) []*llmgwv1.UsageRow {
	var out []*llmgwv1.UsageRow
	for _, r := range rows {
		if n := len(out); n == 0 || out[n-1].Tenant != r.Tenant || out[n-1].Model != r.Model {
			out = append(out, &llmgwv1.UsageRow{Tenant: r.Tenant, Model: r.Model, Counts: &llmgwv1.UsageCounts{}})
		}
		fsm.AddUsage(out[len(out)-1].Counts, r.GetCounts())
	}
	return out
}

// printUsage is the usage table: a row per given row, then a total line
// per tenant with more than one row.
func (c *cli) printUsage(rows []*llmgwv1.UsageRow, total bool) error {
	var out [][]string
	line := func(tenant, model, hour string, u *llmgwv1.UsageCounts) []string {
		return []string{orDash(tenant), model, hour, strconv.FormatUint(u.GetRequests(), 10), strconv.FormatUint(u.GetRefused(), 10),
			strconv.FormatUint(u.GetShadowRefused(), 10), strconv.FormatUint(u.GetInputTokens(), 10),
			strconv.FormatUint(u.GetCachedTokens(), 10), strconv.FormatUint(u.GetOutputTokens(), 10)}
	}
	for i := 0; i < len(rows); {
		j, sum := i, &llmgwv1.UsageCounts{}
		for ; j < len(rows) && rows[j].Tenant == rows[i].Tenant; j++ {
			r := rows[j]
			hour := "total"
			if !total {
				hour = time.Unix(r.HourUnix, 0).UTC().Format("2006-01-02T15Z")
			}
			out = append(out, line(r.Tenant, orDash(r.Model), hour, r.GetCounts()))
			fsm.AddUsage(sum, r.GetCounts())
		}
		if j-i > 1 {
			out = append(out, line(rows[i].Tenant, "(all)", "total", sum))
		}
		i = j
	}
	if len(out) == 0 {
		_, err := fmt.Fprintln(c.out, "no usage in the period")
		return err
	}
	return c.printTable([]string{"TENANT", "MODEL", "HOUR", "REQUESTS", "REFUSED", "SHADOW_REFUSED", "INPUT", "CACHED", "OUTPUT"}, out)
}
