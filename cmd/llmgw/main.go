// Command llmgw is the one server binary (design §2): control, agent, router,
// sim and dev are its subcommands, so install and upgrade are one file.
// This package is wiring only.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	root := &cobra.Command{
		Use:           "llmgw",
		Short:         "A self-hosted gateway for serving LLMs on a GPU fleet",
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().String("log-level", "info", "log level: debug, info, warn, error")
	root.PersistentFlags().String("log-format", "text", "log format: text or json")
	root.AddCommand(newControlCmd(), newAgentCmd(), newRouterCmd(), newSimCmd(), newDevCmd())
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "llmgw:", err)
		os.Exit(1)
	}
}

// newLogger builds the process's logger from the persistent flags. Every
// component receives it injected; nothing logs through a global.
func newLogger(cmd *cobra.Command) (*slog.Logger, error) {
	levelName, _ := cmd.Flags().GetString("log-level")
	format, _ := cmd.Flags().GetString("log-format")
	var level slog.Level
	if err := level.UnmarshalText([]byte(levelName)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	default:
		return nil, fmt.Errorf("--log-format: %q is neither text nor json", format)
	}
}

// signalContext is cancelled on SIGINT or SIGTERM: the one way every
// long-running subcommand is asked to stop.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}
