package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// adminGated is admin for a command whose write is of a type behind the
// minimum-version gate (design §13.3): the first such write after an
// upgrade commits the release as the cluster's minimum version, and from
// then on a server below it cannot join or restart in the cluster, so a
// downgrade is no longer possible. That happens quietly on the server; the
// operator reads it here, on stderr (stdout stays the command's output),
// when the write succeeded and the cluster's minimum version was below the
// release before it.
func (c *cli) adminGated(cmd *cobra.Command, t llmgwv1.CommandType, fn func(context.Context, llmgwv1.AdminServiceClient) error) error {
	return c.admin(cmd.Context(), func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
		note := gateNote(ctx, a, t, cmd.CommandPath())
		if err := fn(ctx, a); err != nil {
			return err
		}
		if note != "" {
			fmt.Fprintln(cmd.ErrOrStderr(), note)
		}
		return nil
	})
}

// gateNote is what to tell the operator after a write of type t, named by
// the command path: "" when t is not gated, or the cluster already admits
// it, or its minimum version cannot be read (the write says the rest).
func gateNote(ctx context.Context, a llmgwv1.AdminServiceClient, t llmgwv1.CommandType, what string) string {
	want := fsm.Introduced(t)
	if want == "" {
		return ""
	}
	st, err := a.ClusterStatus(ctx, &llmgwv1.ClusterStatusRequest{})
	if err != nil {
		return ""
	}
	if fsm.Admitted(t, st.GetMinVersion()) {
		return ""
	}
	return fmt.Sprintf("llmgwctl: note: %s is new in %s (%s): this write set the cluster's minimum version to %s (it was %s), "+
		"so a server older than %s can no longer join or restart in this cluster, and a downgrade below %s is no longer possible "+
		"(docs/operations.md, \"Rolling upgrade\")", what, want, t, want, orDash(st.GetMinVersion()), want, want)
}
