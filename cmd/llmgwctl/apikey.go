package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// SecretPrefix starts every API key secret llmgwctl makes, so one is
// recognised in a leaked file or a secret scanner's rules.
const SecretPrefix = "sk-llmgw-"

// newSecret makes a secret of 256 random bits: nothing to guess, so the
// cluster's plain SHA-256 of it needs no slow KDF (design §11).
func newSecret(random io.Reader) (string, error) {
	var b [32]byte
	if _, err := io.ReadFull(random, b[:]); err != nil {
		return "", fmt.Errorf("make a secret: %w", err)
	}
	return SecretPrefix + base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// apikeyCmd is `apikey create|update|list|revoke|require`: router API keys
// (design §11), each belonging to a tenant (design §7.7).
// The secret is made here and printed once; only its SHA-256 is sent, so
// it crosses no network and no server's log.
func (c *cli) apikeyCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "apikey", Short: "Create, list, move and revoke router API keys"}

	var models []string
	var tenant string
	create := &cobra.Command{
		Use:   "create NAME [--models a,b] [--tenant T]",
		Short: "Create a key and print its secret, once; routers require keys once any exists",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			secret, err := newSecret(rand.Reader)
			if err != nil {
				return err
			}
			h := sha256.Sum256([]byte(secret))
			req := &llmgwv1.CreateApiKeyRequest{Name: args[0], SecretSha256: h[:], Models: models, Tenant: tenant}
			if err := fsm.ValidateAPIKey(&llmgwv1.ApiKey{Name: req.Name, SecretSha256: req.SecretSha256, Models: req.Models, Tenant: req.Tenant}); err != nil {
				return fmt.Errorf("apikey create: %w", tenantFieldAsFlag(err))
			}
			return c.adminGated(cmd, llmgwv1.CommandType_COMMAND_TYPE_PUT_API_KEY, func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				resp, err := a.CreateApiKey(ctx, req)
				if err != nil {
					return fmt.Errorf("apikey create %s: %w", req.Name, err)
				}
				if c.output == "json" {
					return c.printJSON(map[string]any{"name": req.Name, "models": orEmpty(req.Models), "tenant": req.Tenant,
						"revision": resp.Revision, "secret": secret, "turned_keys_required_on": resp.TurnedKeysRequiredOn})
				}
				if _, err := fmt.Fprintf(c.out, "api key %s created at revision %d for %s, in tenant %s\n", req.Name, resp.Revision,
					modelsOf(req.Models), keyTenant(req.Name, req.Tenant)); err != nil {
					return err
				}
				if resp.TurnedKeysRequiredOn {
					// What the first key turns on, and how to undo it
					// (issue 28: a newcomer's dev cluster was locked for
					// good). Before the secret, which stays the last line.
					if _, err := fmt.Fprintln(c.out, "keys are now required: every router refuses a request without a valid key, "+
						"even after the last key is revoked (llmgwctl apikey require off serves requests without a key again)"); err != nil {
						return err
					}
				}
				_, err = fmt.Fprintf(c.out, "its secret, shown only now (the cluster keeps only its hash):\n%s\n", secret)
				return err
			})
		},
	}
	create.Flags().StringSliceVar(&models, "models", nil, "models (and adapters) the key may use, a,b,...; a model brings its adapters (default: every model)")
	create.Flags().StringVar(&tenant, "tenant", "", "the tenant whose limits the key's requests count against; it must exist (default: the key's own, named like it, without limits until created)")

	var moveTo string
	update := &cobra.Command{
		Use:   "update NAME --tenant T",
		Short: "Move a key to another tenant (--tenant \"\" moves it back to its own)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("tenant") {
				return usage(fmt.Errorf("apikey update %s: --tenant: required (the key's tenant is what update changes; --tenant \"\" moves it back to its own)", args[0]))
			}
			if moveTo != "" {
				var ve *fsm.ValidationError
				if err := fsm.ValidateTenant(&llmgwv1.Tenant{Name: moveTo}); errors.As(err, &ve) {
					return usage(fmt.Errorf("apikey update %s: --tenant: %s", args[0], ve.Reason))
				}
			}
			return c.adminGated(cmd, llmgwv1.CommandType_COMMAND_TYPE_SET_API_KEY_TENANT, func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				resp, err := a.SetApiKeyTenant(ctx, &llmgwv1.SetApiKeyTenantRequest{Name: args[0], Tenant: moveTo})
				if err != nil {
					return fmt.Errorf("apikey update %s: %w", args[0], err)
				}
				if c.output == "json" {
					return c.printJSON(map[string]any{"name": args[0], "tenant": moveTo, "revision": resp.Revision})
				}
				_, err = fmt.Fprintf(c.out, "api key %s moved to tenant %s at revision %d\n", args[0], keyTenant(args[0], moveTo), resp.Revision)
				return err
			})
		},
	}
	update.Flags().StringVar(&moveTo, "tenant", "", "the tenant to move the key to; it must exist (\"\": the key's own)")

	var consistent bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List keys: names, models, creation times (never a secret)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.admin(cmd.Context(), func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				resp, err := a.ListApiKeys(ctx, &llmgwv1.ListRequest{Consistent: consistent})
				if err != nil {
					return fmt.Errorf("apikey list: %w", err)
				}
				for _, k := range resp.Keys {
					k.SecretSha256 = nil // never shown, even if a server sent it
				}
				if c.output == "json" {
					return c.printItems(messages(resp.Keys), nil)
				}
				rows := make([][]string, 0, len(resp.Keys))
				for _, k := range resp.Keys {
					rows = append(rows, []string{k.Name, modelsOf(k.Models), keyTenant(k.Name, k.Tenant),
						time.Unix(k.CreatedUnix, 0).UTC().Format(time.RFC3339), fmt.Sprint(k.Revision)})
				}
				if err := c.printTable([]string{"NAME", "MODELS", "TENANT", "CREATED", "REVISION"}, rows); err != nil {
					return err
				}
				// Under the table, so its rows stay what scripts read.
				_, err = fmt.Fprintf(c.out, "\nkeys required: %s\n", onOff(resp.KeysRequired))
				return err
			})
		},
	}
	consistentFlag(list, &consistent)

	revoke := &cobra.Command{
		Use:   "revoke NAME",
		Short: "Revoke a key: every router refuses its secret once the change reaches it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.adminGated(cmd, llmgwv1.CommandType_COMMAND_TYPE_DELETE_API_KEY, func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				resp, err := a.RevokeApiKey(ctx, &llmgwv1.RevokeApiKeyRequest{Name: args[0]})
				if err != nil {
					return fmt.Errorf("apikey revoke %s: %w", args[0], err)
				}
				// With no key left every request is refused (the cluster
				// requires keys once one has existed, router/auth): say so.
				// Consistent: a follower's copy may not hold the revoke yet.
				left, err := a.ListApiKeys(ctx, &llmgwv1.ListRequest{Consistent: true})
				last := err == nil && len(left.Keys) == 0 && left.KeysRequired
				if c.output == "json" {
					return c.printJSON(map[string]any{"name": args[0], "revision": resp.Revision, "last_key": last})
				}
				if _, err := fmt.Fprintf(c.out, "api key %s revoked at revision %d\n", args[0], resp.Revision); err != nil {
					return err
				}
				if last {
					_, err = fmt.Fprintln(c.out, "no API key is left: routers refuse every request until one is created (llmgwctl apikey create NAME), "+
						"or keys are no longer required (llmgwctl apikey require off)")
				}
				return err
			})
		},
	}
	require := &cobra.Command{
		Use:       "require on|off",
		Short:     "Turn \"keys required\" on or off for every router (the first key created turns it on)",
		Args:      cobra.MatchAll(cobra.ExactArgs(1), cobra.OnlyValidArgs),
		ValidArgs: []string{"on", "off"},
		RunE: func(cmd *cobra.Command, args []string) error {
			on := args[0] == "on"
			return c.adminGated(cmd, llmgwv1.CommandType_COMMAND_TYPE_SET_API_KEYS_REQUIRED, func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				resp, err := a.SetApiKeysRequired(ctx, &llmgwv1.SetApiKeysRequiredRequest{Required: on})
				if err != nil {
					return fmt.Errorf("apikey require %s: %w", args[0], err)
				}
				if c.output == "json" {
					return c.printJSON(map[string]any{"required": on, "was": resp.Was, "revision": resp.Revision})
				}
				switch {
				case on == resp.Was:
					_, err = fmt.Fprintf(c.out, "keys required was %s already\n", args[0])
				case on:
					_, err = fmt.Fprintf(c.out, "keys required on at revision %d: every router refuses a request without a valid key\n", resp.Revision)
				default:
					_, err = fmt.Fprintf(c.out, "keys required off at revision %d: routers serve requests without a key again "+
						"(a key presented is still checked; the next key created turns it back on)\n", resp.Revision)
				}
				return err
			})
		},
	}
	cmd.AddCommand(create, update, list, revoke, require)
	return cmd
}

// keyTenant is a key's tenant as people read it: its own is named like
// the key, "(own)" said so that no one looks for a tenant of that name.
func keyTenant(key, tenant string) string {
	if tenant == "" {
		return key + " (own)"
	}
	return tenant
}

// tenantFieldAsFlag names --tenant for a key's tenant field; other fields
// keep their names.
func tenantFieldAsFlag(err error) error {
	var ve *fsm.ValidationError
	if errors.As(err, &ve) && ve.Field == "tenant" {
		return fmt.Errorf("--tenant: %s", ve.Reason)
	}
	return err
}

func onOff(b bool) string {
	if b {
		return "on (every router refuses a request without a valid key; llmgwctl apikey require off)"
	}
	return "off (routers serve requests without a key; the next key created turns it on)"
}

func modelsOf(models []string) string {
	if len(models) == 0 {
		return "every model"
	}
	return strings.Join(models, ",")
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
