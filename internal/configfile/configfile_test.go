package configfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type sample struct {
	Name    string        `yaml:"name"`
	Timeout time.Duration `yaml:"timeout"`
	Peers   []string      `yaml:"peers"`
}

func TestDecode(t *testing.T) {
	base := sample{Name: "keep", Timeout: time.Second, Peers: []string{"a"}}
	tests := []struct {
		name    string
		in      string
		want    sample
		wantErr string
	}{
		{"keys left out keep their values", "timeout: 250ms\n", sample{Name: "keep", Timeout: 250 * time.Millisecond, Peers: []string{"a"}}, ""},
		{"empty file changes nothing", "", base, ""},
		{"unknown key", "nmae: x\n", base, "nmae: line 1: unknown key"},
		{"bad value", "timeout: soon\n", base, "line 1"},
		{"two documents", "name: x\n---\nname: y\n", base, "more than one YAML document"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := base
			got.Peers = append([]string(nil), base.Peers...)
			err := Decode(strings.NewReader(tt.in), &got)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if got.Name != tt.want.Name || got.Timeout != tt.want.Timeout || strings.Join(got.Peers, ",") != strings.Join(tt.want.Peers, ",") {
				t.Fatalf("got %+v, want %+v (a failed decode must leave the config as it was)", got, tt.want)
			}
		})
	}
}

func TestDecodeNeedsPointer(t *testing.T) {
	if err := Decode(strings.NewReader("name: x"), sample{}); err == nil {
		t.Fatal("decoding into a non-pointer did not fail")
	}
}

func TestLoadNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte("bogus: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var s sample
	err := Load(path, &s)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "--config") {
		t.Fatalf("err = %v, want one naming --config and %s", err, path)
	}
	if err := Load(filepath.Join(t.TempDir(), "missing.yaml"), &s); err == nil {
		t.Fatal("a missing file did not fail")
	}
}

// TestFailedDecodeKeepsMaps: a default held in a map is not touched by a
// file that fails half-way through (the map is shared, not copied, by a
// shallow copy of the struct).
func TestFailedDecodeKeepsMaps(t *testing.T) {
	type withMap struct {
		Labels map[string]string `yaml:"labels"`
		N      int               `yaml:"n"`
	}
	cfg := withMap{Labels: map[string]string{"zone": "a"}}
	err := Decode(strings.NewReader("labels: {zone: b, gpu: h100}\nn: many\n"), &cfg)
	if err == nil {
		t.Fatal("a bad value decoded")
	}
	if len(cfg.Labels) != 1 || cfg.Labels["zone"] != "a" {
		t.Fatalf("labels after a failed decode = %v, want the default map untouched", cfg.Labels)
	}
}

func TestDecodeRefusesHugeFile(t *testing.T) {
	var s sample
	big := "name: " + strings.Repeat("x", MaxSize) + "\n"
	if err := Decode(strings.NewReader(big), &s); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("err = %v, want the size bound", err)
	}
}
