package fsm

import (
	"fmt"
	"math"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Accepted values, in the spelling of the model file. The lists are part of
// the validation messages, so a user sees what would have been accepted.
var (
	Engines  = []string{"vllm", "llamacpp", "sim", "external"}
	Profiles = []string{"chat", "batch", "long-context", "debug"}
	Tasks    = []string{"generate", "embed"}
	// Scorers and Pickers are the built-ins of the router's scheduling
	// framework (design §7.3) that profile_overrides may name.
	Scorers = []string{"session", "queue", "kv", "inflight", "weight", "load", "prefix"}
	Pickers = []string{"p2c", "max-score", "softmax", "round-robin"}
	// LoRARanks are the values vLLM accepts for --max-lora-rank.
	LoRARanks = []uint32{1, 8, 16, 32, 64, 128, 256, 320, 512}
	// BlockSizes are the KV block sizes vLLM accepts for --block-size.
	BlockSizes = []uint32{1, 8, 16, 32, 64, 128, 256}
)

const (
	// NamePattern is what model and adapter names must match: they become
	// replica ids, metric labels and the OpenAI "model" field, so they stay
	// DNS-label-like.
	NamePattern = `[a-z0-9]([-a-z0-9.]*[a-z0-9])?`
	// MaxNameLen keeps "<model>-<ordinal>" and label values short.
	MaxNameLen = 63
	// MaxGPUsPerReplica bounds a typo, not a machine.
	MaxGPUsPerReplica = 64
)

var nameRE = regexp.MustCompile(`^` + NamePattern + `$`)

// vllmManagedFlags are the vLLM flags the agent's driver sets from the model
// and the placement (design §6); the same flag in extra_args would fight it.
var vllmManagedFlags = map[string]string{
	"--host": "the agent binds the node's advertise address", "--port": "the agent allocates it",
	"--served-model-name": "it is the model's name", "--block-size": "use block_size",
	"--prefix-caching-hash-algo": "kv_events sets it", "--kv-events-config": "kv_events sets it",
	"--enable-lora": "adapters set it", "--max-loras": "max_loaded_adapters sets it",
	"--lora-modules": "use adapters", "--max-lora-rank": "use max_lora_rank",
}

// managedFlags holds them per engine; the simulator takes vLLM's flags
// (design §8).
var managedFlags = map[string]map[string]string{
	"vllm": vllmManagedFlags,
	"sim":  vllmManagedFlags,
	"llamacpp": {
		"--host": "the agent binds the node's advertise address", "--port": "the agent allocates it",
		"-m": "use model", "--model": "use model", "--alias": "it is the model's name", "--lora": "use adapters",
	},
}

func checkName(field, name string) error {
	if name == "" {
		return invalid(field, "required")
	}
	if len(name) > MaxNameLen || !nameRE.MatchString(name) {
		return invalid(field, "must match %s and be at most %d characters, got %q", NamePattern, MaxNameLen, name)
	}
	return nil
}

func oneOf(field, value string, allowed []string) error {
	if !slices.Contains(allowed, value) {
		return invalid(field, "%q is not one of %s", value, strings.Join(allowed, ", "))
	}
	return nil
}

func uintList(vs []uint32) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = strconv.FormatUint(uint64(v), 10)
	}
	return strings.Join(s, ",")
}

// ModelDefaults returns a copy of m with the documented defaults filled in:
// profile "chat", task "generate", gpus_per_replica 1 (none for external),
// block_size 16 when kv_events is on, hash_seed "0". It is pure, so llmgwctl
// can show what the server will store.
func ModelDefaults(m *llmgwv1.Model) *llmgwv1.Model {
	out := proto.Clone(m).(*llmgwv1.Model)
	if out.Profile == "" {
		out.Profile = "chat"
	}
	if out.Task == "" {
		out.Task = "generate"
	}
	if out.Engine != "external" && out.GpusPerReplica == 0 {
		out.GpusPerReplica = 1
	}
	if out.KvEvents && out.BlockSize == 0 {
		out.BlockSize = 16
	}
	if out.HashSeed == "" {
		out.HashSeed = "0"
	}
	return out
}

