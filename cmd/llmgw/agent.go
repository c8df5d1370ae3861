package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// newAgentCmd is a placeholder replaced by the agent component's wiring.
func newAgentCmd() *cobra.Command {
	return &cobra.Command{
		Use: "agent",
		RunE: func(*cobra.Command, []string) error {
			return errors.New("agent: not built yet")
		},
	}
}
