package fsm

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// This file holds the model rules that keep a model's values from becoming
// engine options (design §4 "Policy", §6 "Drivers"): the agent builds an
// engine's argv from the model, and an engine's parser reads any item that
// starts with "-" as an option wherever it stands. model: "--trust-remote-code"
// once went past the remote-code policy, which only read extra_args, and
// vLLM read it as that flag. So every value the agent places by itself is
// refused if an engine could read it as anything but a value, and
// extra_args, which are options by intent, are parsed once (ParseEngineArgs)
// the way the engines parse them, so that every rule sees each option
// however it is spelt.
//
// Like the policy, these rules are newer than the first release: they run
// at the entry points (ValidateModel), never in Apply (validateApplied says
// why). The agent's drivers place what a model stored before them holds
// so that it still cannot become an option (agent/engine).

// MaxReplicas bounds a model's replica count. A replica of an engine llmgw
// runs holds at least one GPU, so a count is never placeable beyond the
// GPUs the cluster has, and 4,096 replicas are 4,096 GPUs or more — 512
// eight-GPU nodes for one model. It is twice the largest fleet measured
// (docs/benchmarks.md "Fleet scale": 2,000 replicas of one model, placed in
// 43–45 s, with the leader's placement and the routers' republish already
// the costs that grow first). A larger count is a typo (1e9, an extra
// digit) that would have the leader count, log and report replicas no
// cluster can hold. Like MaxGPUsPerReplica it bounds a typo, not a machine;
// raise it with a measurement.
const MaxReplicas = 4096

// EngineArg is one option of a model's extra_args as the engines' parsers
// read it: the option, then its values.
type EngineArg struct {
	// Index is the option's position in extra_args.
	Index int
	// Spelled is the option as written, without "=value".
	Spelled string
	// Name is how the engines compare it. For a long option ("--x"): without
	// its dashes, "_" read as "-" (vLLM and llama.cpp both do), and up to a
	// "." (vLLM reads "--hf-overrides.key v" as --hf-overrides with a JSON
	// value). For a short one ("-tp"): as written.
	Name string
	// Long says the option was written with "--".
	Long bool
	// Values are its values: the one after "=" (Inline), or the items after
	// it up to the next option.
	Values []string
	Inline bool
}

// negativeNumber is what argparse reads as a value, not an option, when
// the parser has no option that looks like one (vLLM has none; llama.cpp
// takes the item after an option as its value whatever it is).
var negativeNumber = regexp.MustCompile(`^-\d+$|^-\d*\.\d+$`)

// ParseEngineArgs reads extra_args as vLLM's and llama.cpp's parsers do:
// an item starting with "-" is an option ("--name", "--name=value",
// "-x"), unless it is a negative number, and the items after an option
// without "=" are its values. It refuses what would make the engine read
// an item as something other than it looks: an empty item, "-" or "--"
// (argparse reads everything after "--" as positional arguments), control
// characters or invalid UTF-8, whitespace in an option's name (an option
// and its value given as one item), and a value that follows no option
// taking it (the engine would read it as a positional argument: a model,
// or one more LoRA module). Errors are *ValidationError naming
// extra_args[i].
func ParseEngineArgs(args []string) ([]EngineArg, error) {
	var out []EngineArg
	for i, a := range args {
		field := fmt.Sprintf("extra_args[%d]", i)
		switch {
		case a == "":
			return nil, invalid(field, "empty")
		case !utf8.ValidString(a) || strings.ContainsFunc(a, unicode.IsControl):
			return nil, invalid(field, "must not contain control characters or invalid UTF-8, got %q", a)
		case a == "-" || a == "--":
			return nil, invalid(field, "%q is not an option: the engine would read the items after it as positional arguments", a)
		case strings.HasPrefix(a, "-") && !negativeNumber.MatchString(a):
			spelled, value, inline := strings.Cut(a, "=")
			if strings.ContainsFunc(spelled, unicode.IsSpace) {
				return nil, invalid(field, "an option's name has no whitespace: give the option and its value as two items or as --name=value, got %q", a)
			}
			arg := EngineArg{Index: i, Spelled: spelled, Name: spelled, Inline: inline}
			if name, ok := strings.CutPrefix(spelled, "--"); ok {
				name, _, _ = strings.Cut(strings.ReplaceAll(name, "_", "-"), ".")
				if name == "" {
					return nil, invalid(field, "%q has no option name", a)
				}
				arg.Name, arg.Long = name, true
			}
			if inline {
				arg.Values = []string{value}
			}
			out = append(out, arg)
		case len(out) == 0:
			return nil, invalid(field, "%q is not an option: extra_args start with an option (--name) and each value follows its option; the engine would read it as a positional argument", a)
		case out[len(out)-1].Inline:
			return nil, invalid(field, "%q follows %s, whose value is given after \"=\": the engine would read it as a positional argument", a, args[out[len(out)-1].Index])
		default:
			out[len(out)-1].Values = append(out[len(out)-1].Values, a)
		}
	}
	return out, nil
}

