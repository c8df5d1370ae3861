package fsm

import (
	"errors"
	"testing"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func TestCompareVersions(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{
		{"v0.1.0", "v0.2.0", -1},
		{"v0.2.0", "v0.1.0", 1},
		{"v0.2.0", "0.2.0", 0},
		{"v0.10.0", "v0.9.9", 1},
		{"v1.0.0", "v0.99.99", 1},
		{"v0.2.0-rc.1", "v0.2.0", -1},
		{"v0.2.0-rc.2", "v0.2.0-rc.10", -1},
		{"v0.2.0-alpha", "v0.2.0-1", 1},
		{"v0.2.0-rc", "v0.2.0-rc.1", -1},
		{"v0.2.0+build.7", "v0.2.0", 0},
		// git describe after a tag counts as the tag.
		{"v0.1.0-3-g41e4ec2", "v0.1.0", 0},
		{"v0.1.0-3-g41e4ec2-dirty", "v0.2.0", -1},
		{"v0.1.0-dirty", "v0.1.0", 0},
		// Development builds are above every release and equal to each other.
		{"dev", "v99.0.0", 1},
		{"41e4ec2", "v0.2.0", 1},
		{"dev", "41e4ec2", 0},
		// Unknown is below everything.
		{"", "v0.0.1", -1},
		{"", "dev", -1},
		{"", "", 0},
	}
	for _, tt := range tests {
		if got := CompareVersions(tt.a, tt.b); got != tt.want {
			t.Errorf("CompareVersions(%q, %q) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
		if got := CompareVersions(tt.b, tt.a); got != -tt.want {
			t.Errorf("CompareVersions(%q, %q) = %d, want %d (antisymmetry)", tt.b, tt.a, got, -tt.want)
		}
	}
}

func TestParseVersion(t *testing.T) {
	tests := []struct {
		in   string
		want string // "" means ErrNotSemver
	}{
		{"v1.2.3", "v1.2.3"},
		{"1.2.3-rc.1+meta", "v1.2.3-rc.1"},
		{"v0.1.0-3-gabcdef0", "v0.1.0"},
		{"dev", ""},
		{"v1.2", ""},
		{"v01.2.3", ""},
		{"v1.2.3-", ""},
		{"v1.2.3-a..b", ""},
		{"", ""},
	}
	for _, tt := range tests {
		v, err := ParseVersion(tt.in)
		switch {
		case tt.want == "" && !errors.Is(err, ErrNotSemver):
			t.Errorf("ParseVersion(%q) = %v, %v; want ErrNotSemver", tt.in, v, err)
		case tt.want != "" && (err != nil || v.String() != tt.want):
			t.Errorf("ParseVersion(%q) = %v, %v; want %s", tt.in, v, err, tt.want)
		}
	}
}

func TestAtLeast(t *testing.T) {
	tests := []struct {
		have, want string
		ok         bool
	}{
		{"v0.1.0", "", true},
		{"", "", true},
		{"", "v0.1.0", false},
		{"v0.1.0", "v0.2.0", false},
		{"v0.2.0", "v0.2.0", true},
		{"v0.3.1", "v0.2.0", true},
		{"dev", "v0.2.0", true},
	}
	for _, tt := range tests {
		if got := AtLeast(tt.have, tt.want); got != tt.ok {
			t.Errorf("AtLeast(%q, %q) = %v, want %v", tt.have, tt.want, got, tt.ok)
		}
	}
}

// FuzzCompareVersions: versions come from other servers' gossip metadata
// (outside input). Parsing never panics, and the order is antisymmetric,
// reflexive and puts "" lowest.
func FuzzCompareVersions(f *testing.F) {
	for _, s := range [][2]string{{"v0.1.0", "v0.2.0"}, {"dev", "v1.0.0"}, {"v1.0.0-rc.1", "v1.0.0-rc.1.2"}, {"", "x"}, {"v0.1.0-3-gabc1234-dirty", "1.0.0+b"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		if CompareVersions(a, b) != -CompareVersions(b, a) {
			t.Fatalf("not antisymmetric: %q %q", a, b)
		}
		if CompareVersions(a, a) != 0 {
			t.Fatalf("not reflexive: %q", a)
		}
		if a != "" && CompareVersions("", a) != -1 {
			t.Fatalf("unknown not lowest against %q", a)
		}
		if v, err := ParseVersion(a); err == nil {
			if _, err := ParseVersion(v.String()); err != nil {
				t.Fatalf("%q parsed to %s, which does not parse: %v", a, v, err)
			}
		}
	})
}

// TestMinVersionRatchet: ClusterConfig.min_version only moves up, whatever
// a later SET_CLUSTER_CONFIG carries.
func TestMinVersionRatchet(t *testing.T) {
	tests := []struct {
		name string
		seq  []string
		want string
	}{
		{"first set", []string{"v0.2.0"}, "v0.2.0"},
		{"up", []string{"v0.2.0", "v0.3.0"}, "v0.3.0"},
		{"down is ignored", []string{"v0.3.0", "v0.2.0"}, "v0.3.0"},
		{"empty keeps it", []string{"v0.2.0", ""}, "v0.2.0"},
		{"dev is above releases", []string{"v0.2.0", "dev", "v0.9.0"}, "dev"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := New(Config{})
			for i, v := range tt.seq {
				cmd := mustCmd(t, llmgwv1.CommandType_COMMAND_TYPE_SET_CLUSTER_CONFIG, &llmgwv1.SetClusterConfigCommand{Config: &llmgwv1.ClusterConfig{MinVersion: v, DefaultBlockSize: 16}})
				if _, err := f.Apply(uint64(i+1), cmd); err != nil {
					t.Fatal(err)
				}
			}
			if got := f.Config().MinVersion; got != tt.want {
				t.Fatalf("min_version %q, want %q", got, tt.want)
			}
		})
	}
}
