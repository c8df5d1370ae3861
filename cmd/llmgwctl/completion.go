package main

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// completionTimeout bounds one shell completion's call to the control
// plane: a shell waits for it at every Tab, so a server that does not
// answer costs this much once and completes nothing, instead of --timeout.
const completionTimeout = 2 * time.Second

// nameKind is what a completed name is: the cluster lists each.
type nameKind int

const (
	modelNames nameKind = iota
	nodeNames
	// modelOrAdapterNames are what a request's model may name: a model or
	// one of its LoRA adapters.
	modelOrAdapterNames
)

// wireCompletion completes the names the commands take from the cluster
// (cobra's dynamic completion, `llmgwctl completion bash|zsh|fish`): model
// names for `model delete|status`, node ids for `node drain|undrain|label`,
// models and adapters for the flags that name what requests ask for.
func (c *cli) wireCompletion(root *cobra.Command) {
	args := map[string]nameKind{
		"model delete": modelNames, "model status": modelNames,
		"node drain": nodeNames, "node undrain": nodeNames, "node label": nodeNames,
	}
	flags := map[string]map[string]nameKind{
		"bench":         {"model": modelOrAdapterNames},
		"usage":         {"model": modelNames},
		"apikey create": {"models": modelOrAdapterNames},
	}
	var walk func(*cobra.Command)
	walk = func(cmd *cobra.Command) {
		path := strings.TrimPrefix(cmd.CommandPath(), root.Name()+" ")
		if kind, ok := args[path]; ok {
			cmd.ValidArgsFunction = func(cmd *cobra.Command, done []string, prefix string) ([]cobra.Completion, cobra.ShellCompDirective) {
				if len(done) > 0 {
					// The name is the first argument only (node label's
					// others are labels).
					return nil, cobra.ShellCompDirectiveNoFileComp
				}
				return c.completeNames(cmd.Context(), kind, "", prefix)
			}
		}
		for flag, kind := range flags[path] {
			// Errors only for a flag that is not there, which the test of
			// every completion catches.
			_ = cmd.RegisterFlagCompletionFunc(flag, func(cmd *cobra.Command, _ []string, prefix string) ([]cobra.Completion, cobra.ShellCompDirective) {
				// A list flag (a,b) completes its last element.
				head := ""
				if i := strings.LastIndex(prefix, ","); i >= 0 {
					head, prefix = prefix[:i+1], prefix[i+1:]
				}
				return c.completeNames(cmd.Context(), kind, head, prefix)
			})
		}
		for _, sub := range cmd.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// completeNames asks the server at --addr for the names of kind that start
// with prefix, within completionTimeout, each after head. A server that
// does not answer completes nothing (and no file names either).
func (c *cli) completeNames(ctx context.Context, kind nameKind, head, prefix string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, completionTimeout)
	defer cancel()
	var names []string
	err := c.admin(ctx, func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
		switch kind {
		case nodeNames:
			resp, err := a.ListNodes(ctx, &llmgwv1.ListRequest{})
			if err != nil {
				return err
			}
			for _, n := range resp.GetNodes() {
				names = append(names, n.GetId())
			}
		default:
			resp, err := a.ListModels(ctx, &llmgwv1.ListRequest{})
			if err != nil {
				return err
			}
			for _, m := range resp.GetModels() {
				names = append(names, m.GetName())
				if kind == modelOrAdapterNames {
					for _, ad := range m.GetAdapters() {
						names = append(names, ad.GetName())
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		cobra.CompDebugln("llmgwctl: completion: "+err.Error(), true)
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	slices.Sort(names)
	var out []cobra.Completion
	for _, n := range slices.Compact(names) {
		if strings.HasPrefix(n, prefix) {
			out = append(out, head+n)
		}
	}
	directive := cobra.ShellCompDirectiveNoFileComp
	if head != "" {
		directive |= cobra.ShellCompDirectiveNoSpace
	}
	return out, directive
}