// checkArgValue refuses a value the agent places in an engine's argv by
// itself — the positional model, or an option's value — that an engine
// could read as something else: one starting with "-" (vLLM's parser reads
// a positional "--trust-remote-code" as that flag), or one holding
// whitespace or control characters, which no model id, file name or
// adapter has and which a log line or a terminal shows as something else.
func checkArgValue(field, v string) error {
	if strings.HasPrefix(v, "-") {
		return invalid(field, "must not start with \"-\": an engine would read %q as an option", v)
	}
	if !utf8.ValidString(v) || strings.ContainsFunc(v, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) {
		return invalid(field, "must not contain whitespace or control characters, got %q", v)
	}
	return nil
}

// checkEntry runs the rules of this file on a model whose shape is valid
// and returns its extra_args parsed, for the policy.
func checkEntry(m *llmgwv1.Model) ([]EngineArg, error) {
	if m.Replicas > MaxReplicas {
		return nil, invalid("replicas", "must be at most %d, got %d: every replica holds at least one GPU", MaxReplicas, m.Replicas)
	}
	if m.Model != "" {
		if err := checkArgValue("model", m.Model); err != nil {
			return nil, err
		}
	}
	for i, a := range m.Adapters {
		if err := checkArgValue(fmt.Sprintf("adapters[%d].path", i), a.GetPath()); err != nil {
			return nil, err
		}
	}
	args, err := ParseEngineArgs(m.ExtraArgs)
	if err != nil {
		return nil, err
	}
	for _, a := range args {
		flag := a.Spelled
		if a.Long {
			flag = "--" + a.Name
		}
		if why, ok := managedFlags[m.Engine][flag]; ok {
			return nil, invalid(fmt.Sprintf("extra_args[%d]", a.Index), "%s is set by llmgw: %s", flag, why)
		}
	}
	return args, nil
}

// remoteCodeFlags are the engine flags that make the engine run code that
// does not come with its image: whoever may apply a model could otherwise run
// anything on a GPU node, with the node's credentials. Keyed by the flag's
// name without its dashes, underscores spelled as dashes; the value is the
// reason the error gives. The simulator takes vLLM's flags (design §8).
//
// The list is kept to the flags that run code from a model repository or a
// file, or that hide flags from this check:
//   - trust-remote-code: Transformers runs the repository's Python
//     (modeling, configuration, tokenizer code).
//   - tool-parser-plugin, reasoning-parser-plugin: vLLM imports the Python
//     file at the given path, which may be one the model download wrote.
//   - config: vLLM reads further flags from a YAML file, which would carry
//     any of the above past this check.
//
// Left out on purpose: --worker-cls, --worker-extension-cls, --middleware
// and --logits-processors import a class by its qualified name, so they reach
// only code installed in the engine's image, which the operator chose;
// --tokenizer-mode custom picks a tokenizer registered by such installed code;
// --hf-overrides edits the model's config but runs its auto_map code only
// together with --trust-remote-code. llama.cpp's server has no flag that
// loads code (GGUF files are data, chat templates are interpreted), so it has
// no entry.
var remoteCodeFlags = map[string]map[string]string{
	"vllm": vllmRemoteCodeFlags,
	"sim":  vllmRemoteCodeFlags,
}

var vllmRemoteCodeFlags = map[string]string{
	"trust-remote-code":       "runs code from the model repository",
	"tool-parser-plugin":      "imports and runs a Python file",
	"reasoning-parser-plugin": "imports and runs a Python file",
	"config":                  "reads further engine flags from a file llmgw cannot check",
}

// vllmExactFlags are vLLM flags whose name is a prefix of a remoteCodeFlags
// name: argparse takes an exact match over an abbreviation, so they are not
// abbreviations of it.
var vllmExactFlags = map[string]bool{"reasoning-parser": true}

// remoteCodeFlag returns the remoteCodeFlags entry an option spells, if
// any. vLLM's parser reads "_" as "-" in a flag's name, takes
// "--flag=value", and (as argparse does) any unambiguous abbreviation of a
// flag, so each of those spellings counts (ParseEngineArgs reads the first
// two); "--no-trust-remote-code" turns the flag off and does not.
func remoteCodeFlag(engine string, a EngineArg) (flag, why string, ok bool) {
	if !a.Long || vllmExactFlags[a.Name] {
		return "", "", false
	}
	flags := remoteCodeFlags[engine]
	if why, ok := flags[a.Name]; ok {
		return "--" + a.Name, why, true
	}
	// An abbreviation: the prefix of a listed flag. Checked in a fixed order
	// so the message does not depend on map order.
	names := make([]string, 0, len(flags))
	for f := range flags {
		names = append(names, f)
	}
	slices.Sort(names)
	for _, f := range names {
		if strings.HasPrefix(f, a.Name) {
			return "--" + f, flags[f], true
		}
	}
	return "", "", false
}
