package main

import (
	"fmt"
	"net"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/internal/mtls"
)

// tlsCmd is `tls ca create` and `tls cert create` (design §11), the shape
// of `consul tls`: a CA directory holding ca.pem and ca-key.pem, and one
// certificate per component, whose role (server, agent, router, admin, scraper) and
// name are its identity. It needs no server.
func (c *cli) tlsCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "tls", Short: "Make the CA and the role certificates of mutual TLS"}
	ca := &cobra.Command{Use: "ca", Short: "The cluster's certificate authority"}
	ca.AddCommand(c.tlsCACreateCmd())
	cert := &cobra.Command{Use: "cert", Short: "Role certificates signed by the CA"}
	cert.AddCommand(c.tlsCertCreateCmd())
	cmd.AddCommand(ca, cert, c.tlsInitCmd())
	return cmd
}

func (c *cli) tlsCACreateCmd() *cobra.Command {
	var dir string
	var days int
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a CA in --dir (ca.pem, ca-key.pem); refuses to replace one",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if days < 1 {
				return fmt.Errorf("--days: must be at least 1, got %d", days)
			}
			certPath, err := mtls.CreateCA(dir, mtls.CAOptions{Validity: time.Duration(days) * 24 * time.Hour})
			if err != nil {
				return fmt.Errorf("tls ca create: %w", err)
			}
			_, err = fmt.Fprintf(c.out, "wrote %s and %s\nkeep %s secret: whoever holds it can mint any identity\n",
				certPath, filepath.Join(dir, mtls.CAKeyFile), mtls.CAKeyFile)
			return err
		},
	}
	cmd.Flags().StringVar(&dir, "dir", ".", "directory for ca.pem and ca-key.pem (created 0700 if missing)")
	cmd.Flags().IntVar(&days, "days", 5*365, "how long the CA is valid, in days")
	return cmd
}

func (c *cli) tlsCertCreateCmd() *cobra.Command {
	var caDir, dir, role, name string
	var ips []net.IP
	var dns []string
	var days int
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create NAME.pem and NAME-key.pem in --dir for a server, agent, router or admin; replaces an existing pair (renewal)",
		Long: "Create a certificate whose identity is --role and --name: a server's or agent's name is its node id " +
			"(a server's certificate must match its --node-id; an agent may attach only as the node its certificate names), " +
			"a router's or admin's any name that identifies it in refusals and logs.",
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			id := mtls.Identity{Role: mtls.Role(role), Name: name}
			if err := id.Validate(); err != nil {
				return fmt.Errorf("tls cert create: --role %s --name %s: %w", role, name, err)
			}
			if days < 1 {
				return fmt.Errorf("--days: must be at least 1, got %d", days)
			}
			certPath, keyPath, err := mtls.CreateCert(caDir, dir, id, mtls.CertOptions{
				Validity: time.Duration(days) * 24 * time.Hour, IPs: ips, DNS: dns,
			})
			if err != nil {
				return fmt.Errorf("tls cert create: %w", err)
			}
			_, err = fmt.Fprintf(c.out, "wrote %s and %s for %s\n", certPath, keyPath, id)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&caDir, "ca", ".", "the CA's directory (ca.pem, ca-key.pem)")
	f.StringVar(&dir, "dir", ".", "directory for NAME.pem and NAME-key.pem")
	f.StringVar(&role, "role", "", "server, agent, router, admin or scraper (required)")
	f.StringVar(&name, "name", "", "the identity's name: a server's or agent's node id, a router's or admin's chosen name (required)")
	f.IPSliceVar(&ips, "ip", nil, "extra IP SANs, for tools that check addresses (llmgw's own clients check roles)")
	f.StringSliceVar(&dns, "dns", nil, "extra DNS SANs")
	f.IntVar(&days, "days", 365, "how long the certificate is valid, in days (at most the CA's remaining validity)")
	_ = cmd.MarkFlagRequired("role")
	_ = cmd.MarkFlagRequired("name")
	return cmd
}
