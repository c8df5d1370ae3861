package fsm

import (
	"errors"
	"slices"
	"strings"
	"testing"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestParseEngineArgs: extra_args read as the engines read them, once, so
// every rule sees an option however it is spelt.
func TestParseEngineArgs(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		want  []EngineArg
		field string // "" = parses
	}{
		{"none", nil, nil, ""},
		{"flag and value", []string{"--max-num-seqs", "8", "--enforce-eager"}, []EngineArg{
			{Index: 0, Spelled: "--max-num-seqs", Name: "max-num-seqs", Long: true, Values: []string{"8"}},
			{Index: 2, Spelled: "--enforce-eager", Name: "enforce-eager", Long: true},
		}, ""},
		{"inline value, underscores", []string{"--trust_remote_code=true"}, []EngineArg{
			{Index: 0, Spelled: "--trust_remote_code", Name: "trust-remote-code", Long: true, Values: []string{"true"}, Inline: true},
		}, ""},
		{"value holding = and spaces", []string{"--chat-template", "{% for m in messages %}", "--api-key=a=b"}, []EngineArg{
			{Index: 0, Spelled: "--chat-template", Name: "chat-template", Long: true, Values: []string{"{% for m in messages %}"}},
			{Index: 2, Spelled: "--api-key", Name: "api-key", Long: true, Values: []string{"a=b"}, Inline: true},
		}, ""},
		{"short option, several values", []string{"-tp", "2", "--cuda-graph-sizes", "1", "2", "4"}, []EngineArg{
			{Index: 0, Spelled: "-tp", Name: "-tp", Values: []string{"2"}},
			{Index: 2, Spelled: "--cuda-graph-sizes", Name: "cuda-graph-sizes", Long: true, Values: []string{"1", "2", "4"}},
		}, ""},
		{"negative numbers are values", []string{"--seed", "-1", "--temperature", "-.5"}, []EngineArg{
			{Index: 0, Spelled: "--seed", Name: "seed", Long: true, Values: []string{"-1"}},
			{Index: 2, Spelled: "--temperature", Name: "temperature", Long: true, Values: []string{"-.5"}},
		}, ""},
		{"dotted JSON key", []string{"--hf-overrides.rope_scaling.factor=2"}, []EngineArg{
			{Index: 0, Spelled: "--hf-overrides.rope_scaling.factor", Name: "hf-overrides", Long: true, Values: []string{"2"}, Inline: true},
		}, ""},
		{"value first", []string{"sql=/evil"}, nil, "extra_args[0]"},
		{"value after an inline value", []string{"--max-num-seqs=8", "9"}, nil, "extra_args[1]"},
		{"empty item", []string{"--enforce-eager", ""}, nil, "extra_args[1]"},
		{"double dash", []string{"--enforce-eager", "--", "--trust-remote-code"}, nil, "extra_args[1]"},
		{"single dash", []string{"-"}, nil, "extra_args[0]"},
		{"no name", []string{"--=x"}, nil, "extra_args[0]"},
		{"option and value in one item", []string{"--max-num-seqs 8"}, nil, "extra_args[0]"},
		{"newline", []string{"--chat-template", "a\nb"}, nil, "extra_args[1]"},
		{"NUL", []string{"--x\x00"}, nil, "extra_args[0]"},
		{"escape", []string{"--x", "\x1b[2J"}, nil, "extra_args[1]"},
		{"invalid UTF-8", []string{"--x", "\xff"}, nil, "extra_args[1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseEngineArgs(tt.args)
			if tt.field != "" {
				var ve *ValidationError
				if !errors.As(err, &ve) || ve.Field != tt.field {
					t.Fatalf("err = %v, want a validation error on %s", err, tt.field)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(got, tt.want, func(a, b EngineArg) bool {
				return a.Index == b.Index && a.Spelled == b.Spelled && a.Name == b.Name && a.Long == b.Long &&
					a.Inline == b.Inline && slices.Equal(a.Values, b.Values)
			}) {
				t.Fatalf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

// TestValidateModelArgv holds issue 26's argument injection: every value
// the agent puts in an engine's argv by itself is refused if an engine could
// read it as an option, and the remote-code policy and the flags llmgw sets
// see an option however it is spelt. Each error names the key.
func TestValidateModelArgv(t *testing.T) {
	runModelCases(t, []modelCase{
		{"model as a flag", func(m *llmgwv1.Model) { m.Model = "--trust-remote-code" }, "model", `must not start with "-"`},
		{"model as a short flag", func(m *llmgwv1.Model) { m.Model = "-x" }, "model", `must not start with "-"`},
		{"model with a space", func(m *llmgwv1.Model) { m.Model = "org/m --trust-remote-code" }, "model", "whitespace"},
		{"model with a newline", func(m *llmgwv1.Model) { m.Model = "org/m\n" }, "model", "whitespace"},
		{"model with an escape", func(m *llmgwv1.Model) { m.Model = "org/\x1bm" }, "model", "control"},
		{"model path", func(m *llmgwv1.Model) { m.Model = "/models/llama-3.1/" }, "", ""},
		{"llama.cpp model as a flag", func(m *llmgwv1.Model) { m.Engine, m.Model = "llamacpp", "--lora=/x" }, "model", `must not start with "-"`},
		{"adapter named as a flag", func(m *llmgwv1.Model) { m.Adapters = []*llmgwv1.Adapter{{Name: "-x", Path: "/a"}} }, "adapters[0].name", "must match"},
		{"adapter path as a flag", func(m *llmgwv1.Model) { m.Adapters = []*llmgwv1.Adapter{{Name: "a", Path: "--trust-remote-code"}} }, "adapters[0].path", `must not start with "-"`},
		{"adapter path with a space", func(m *llmgwv1.Model) { m.Adapters = []*llmgwv1.Adapter{{Name: "a", Path: "/a b"}} }, "adapters[0].path", "whitespace"},
		{"replicas at the bound", func(m *llmgwv1.Model) { m.Replicas = MaxReplicas }, "", ""},
		{"replicas above the bound", func(m *llmgwv1.Model) { m.Replicas = MaxReplicas + 1 }, "replicas", "at most 4096"},
		{"replicas 1e9", func(m *llmgwv1.Model) { m.Replicas = 1e9 }, "replicas", "at most 4096"},
		{"remote code with underscores", func(m *llmgwv1.Model) { m.ExtraArgs = []string{"--trust_remote_code"} }, "extra_args[0]", "--trust-remote-code runs code"},
		{"remote code with a value", func(m *llmgwv1.Model) { m.ExtraArgs = []string{"--max-num-seqs", "8", "--trust-remote-code=true"} }, "extra_args[2]", "--trust-remote-code runs code"},
		{"remote code abbreviated", func(m *llmgwv1.Model) { m.ExtraArgs = []string{"--trust-rem"} }, "extra_args[0]", "--trust-remote-code runs code"},
		{"remote code allowed", func(m *llmgwv1.Model) { m.ExtraArgs, m.AllowRemoteCode = []string{"--trust_remote_code=1"}, true }, "", ""},
		{"remote code turned off", func(m *llmgwv1.Model) { m.ExtraArgs = []string{"--no-trust-remote-code"} }, "", ""},
		{"config file as a dotted key", func(m *llmgwv1.Model) { m.ExtraArgs = []string{"--config.x=y"} }, "extra_args[0]", "--config reads further engine flags"},
		{"reasoning parser is not its plugin", func(m *llmgwv1.Model) { m.ExtraArgs = []string{"--reasoning-parser", "deepseek_r1"} }, "", ""},
		{"remote code after --", func(m *llmgwv1.Model) { m.ExtraArgs = []string{"--", "--trust-remote-code"} }, "extra_args[0]", "not an option"},
		{"a LoRA module smuggled as a value", func(m *llmgwv1.Model) { m.ExtraArgs = []string{"evil=/tmp/x"} }, "extra_args[0]", "not an option"},
		{"managed flag with underscores", func(m *llmgwv1.Model) { m.ExtraArgs = []string{"--served_model_name=other"} }, "extra_args[0]", "--served-model-name is set by llmgw"},
		{"managed flag as a dotted key", func(m *llmgwv1.Model) { m.ExtraArgs = []string{"--kv-events-config.topic=x"} }, "extra_args[0]", "--kv-events-config is set by llmgw"},
		{"llama.cpp managed short flag", func(m *llmgwv1.Model) { m.Engine, m.ExtraArgs = "llamacpp", []string{"-m=x.gguf"} }, "extra_args[0]", "-m is set by llmgw"},
		{"llama.cpp lora", func(m *llmgwv1.Model) { m.Engine, m.ExtraArgs = "llamacpp", []string{"--lora", "x"} }, "extra_args[0]", "--lora is set by llmgw"},
		{"extra args with a negative value", func(m *llmgwv1.Model) { m.ExtraArgs = []string{"--seed", "-1"} }, "", ""},
	})
}

// TestApplyKeepsOlderModels: the argv rules and the replica bound are
// newer than the first release, so Apply — which replays entries any
// release's leader committed — must not refuse a model they refuse, or the
// servers' states would split (design §4 "Validation"). The agent's
// drivers keep such a model's values from becoming options
// (agent/engine).
func TestApplyKeepsOlderModels(t *testing.T) {
	for _, m := range []*llmgwv1.Model{
		{Name: "a", Engine: "vllm", Model: "--trust-remote-code", Replicas: 1, GpusPerReplica: 1},
		{Name: "b", Engine: "vllm", Model: "m", Replicas: MaxReplicas + 1, GpusPerReplica: 1},
		{Name: "c", Engine: "vllm", Model: "m", Replicas: 1, GpusPerReplica: 1, ExtraArgs: []string{"x=/y"}},
	} {
		if err := validateApplied(m); err != nil {
			t.Errorf("Apply's validation refuses %v: %v", m, err)
		}
		if err := ValidateModel(m); err == nil {
			t.Errorf("ValidateModel accepts %v", m)
		}
	}
}

// FuzzParseEngineArgs feeds the extra_args parser (outside input: an
// operator's model file or an AdminService call). It must not panic, and
// what it accepts must account for every item: each is an option's own
// item or one of the values that follow it, in order, and an option starts
// with "-".
func FuzzParseEngineArgs(f *testing.F) {
	f.Add("--max-num-seqs\x008\x00--trust_remote_code=1")
	f.Add("-tp\x002\x00--cuda-graph-sizes\x001\x002")
	f.Add("--seed\x00-1\x00--x.y=z")
	f.Add("x\x00--y")
	f.Add("--\x00--a")
	f.Fuzz(func(t *testing.T, joined string) {
		args := strings.Split(joined, "\x00")
		got, err := ParseEngineArgs(args)
		if err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) || !strings.HasPrefix(ve.Field, "extra_args[") {
				t.Fatalf("error %v does not name an item of extra_args", err)
			}
			return
		}
		next := 0
		for _, a := range got {
			if a.Index != next {
				t.Fatalf("option %+v does not start at item %d: %q", a, next, args)
			}
			item := args[a.Index]
			if !strings.HasPrefix(item, "-") || !strings.HasPrefix(item, a.Spelled) {
				t.Fatalf("option %+v is not item %q", a, item)
			}
			if a.Long && (a.Name == "" || strings.ContainsAny(a.Name, "_.=")) {
				t.Fatalf("long option %+v keeps a character engines read otherwise", a)
			}
			next++
			if a.Inline {
				if len(a.Values) != 1 || item != a.Spelled+"="+a.Values[0] {
					t.Fatalf("inline option %+v is not item %q", a, item)
				}
				continue
			}
			for _, v := range a.Values {
				if args[next] != v {
					t.Fatalf("value %q of %+v is not item %d (%q)", v, a, next, args[next])
				}
				next++
			}
		}
		if next != len(args) {
			t.Fatalf("parsed %d of %d items: %q", next, len(args), args)
		}
	})
}
