package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/controlplane/gossip"
	"github.com/llmgw/llmgw/internal/mtls"
)

// tlsInitCmd makes a whole cluster's certificates in one idempotent step:
// the CA if DIR/ca holds none, and a certificate for every name given that
// does not have one yet, each role in its own folder (DIR/server,
// DIR/agent, ...). It exists for one-shot setups — the compose cluster's
// certs container, a test bench — where a command that fails the second
// time it runs (tls ca create refuses to overwrite) would need a shell
// around it, and a FROM scratch image has none. --gossip-key-file adds the
// servers' gossip key, the cluster's other shared secret. Renewal is tls cert create,
// which replaces a pair in place.
func (c *cli) tlsInitCmd() *cobra.Command {
	names := map[mtls.Role]*[]string{}
	var dir, gossipKey string
	cmd := &cobra.Command{
		Use:   "init --dir DIR [--server N,...] [--agent N,...] [--router N,...] [--admin N,...] [--scraper N,...]",
		Short: "Create the CA and every missing certificate of a cluster (idempotent)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			tree := mtls.Tree(dir)
			created, err := tree.EnsureCA()
			if err != nil {
				return err
			}
			if created {
				fmt.Fprintf(c.out, "created %s\n", tree.Files(mtls.Identity{}).CA)
			}
			for _, role := range mtls.Roles {
				for _, name := range *names[role] {
					f, created, err := tree.Ensure(mtls.Identity{Role: role, Name: name})
					if err != nil {
						return fmt.Errorf("--%s %s: %w", role, name, err)
					}
					verb := "kept   "
					if created {
						verb = "created"
					}
					fmt.Fprintf(c.out, "%s %s\n", verb, f.Cert)
				}
			}
			if gossipKey != "" {
				if _, err := os.Stat(gossipKey); err == nil {
					fmt.Fprintf(c.out, "kept    %s\n", gossipKey)
				} else if !errors.Is(err, os.ErrNotExist) {
					return err
				} else {
					k, err := gossip.GenerateKey()
					if err != nil {
						return err
					}
					if err := os.WriteFile(gossipKey, []byte(k+"\n"), 0o600); err != nil {
						return fmt.Errorf("--gossip-key-file: %w", err)
					}
					fmt.Fprintf(c.out, "created %s\n", gossipKey)
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "directory for ca/ and one folder per role (required)")
	cmd.Flags().StringVar(&gossipKey, "gossip-key-file", "", "also write a new gossip encryption key here, if the file does not exist (for llmgw control --gossip-key-file)")
	_ = cmd.MarkFlagRequired("dir")
	for _, role := range mtls.Roles {
		names[role] = new([]string)
		cmd.Flags().StringSliceVar(names[role], string(role), nil, fmt.Sprintf("names to certify as %s (comma-separated)", strings.ToLower(string(role))))
	}
	return cmd
}
