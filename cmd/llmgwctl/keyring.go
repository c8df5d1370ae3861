package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/controlplane/gossip"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// keyringCmd is `llmgwctl keyring list|install|use|remove|generate`: the
// gossip encryption keyring of every server (design §11), as Consul's
// `consul keyring` does it. Rotating without downtime is three steps, each
// on every server before the next: install the new key, use it, remove the
// old one. The server --addr names runs each step on every live server and
// answers for each; a step that failed anywhere exits non-zero after the
// table, naming the servers, so the operator repeats it before going on.
func (c *cli) keyringCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keyring",
		Short: "Gossip encryption keys of every server: list, install, use, remove, generate",
		Long: "Manage the keyring that encrypts gossip between control servers (--gossip-key-file).\n" +
			"Rotate without downtime: generate a key, install it, use it, then remove the old key;\n" +
			"each step must succeed on every server before the next. Keys are shown as fingerprints\n" +
			"(the first 8 bytes of their SHA-256), never themselves.",
	}
	op := func(use, short string, o llmgwv1.KeyringOp) *cobra.Command {
		return &cobra.Command{
			Use: use + " KEY", Short: short, Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				key, err := gossip.DecodeKey(args[0])
				if err != nil {
					return fmt.Errorf("keyring %s: %w", use, err)
				}
				return c.keyring(cmd.Context(), use, &llmgwv1.KeyringRequest{Op: o, Key: base64.StdEncoding.EncodeToString(key)})
			},
		}
	}
	cmd.AddCommand(
		&cobra.Command{
			Use: "list", Short: "List every server's keys (fingerprints; the primary encrypts)", Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				return c.keyring(cmd.Context(), "list", &llmgwv1.KeyringRequest{Op: llmgwv1.KeyringOp_KEYRING_OP_LIST})
			},
		},
		op("install", "Add a key on every server (they decrypt with it; gossip keeps its primary)", llmgwv1.KeyringOp_KEYRING_OP_INSTALL),
		op("use", "Make an installed key the primary on every server (the one gossip encrypts with)", llmgwv1.KeyringOp_KEYRING_OP_USE),
		op("remove", "Remove a key that is not the primary from every server", llmgwv1.KeyringOp_KEYRING_OP_REMOVE),
		&cobra.Command{
			Use: "generate", Short: "Print a new random 32-byte key, base64, for --gossip-key-file or install", Args: cobra.NoArgs,
			RunE: func(*cobra.Command, []string) error {
				k, err := gossip.GenerateKey()
				if err != nil {
					return err
				}
				if c.output == "json" {
					return c.printJSON(map[string]string{"key": k})
				}
				_, err = fmt.Fprintln(c.out, k)
				return err
			},
		},
	)
	return cmd
}

// keyring runs one operation and prints each server's keys, one row per
// key, and the server's error, if any, on a row of its own.
func (c *cli) keyring(ctx context.Context, verb string, req *llmgwv1.KeyringRequest) error {
	return c.admin(ctx, func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
		resp, err := a.Keyring(ctx, req)
		if err != nil {
			return fmt.Errorf("keyring %s: %w", verb, err)
		}
		if c.output == "json" {
			err = c.printItems(messages(resp.Servers), nil)
		} else {
			err = c.printTable([]string{"SERVER", "KEY", "PRIMARY", "ERROR"}, keyringRows(resp))
		}
		if err != nil {
			return err
		}
		return keyringFailures(verb, resp)
	})
}

func keyringRows(resp *llmgwv1.KeyringResponse) [][]string {
	var rows [][]string
	for _, s := range resp.Servers {
		if s.Error != "" || len(s.Keys) == 0 {
			rows = append(rows, []string{s.ServerId, "-", "-", orDash(s.Error)})
		}
		for _, k := range s.Keys {
			primary := ""
			if k.Primary {
				primary = "*"
			}
			rows = append(rows, []string{s.ServerId, k.Fingerprint, orDash(primary), "-"})
		}
	}
	return rows
}

// keyringFailures is the error naming the servers where the step failed,
// nil when it succeeded everywhere.
func keyringFailures(verb string, resp *llmgwv1.KeyringResponse) error {
	var failed []string
	for _, s := range resp.Servers {
		if s.Error != "" {
			failed = append(failed, s.ServerId+": "+s.Error)
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return fmt.Errorf("keyring %s failed on %d of %d servers: %s",
		verb, len(failed), len(resp.Servers), strings.Join(failed, "; "))
}
