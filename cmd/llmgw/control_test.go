package main

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/llmgw/llmgw/controlplane"
	"github.com/llmgw/llmgw/internal/configfile"
)

// TestControlFlagsAreFileKeys: every flag of `llmgw control` (but --config)
// is also a key of its YAML file, named as the flag with underscores
// (design §2), so a setting moves between the command line and the file
// unchanged — and Validate's "--flag (key)" names both rightly.
func TestControlFlagsAreFileKeys(t *testing.T) {
	newControlCmd().Flags().VisitAll(func(f *pflag.Flag) {
		if f.Name == "config" {
			return
		}
		key := strings.ReplaceAll(f.Name, "-", "_")
		var value string
		switch f.Value.Type() {
		case "string":
			value = `"h:1"`
		case "stringSlice":
			value = "[h:1]"
		case "bool":
			def, _ := strconv.ParseBool(f.DefValue)
			value = strconv.FormatBool(!def)
		case "int":
			value = "7"
		case "duration":
			value = "7s"
		case "float64":
			value = "0.25"
		default:
			t.Errorf("--%s: a flag of type %s; teach this test its sample value", f.Name, f.Value.Type())
			return
		}
		cfg := controlplane.DefaultConfig()
		if err := configfile.Decode(strings.NewReader(fmt.Sprintf("%s: %s\n", key, value)), &cfg); err != nil {
			t.Errorf("--%s: the file key %s is refused: %v", f.Name, key, err)
			return
		}
		if reflect.DeepEqual(cfg, controlplane.DefaultConfig()) {
			t.Errorf("--%s: the file key %s changed nothing", f.Name, key)
		}
	})
}
