package configfile

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// port is a setting that decodes itself and names its key in its errors,
// as the agent's port_range does.
type port int

func (p *port) UnmarshalText(b []byte) error {
	if string(b) == "any" {
		*p = 0
		return nil
	}
	return fmt.Errorf("port: %q is not a port", b)
}

type inner struct {
	Interval time.Duration `yaml:"interval"`
	Count    int           `yaml:"count"`
}

type Embedded struct {
	Shared uint32 `yaml:"shared"`
}

type keyed struct {
	Embedded          `yaml:",inline"`
	Timeout           time.Duration     `yaml:"heartbeat_timeout"`
	Expect            int               `yaml:"bootstrap_expect"`
	Replicas          *int              `yaml:"replicas"`
	Ratio             float64           `yaml:"ratio"`
	On                bool              `yaml:"on"`
	Gossip            inner             `yaml:"gossip"`
	Peers             []inner           `yaml:"peers"`
	Limits            map[string]int    `yaml:"limits"`
	Labels            map[string]string `yaml:"labels"`
	Port              port              `yaml:"port"`
	Untagged          int
	Ignored           int `yaml:"-"`
	unexported        int //nolint:unused // yaml.v3 skips it; so must the walk
	AnyValue          any `yaml:"any"`
	Bytes             []byte
	PointerToStruct   *inner  `yaml:"ptr"`
	ListOfListOfInts  [][]int `yaml:"grid"`
	ArrayOfInts       [2]int  `yaml:"pair"`
	LastFieldNoYAMLTg int     `json:"x"`
}

// TestStrictNamesKeys: a value of the wrong type is reported under its key
// path, every one of them at once, and a number with a fraction or an
// exponent is refused where yaml.v3 would truncate it into an integer
// (issue 26: replicas: 1.5 was 1, 1e9 a billion, and a control config's
// type errors named a line only).
func TestStrictNamesKeys(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want []string // substrings of the error, in order; nil = decodes
	}{
		{"valid", "heartbeat_timeout: 2s\nbootstrap_expect: 3\nreplicas: 2\nratio: 1.5\ngossip: {interval: 1s, count: 2}\n" +
			"peers:\n  - count: 1\nlimits: {a: 1}\nport: any\nuntagged: 4\nshared: 7\nany: [1, x]\nptr: {count: 3}\ngrid: [[1, 2]]\npair: [1, 2]\n", nil},
		{"a sequence for a duration", "heartbeat_timeout: [1]\n", []string{"heartbeat_timeout: line 1: cannot unmarshal !!seq into time.Duration"}},
		{"a string for an int", "bootstrap_expect: \"x\"\n", []string{"bootstrap_expect: line 1: cannot unmarshal !!str `x` into int"}},
		{"a block sequence", "ratio: 1\nheartbeat_timeout:\n  - 1\n", []string{"heartbeat_timeout: line 3: cannot unmarshal !!seq"}},
		{"a fraction for an int", "replicas: 1.5\n", []string{"replicas: line 1: must be a whole number, got 1.5"}},
		{"an exponent for an int", "replicas: 1e9\n", []string{"replicas: line 1: must be a whole number, got 1e9"}},
		{"an integral float for an int", "bootstrap_expect: 3.0\n", []string{"bootstrap_expect: line 1: must be a whole number, got 3.0"}},
		{"a fraction for an unsigned int", "shared: 0.5\n", []string{"shared: line 1: must be a whole number, got 0.5"}},
		{"a float is fine for a float", "ratio: 1e3\n", nil},
		{"hex is a whole number", "bootstrap_expect: 0x10\n", nil},
		{"nested", "gossip:\n  interval: soon\n", []string{"gossip.interval: line 2: cannot unmarshal !!str `soon` into time.Duration"}},
		{"nested fraction", "gossip: {count: 2.5}\n", []string{"gossip.count: line 1: must be a whole number, got 2.5"}},
		{"in a list", "peers:\n  - count: 1\n  - count: two\n", []string{"peers[1].count: line 3: cannot unmarshal !!str `two` into int"}},
		{"in a map", "limits:\n  a: 1\n  b: [x]\n", []string{"limits.b: line 3: cannot unmarshal !!seq into int"}},
		{"in a list of lists", "grid: [[1, 2], [3, 4.5]]\n", []string{"grid[1][1]: line 1: must be a whole number, got 4.5"}},
		{"in an array", "pair: [1, x]\n", []string{"pair[1]: line 1: cannot unmarshal !!str `x` into int"}},
		{"through a pointer", "ptr:\n  count: x\n", []string{"ptr.count: line 2: cannot unmarshal"}},
		{"inline struct", "shared: -1\n", []string{"shared: line 1: cannot unmarshal !!int `-1` into uint32"}},
		{"untagged field", "untagged: x\n", []string{"untagged: line 1: cannot unmarshal"}},
		{"a mapping for a list", "peers: {count: 1}\n", []string{"peers: line 1: cannot unmarshal !!map into []configfile.inner"}},
		{"a type that decodes itself", "port: 80x\n", []string{`port: line 1: "80x" is not a port`}},
		{"two keys on one line", "gossip: {interval: 1s, count: x}\n", []string{"gossip.count: line 1: cannot unmarshal !!str `x` into int"}},
		{"every problem at once", "bootstrap_expect: x\nreplicas: 1.5\non: maybe\n", []string{
			"bootstrap_expect: line 1", "\nreplicas: line 2: must be a whole number", "\non: line 3: cannot unmarshal !!str `maybe` into bool"}},
		{"unknown keys are still refused", "bogus: 1\nbootstrap_expect: x\n", []string{"bogus: line 1: unknown key", "bootstrap_expect: line 2"}},
		{"a value in an alias is refused unnamed", "a: &v x\nbootstrap_expect: *v\n", []string{"a: line 1: unknown key"}},
		{"null keeps the value", "replicas: null\ngossip: ~\n", nil},
		{"not a mapping", "- 1\n", []string{"(document): line 1: must be a mapping of keys, got !!seq"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var k keyed
			err := Strict([]byte(tt.doc), &k)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("valid document refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("decoded %+v, want %q", k, tt.want)
			}
			msg, at := err.Error(), 0
			for _, w := range tt.want {
				i := strings.Index(msg[at:], w)
				if i < 0 {
					t.Fatalf("error\n%s\nhas no %q (after byte %d)", msg, w, at)
				}
				at += i + len(w)
			}
		})
	}
}

