package main

import (
	"github.com/spf13/pflag"

	"github.com/llmgw/llmgw/internal/configfile"
)

// loadUnderFlags decodes the YAML file at path into cfg, which the flags are
// bound to, then sets the flags given on the command line again, so they win
// (design §2: defaults, then the file, then the flags). Every server role
// with --config uses it.
func loadUnderFlags(fs *pflag.FlagSet, path string, cfg any) error {
	type given struct {
		flag  *pflag.Flag
		value string
		slice []string
	}
	var set []given
	fs.Visit(func(f *pflag.Flag) {
		g := given{flag: f, value: f.Value.String()}
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			g.slice = append([]string(nil), sv.GetSlice()...)
		}
		set = append(set, g)
	})
	if err := configfile.Load(path, cfg); err != nil {
		return err
	}
	for _, g := range set {
		if sv, ok := g.flag.Value.(pflag.SliceValue); ok {
			if err := sv.Replace(g.slice); err != nil {
				return err
			}
			continue
		}
		if err := g.flag.Value.Set(g.value); err != nil {
			return err
		}
	}
	return nil
}
