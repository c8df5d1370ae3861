package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// newDevCmd is a placeholder replaced by the dev component's wiring.
func newDevCmd() *cobra.Command {
	return &cobra.Command{
		Use: "dev",
		RunE: func(*cobra.Command, []string) error {
			return errors.New("dev: not built yet")
		},
	}
}
