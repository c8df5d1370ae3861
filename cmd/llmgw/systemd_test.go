package main

import (
	"bytes"
	"encoding/base64"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/agent"
	"github.com/llmgw/llmgw/controlplane"
	"github.com/llmgw/llmgw/internal/configfile"
	"github.com/llmgw/llmgw/router"
)

const systemdDir = "../../deploy/systemd"

// TestSystemdUnits: the shipped units pass `systemd-analyze verify` with no
// complaint at all (it warns about an unknown key, a typo, and still exits
// 0, so any output fails the test). It runs in a root of its own holding
// the units, the system's own units they depend on, and an executable at
// ExecStart's /usr/local/bin/llmgw, so nothing is installed on this machine.
func TestSystemdUnits(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("systemd-analyze not found: CI must install systemd (.ci/run)")
		}
		t.Skip("systemd-analyze not found (Debian's systemd package)")
	}
	units, err := filepath.Glob(filepath.Join(systemdDir, "*.service"))
	if err != nil || len(units) != 3 {
		t.Fatalf("units %v (%v), want llmgw-{control,agent,router}.service", units, err)
	}
	root := t.TempDir()
	copyTree(t, "/usr/lib/systemd/system", filepath.Join(root, "usr/lib/systemd/system"))
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	copyFile(t, self, filepath.Join(root, "usr/local/bin/llmgw"), 0o755)
	args := []string{"verify", "--root=" + root}
	for _, u := range units {
		dst := filepath.Join("/etc/systemd/system", filepath.Base(u))
		copyFile(t, u, filepath.Join(root, dst), 0o644)
		args = append(args, dst)
	}
	out, err := exec.Command(analyze, args...).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("systemd-analyze %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// TestSystemdExampleConfigs: the configuration files deploy/systemd/README.md
// tells an operator to start from decode strictly (no unknown key) and pass
// their role's validation, with /etc/llmgw/tls holding a gossip key (the
// one file validation reads).
func TestSystemdExampleConfigs(t *testing.T) {
	tlsDir := t.TempDir()
	key := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))
	if err := os.WriteFile(filepath.Join(tlsDir, "gossip.key"), []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		file string
		load func(path string) error
	}{
		{"control.yaml", func(p string) error {
			cfg := controlplane.DefaultConfig()
			if err := configfile.Load(p, &cfg); err != nil {
				return err
			}
			return cfg.Validate()
		}},
		{"agent.yaml", func(p string) error {
			cfg := agent.DefaultConfig()
			if err := configfile.Load(p, &cfg); err != nil {
				return err
			}
			return cfg.Validate()
		}},
		{"router.yaml", func(p string) error {
			cfg := router.DefaultConfig()
			if err := configfile.Load(p, &cfg); err != nil {
				return err
			}
			return cfg.Validate()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join(systemdDir, tt.file))
			if err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(t.TempDir(), tt.file)
			if err := os.WriteFile(p, bytes.ReplaceAll(b, []byte("/etc/llmgw/tls/"), []byte(tlsDir+"/")), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := tt.load(p); err != nil {
				t.Errorf("%s: %v", tt.file, err)
			}
		})
	}
}

func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(link, target)
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(target, b, 0o644)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		t.Fatal(err)
	}
}
