package sim

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestNormalizeArgs(t *testing.T) {
	tests := []struct{ in, want []string }{
		{[]string{"m", "--max_num_seqs", "8"}, []string{"m", "--max-num-seqs", "8"}},
		{[]string{"--served-model-name", "a", "b", "--port", "1"}, []string{"--served-model-name=a", "--served-model-name=b", "--port", "1"}},
		{[]string{"--lora-modules", "x=/a", `{"name":"y","path":"/b,c"}`}, []string{"--lora-modules=x=/a", `--lora-modules={"name":"y","path":"/b,c"}`}},
		{[]string{"-tp", "2", "-O3", "-q", "awq"}, []string{"--tensor-parallel-size", "2", "--compilation-config=3", "--quantization", "awq"}},
		{[]string{"--hf-token", "--port", "1"}, []string{"--hf-token", "--port", "1"}},
		{[]string{"--hf-token", "abc"}, []string{"--hf-token=abc"}},
		{[]string{"--seed", "-1", "--", "--x_y"}, []string{"--seed", "-1", "--", "--x_y"}},
	}
	for _, tc := range tests {
		if got := NormalizeArgs(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("NormalizeArgs(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestFlagsTakeVLLMForms: the forms vLLM's argparse takes set the Config;
// an unknown flag fails the parse.
func TestFlagsTakeVLLMForms(t *testing.T) {
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	f := NewFlags(fs)
	args := []string{"m", "--no-enable-prefix-caching", "--enable-lora", "--no-enable-lora", "--max_num_batched_tokens=512",
		"--served-model-name", "a", "b", "--trust-remote-code", "--no-trust-remote-code", "-tp", "1", "--sim-gpu", "l4"}
	if err := fs.Parse(NormalizeArgs(args)); err != nil {
		t.Fatal(err)
	}
	c, err := f.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	if c.EnablePrefixCaching || c.EnableLoRA || c.MaxNumBatchedTokens != 512 || !slices.Equal(c.ServedModelNames, []string{"a", "b"}) || c.GPU != "l4" {
		t.Errorf("config %+v", c)
	}
	// The tool and logprob flags the simulator reads.
	fs = pflag.NewFlagSet("serve", pflag.ContinueOnError)
	f = NewFlags(fs)
	if err := fs.Parse(NormalizeArgs([]string{"m", "--enable-auto-tool-choice", "--tool_call_parser", "hermes", "--max-logprobs", "5",
		"--sim-stream-write-timeout", "2s"})); err != nil {
		t.Fatal(err)
	}
	if c, _ := f.Resolve(); !c.EnableAutoToolChoice || c.ToolCallParser != "hermes" || c.MaxLogprobs != 5 || c.StreamWriteTimeout != 2*time.Second {
		t.Errorf("tool and logprob flags: %+v", c)
	}
	if fs.Lookup("no-enable-auto-tool-choice") == nil {
		t.Error("--enable-auto-tool-choice is BooleanOptionalAction in vLLM: --no- form missing")
	}
	if fs.Lookup("no-port") != nil || fs.Lookup("no-disable-log-stats") != nil {
		t.Error("--no- forms exist only for BooleanOptionalAction flags")
	}
	err = newTestFlagSet().Parse(NormalizeArgs([]string{"--bogus"}))
	if err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Errorf("unknown flag: %v", err)
	}
}

// newTestFlagSet is a fresh flag set with the simulator's flags.
func newTestFlagSet() *pflag.FlagSet {
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	fs.SetOutput(nopWriter{})
	NewFlags(fs)
	return fs
}

type nopWriter struct{}

func (nopWriter) Write(p []byte) (int, error) { return len(p), nil }

// FuzzNormalizeArgs: any argv normalises without losing a value: every
// input token that is not a flag name reappears, alone or as a value.
func FuzzNormalizeArgs(f *testing.F) {
	f.Add("m --served-model-name a b --port 1")
	f.Add("-tp 2 -O3 --hf-token --x_y=1 -- --z")
	f.Fuzz(func(t *testing.T, line string) {
		in := strings.Fields(line)
		out := strings.Join(NormalizeArgs(in), " ")
		for _, a := range in {
			if !strings.HasPrefix(a, "-") && !strings.Contains(out, a) {
				t.Errorf("%q: %q lost in %q", in, a, out)
			}
		}
	})
}
