package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/fsm"
	"github.com/llmgw/llmgw/internal/configfile"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// aliasFile is the YAML an operator writes for `llmgwctl alias apply -f`
// (design §7.9):
//
//	name: chat
//	targets:
//	  - {target: llama-8b, weight: 90}
//	  - {target: llama-8b-v2, weight: 10}
//	sticky: key          # "", key or session
//	fallbacks: [llama-3b]
//
// Weights are decoded as int so a negative or huge one gets an error naming
// the field; a weight left out is 1, so a single target needs none.
type aliasFile struct {
	Name      string            `yaml:"name"`
	Targets   []aliasTargetFile `yaml:"targets"`
	Sticky    string            `yaml:"sticky"`
	Fallbacks []string          `yaml:"fallbacks"`
}

type aliasTargetFile struct {
	Target string `yaml:"target"`
	Weight *int   `yaml:"weight"`
}

// parseAliasFile decodes one alias strictly, as model files are decoded
// (configfile.Strict: an unknown key, a second document, a value of the
// wrong type or a fraction where a weight belongs is an error naming its
// key), and validates its shape with the FSM's own code, so a bad file is
// refused before anything is sent. Whether its targets exist is the
// server's to say.
func parseAliasFile(r io.Reader) (*llmgwv1.Alias, error) {
	data, err := io.ReadAll(io.LimitReader(r, configfile.MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("read alias file: %w", err)
	}
	if len(data) > configfile.MaxSize {
		return nil, fmt.Errorf("alias file: larger than %d bytes", configfile.MaxSize)
	}
	var f aliasFile
	switch err := configfile.Strict(data, &f); {
	case errors.Is(err, configfile.ErrEmpty):
		return nil, errors.New("alias file is empty")
	case errors.Is(err, configfile.ErrSecondDocument):
		return nil, errors.New("alias file: holds more than one document; apply one alias per file")
	case err != nil:
		return nil, fmt.Errorf("alias file: %w", err)
	}
	a := &llmgwv1.Alias{Name: f.Name, Sticky: f.Sticky, Fallbacks: f.Fallbacks}
	for i, t := range f.Targets {
		w := 1
		if t.Weight != nil {
			w = *t.Weight
		}
		if w < 0 || w > math.MaxUint32 {
			return nil, fmt.Errorf("targets[%d].weight: %d is out of range (0..%d)", i, w, fsm.MaxAliasWeight)
		}
		a.Targets = append(a.Targets, &llmgwv1.AliasTarget{Target: t.Target, Weight: uint32(w)})
	}
	if err := fsm.ValidateAlias(a); err != nil {
		return nil, err
	}
	return a, nil
}

// aliasCmd is `alias apply|list|delete` (design §7.9).
func (c *cli) aliasCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "alias", Short: "Apply, list and delete model aliases: weighted splits, sticky routing and fallbacks"}
	var file string
	apply := &cobra.Command{
		Use:   "apply -f FILE",
		Short: "Create or replace an alias from a YAML file (- for stdin); routers follow within a second",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return usage(errors.New("-f: an alias file is required"))
			}
			in, err := openFileFlag(file)
			if err != nil {
				return err
			}
			defer in.Close()
			al, err := parseAliasFile(in)
			if err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			return c.adminGated(cmd, llmgwv1.CommandType_COMMAND_TYPE_PUT_ALIAS, func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				resp, err := a.ApplyAlias(ctx, &llmgwv1.ApplyAliasRequest{Alias: al})
				if err != nil {
					return fmt.Errorf("alias apply %s: %w", al.Name, err)
				}
				if c.output == "json" {
					return c.printJSON(resp)
				}
				_, err = fmt.Fprintf(c.out, "alias %s applied at revision %d\n", al.Name, resp.Revision)
				return err
			})
		},
	}
	apply.Flags().StringVarP(&file, "file", "f", "", "the alias's YAML file, or - for stdin")

	var consistent bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List aliases: their targets and weights (share in %), stickiness and fallbacks",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.admin(cmd.Context(), func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				resp, err := a.ListAliases(ctx, &llmgwv1.ListRequest{Consistent: consistent})
				if err != nil {
					return fmt.Errorf("alias list: %w", err)
				}
				if c.output == "json" {
					return c.printItems(messages(resp.Aliases), nil)
				}
				rows := make([][]string, 0, len(resp.Aliases))
				for _, al := range resp.Aliases {
					rows = append(rows, []string{al.Name, aliasTargetsOf(al), orDefault(al.Sticky, "-"),
						orDefault(strings.Join(al.Fallbacks, ","), "-"), strconv.FormatUint(al.Revision, 10)})
				}
				return c.printTable([]string{"NAME", "TARGETS", "STICKY", "FALLBACKS", "REVISION"}, rows)
			})
		},
	}
	consistentFlag(list, &consistent)

	del := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete an alias: routers answer its name 404 from then on",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.adminGated(cmd, llmgwv1.CommandType_COMMAND_TYPE_DELETE_ALIAS, func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				resp, err := a.DeleteAlias(ctx, &llmgwv1.DeleteAliasRequest{Name: args[0]})
				if err != nil {
					return fmt.Errorf("alias delete %s: %w", args[0], err)
				}
				if c.output == "json" {
					return c.printJSON(map[string]any{"name": args[0], "revision": resp.Revision})
				}
				_, err = fmt.Fprintf(c.out, "alias %s deleted at revision %d\n", args[0], resp.Revision)
				return err
			})
		},
	}
	cmd.AddCommand(apply, list, del)
	return cmd
}

// aliasTargetsOf is `alias list`'s TARGETS: target=weight (share %) each.
func aliasTargetsOf(al *llmgwv1.Alias) string {
	var total uint64
	for _, t := range al.Targets {
		total += uint64(t.Weight)
	}
	parts := make([]string, 0, len(al.Targets))
	for _, t := range al.Targets {
		share := 0.0
		if total > 0 {
			share = 100 * float64(t.Weight) / float64(total)
		}
		parts = append(parts, fmt.Sprintf("%s=%d (%s%%)", t.Target, t.Weight, strconv.FormatFloat(math.Round(share*100)/100, 'f', -1, 64)))
	}
	return strings.Join(parts, ",")
}
