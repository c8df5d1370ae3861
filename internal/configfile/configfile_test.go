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
		{"unknown key", "nmae: x\n", base, "field nmae not found"},
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