// ValidateModel checks a model on its own (no other state) and returns the
// first problem as a *ValidationError naming the field. Call it on the result
// of ModelDefaults: it does not assume defaults.
func ValidateModel(m *llmgwv1.Model) error {
	if m == nil {
		return invalid("model", "required")
	}
	if err := checkName("name", m.Name); err != nil {
		return err
	}
	if m.Engine == "" {
		return invalid("engine", "required, one of %s", strings.Join(Engines, ", "))
	}
	if err := oneOf("engine", m.Engine, Engines); err != nil {
		return err
	}
	external := m.Engine == "external"
	if !external && m.Model == "" {
		return invalid("model", "required for engine %q (a Hugging Face id or a path)", m.Engine)
	}
	for i, arg := range m.ExtraArgs {
		flag, _, _ := strings.Cut(arg, "=")
		if why, ok := managedFlags[m.Engine][flag]; ok {
			return invalid(fmt.Sprintf("extra_args[%d]", i), "%s is set by llmgw: %s", flag, why)
		}
	}
	if external && len(m.ExtraArgs) > 0 {
		return invalid("extra_args", "not used for engine \"external\": llmgw runs nothing for it")
	}
	if !external && m.Replicas < 1 {
		return invalid("replicas", "must be at least 1")
	}
	switch {
	case external && m.GpusPerReplica != 0:
		return invalid("gpus_per_replica", "must be 0 for engine \"external\": llmgw runs nothing for it")
	case !external && (m.GpusPerReplica < 1 || m.GpusPerReplica > MaxGPUsPerReplica):
		return invalid("gpus_per_replica", "must be in 1..%d, got %d", MaxGPUsPerReplica, m.GpusPerReplica)
	}
	for k := range m.NodeSelector {
		if k == "" {
			return invalid("node_selector", "label keys must not be empty")
		}
	}
	if m.Profile != "" {
		if err := oneOf("profile", m.Profile, Profiles); err != nil {
			return err
		}
	}
	if err := validateOverrides(m.ProfileOverrides); err != nil {
		return err
	}
	if m.KvEvents && m.Engine != "vllm" && m.Engine != "sim" {
		return invalid("kv_events", "only engines vllm and sim publish KV events, not %q", m.Engine)
	}
	if m.BlockSize != 0 && !slices.Contains(BlockSizes, m.BlockSize) {
		return invalid("block_size", "must be one of %s, got %d", uintList(BlockSizes), m.BlockSize)
	}
	if m.HashSeed != "" {
		if !validHashSeed(m.HashSeed) {
			return invalid("hash_seed", "must be a decimal in 0..4294967295 (as PYTHONHASHSEED requires), got %q", m.HashSeed)
		}
	}
	if err := validateAdapters(m); err != nil {
		return err
	}
	if m.MaxLoraRank != 0 && !slices.Contains(LoRARanks, m.MaxLoraRank) {
		return invalid("max_lora_rank", "must be 0 or one of vLLM's %s, got %d", uintList(LoRARanks), m.MaxLoraRank)
	}
	if m.Task != "" {
		if err := oneOf("task", m.Task, Tasks); err != nil {
			return err
		}
	}
	return validateEndpoints(m)
}

// validHashSeed reports whether s is what Python accepts as PYTHONHASHSEED:
// decimal digits only, 0..4294967295.
func validHashSeed(s string) bool {
	_, err := strconv.ParseUint(s, 10, 32)
	return err == nil && strings.TrimLeft(s, "0123456789") == ""
}

func validateOverrides(o *llmgwv1.ProfileOverrides) error {
	if o == nil {
		return nil
	}
	nonNeg := func(field string, v float64) error {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return invalid("profile_overrides."+field, "must be a finite number >= 0, got %v", v)
		}
		return nil
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"target_waiting", o.TargetWaiting}, {"target_inflight", o.TargetInflight}, {"session_load_factor", o.SessionLoadFactor}} {
		if err := nonNeg(f.name, f.v); err != nil {
			return err
		}
	}
	if math.IsNaN(o.KvCeiling) || o.KvCeiling < 0 || o.KvCeiling > 1 {
		return invalid("profile_overrides.kv_ceiling", "must be in (0,1] (or 0 for the profile's default), got %v", o.KvCeiling)
	}
	names := make([]string, 0, len(o.Weights))
	for k := range o.Weights {
		names = append(names, k)
	}
	slices.Sort(names) // the first error must not depend on map order
	for _, k := range names {
		field := "profile_overrides.weights." + k
		if err := oneOf(field, k, Scorers); err != nil {
			return err
		}
		if err := nonNeg("weights."+k, o.Weights[k]); err != nil {
			return err
		}
	}
	if o.Picker != "" {
		return oneOf("profile_overrides.picker", o.Picker, Pickers)
	}
	return nil
}

func validateAdapters(m *llmgwv1.Model) error {
	if len(m.Adapters) > 0 && (m.Engine == "external") {
		return invalid("adapters", "not supported for engine %q", m.Engine)
	}
	seen := make(map[string]int, len(m.Adapters))
	for i, a := range m.Adapters {
		field := fmt.Sprintf("adapters[%d]", i)
		if a == nil {
			return invalid(field, "required")
		}
		if err := checkName(field+".name", a.Name); err != nil {
			return err
		}
		if j, dup := seen[a.Name]; dup {
			return invalid(field+".name", "duplicate of adapters[%d] (%q)", j, a.Name)
		}
		if a.Name == m.Name {
			return invalid(field+".name", "%q is the model's own name; adapters share the model namespace", a.Name)
		}
		seen[a.Name] = i
		if a.Path == "" {
			return invalid(field+".path", "required")
		}
	}
	if int(m.MaxLoadedAdapters) > len(m.Adapters) {
		return invalid("max_loaded_adapters", "must be at most the number of adapters (%d), got %d", len(m.Adapters), m.MaxLoadedAdapters)
	}
	return nil
}

func validateEndpoints(m *llmgwv1.Model) error {
	if m.Engine != "external" {
		if len(m.Endpoints) > 0 {
			return invalid("endpoints", "only allowed for engine \"external\"; llmgw runs engine %q itself", m.Engine)
		}
		return nil
	}
	if len(m.Endpoints) == 0 {
		return invalid("endpoints", "required for engine \"external\": at least one base URL")
	}
	for i, e := range m.Endpoints {
		u, err := url.Parse(e)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return invalid(fmt.Sprintf("endpoints[%d]", i), "must be an http:// or https:// base URL, got %q", e)
		}
	}
	return nil
}
