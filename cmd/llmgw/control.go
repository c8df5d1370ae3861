package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// newControlCmd is a placeholder replaced by the control component's wiring.
func newControlCmd() *cobra.Command {
	return &cobra.Command{
		Use: "control",
		RunE: func(*cobra.Command, []string) error {
			return errors.New("control: not built yet")
		},
	}
}
