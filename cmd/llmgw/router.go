package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// newRouterCmd is a placeholder replaced by the router component's wiring.
func newRouterCmd() *cobra.Command {
	return &cobra.Command{
		Use: "router",
		RunE: func(*cobra.Command, []string) error {
			return errors.New("router: not built yet")
		},
	}
}