// TestDecodeNamesKeys: Decode and Load report the same named problems, and
// leave the configuration as it was.
func TestDecodeNamesKeys(t *testing.T) {
	cfg := keyed{Expect: 3}
	err := Decode(strings.NewReader("bootstrap_expect: 1.5\n"), &cfg)
	if err == nil || !strings.HasPrefix(err.Error(), "bootstrap_expect: line 1: must be a whole number") {
		t.Fatalf("err = %v", err)
	}
	if cfg.Expect != 3 {
		t.Fatalf("bootstrap_expect = %d after a refused file, want 3", cfg.Expect)
	}
}

func TestStrictDocuments(t *testing.T) {
	var k keyed
	if err := Strict([]byte("# nothing\n"), &k); !errors.Is(err, ErrEmpty) {
		t.Errorf("empty: %v", err)
	}
	if err := Strict([]byte("replicas: 1\n---\nreplicas: 2\n"), &k); !errors.Is(err, ErrSecondDocument) {
		t.Errorf("two documents: %v", err)
	}
	if err := Strict([]byte("{{{"), &k); err == nil || errors.Is(err, ErrEmpty) {
		t.Errorf("not YAML: %v", err)
	}
}

// FuzzStrict feeds the strict decoder (outside input: every --config file
// and llmgwctl's model files). It must not panic, and a refused fraction
// names its key and line.
func FuzzStrict(f *testing.F) {
	f.Add("heartbeat_timeout: [1]\nbootstrap_expect: x\n")
	f.Add("replicas: 1e9\ngossip: {interval: 1s, count: 2.5}\n")
	f.Add("peers:\n  - count: two\nlimits: {a: [1]}\ngrid: [[1], [2.5]]\n")
	f.Add("a: &x [1, 2]\ngrid: [*x, *x]\n")
	f.Add("port: 80x\nshared: 0.5\n")
	f.Fuzz(func(t *testing.T, doc string) {
		var k keyed
		err := Strict([]byte(doc), &k)
		if err == nil {
			return
		}
		for line := range strings.SplitSeq(err.Error(), "\n") {
			if strings.Contains(line, "must be a whole number") && !strings.Contains(line, ": line ") {
				t.Fatalf("problem %q names no key and line", line)
			}
		}
	})
}
