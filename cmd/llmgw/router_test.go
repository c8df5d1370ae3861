package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/llmgw/llmgw/router"
)

// routerFlags is `llmgw router`'s flag set over a fresh default config.
func routerFlags(t *testing.T) (*pflag.FlagSet, *router.Config) {
	t.Helper()
	cfg := router.DefaultConfig()
	var configFile string
	fs := pflag.NewFlagSet("router", pflag.ContinueOnError)
	bindRouterFlags(fs, &cfg, &configFile)
	return fs, &cfg
}

func writeFile(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "router.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestRouterFlagKeys: every flag of `llmgw router` has a key in --config's
// file, its name with underscores, and that key sets the very field the
// flag does (read back through the flag).
func TestRouterFlagKeys(t *testing.T) {
	// A value per flag type, as YAML and as the flag then prints it.
	samples := map[string]struct{ yaml, want string }{
		"string":      {"127.0.0.1:4321", "127.0.0.1:4321"},
		"stringSlice": {"[127.0.0.1:1, 127.0.0.1:2]", "[127.0.0.1:1,127.0.0.1:2]"},
		"int":         {"4321", "4321"},
		"int64":       {"4321", "4321"},
		"duration":    {"1234ms", (1234 * time.Millisecond).String()},
		"bool":        {"true", "true"},
		"float64":     {"0.25", "0.25"},
	}
	fs, _ := routerFlags(t)
	n := 0
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name == "config" {
			return
		}
		n++
		key := strings.ReplaceAll(f.Name, "-", "_")
		t.Run(f.Name, func(t *testing.T) {
			s, ok := samples[f.Value.Type()]
			if !ok {
				t.Fatalf("no sample value for flag type %s; add one", f.Value.Type())
			}
			fs, cfg := routerFlags(t)
			if err := loadUnderFlags(fs, writeFile(t, key+": "+s.yaml+"\n"), cfg); err != nil {
				t.Fatalf("key %s: %v", key, err)
			}
			if got := fs.Lookup(f.Name).Value.String(); got != s.want {
				t.Fatalf("after %s: %s in the file, --%s is %s", key, s.yaml, f.Name, got)
			}
		})
	})
	if n < 12 {
		t.Fatalf("only %d flags visited", n)
	}
}

// TestRouterConfigPrecedence: the file overrides the defaults, a flag given
// overrides the file, and a bad file or key is refused.
func TestRouterConfigPrecedence(t *testing.T) {
	fs, cfg := routerFlags(t)
	if err := fs.Parse([]string{"--http-addr=127.0.0.1:7777", "--control=127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	path := writeFile(t, "http_addr: 127.0.0.1:9999\ncontrol: [127.0.0.1:2]\nscrape_interval: 1s\nbreaker_failures: 9\n")
	if err := loadUnderFlags(fs, path, cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.HTTPAddr != "127.0.0.1:7777" || len(cfg.Control) != 1 || cfg.Control[0] != "127.0.0.1:1" {
		t.Errorf("flags given did not win: http %s control %v", cfg.HTTPAddr, cfg.Control)
	}
	if cfg.ScrapeInterval != time.Second || cfg.Breaker.Failures != 9 {
		t.Errorf("file values lost: scrape %s breaker failures %d", cfg.ScrapeInterval, cfg.Breaker.Failures)
	}
	if err := loadUnderFlags(fs, writeFile(t, "scrape_intervall: 1s\n"), cfg); err == nil || !strings.Contains(err.Error(), "scrape_intervall") {
		t.Errorf("a misspelt key: %v, want an error naming it", err)
	}
}
