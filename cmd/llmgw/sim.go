package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// newSimCmd is a placeholder replaced by the sim component's wiring.
func newSimCmd() *cobra.Command {
	return &cobra.Command{
		Use: "sim",
		RunE: func(*cobra.Command, []string) error {
			return errors.New("sim: not built yet")
		},
	}
}
