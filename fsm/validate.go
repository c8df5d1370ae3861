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

	"github.com/llmgw/llmgw/internal/hostcheck"
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
	// KVScores are tier 2's scores (design §7.5 step 5) kv_score may name.
	KVScores = []string{"share", "cost"}
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
// of ModelDefaults: it does not assume defaults. It is what the entry points
// run (llmgwctl, the AdminService on the leader): the model's shape, the
// rules that keep its values from becoming engine options and bound its
// replica count (checkEntry), and the model policy (checkPolicy).
func ValidateModel(m *llmgwv1.Model) error {
	if err := validateShape(m); err != nil {
		return err
	}
	args, err := checkEntry(m)
	if err != nil {
		return err
	}
	if err := checkPolicy(m, args); err != nil {
		return err
	}
	return checkAutoscale(m)
}

// validateApplied is what Apply runs on an UpsertModel entry: the shape
// only, not the policy. Apply must accept every entry any release's leader
// may have committed, or a server replaying the log (after an upgrade, or
// next to an older server in a mixed cluster) would refuse an entry the
// others stored, and the replicas of the state would differ. A rule that was
// added after the first release (checkEntry, the policy) therefore runs at
// the entry points only; a model stored before it keeps running until it is
// applied again.
func validateApplied(m *llmgwv1.Model) error {
	return validateShape(m)
}

// validateShape checks what every release has refused: a model that no
// engine could run or no router could route.
func validateShape(m *llmgwv1.Model) error {
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
	if m.KvEvents && m.Engine != "vllm" && m.Engine != "sim" && !external {
		return invalid("kv_events", "only engines vllm, sim and external (vLLM) publish KV events, not %q", m.Engine)
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
	}{{"target_waiting", o.TargetWaiting}, {"target_inflight", o.TargetInflight}, {"session_load_factor", o.SessionLoadFactor}, {"kv_queue_weight", o.KvQueueWeight}} {
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
	if o.KvScore != "" {
		if err := oneOf("profile_overrides.kv_score", o.KvScore, KVScores); err != nil {
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
		return validateKVEndpoints(m)
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
	return validateKVEndpoints(m)
}

// validateKVEndpoints checks where the agent finds an external engine's KV
// events (design §6): with kv_events, per endpoint by index, either a
// publisher the agent connects to (kv_events_publishers: a wildcard host,
// what vLLM itself binds, names no host to connect to) or an address the
// agent binds for a publisher that connects out (kv_events_listen, with
// kv_events_allow saying who may connect); and a replay socket per
// endpoint or none at all. kv_events_buffer_steps is any engine's.
func validateKVEndpoints(m *llmgwv1.Model) error {
	if m.KvEventsBufferSteps > maxBufferSteps {
		return invalid("kv_events_buffer_steps", "at most %d, got %d", maxBufferSteps, m.KvEventsBufferSteps)
	}
	if m.KvEventsBufferSteps != 0 && !m.KvEvents {
		return invalid("kv_events_buffer_steps", "only with kv_events: true")
	}
	kvFields := len(m.KvEventsPublishers) > 0 || len(m.KvEventsReplay) > 0 || m.KvEventsTopic != "" ||
		len(m.KvEventsListen) > 0 || len(m.KvEventsAllow) > 0
	if m.Engine != "external" || !m.KvEvents {
		if kvFields {
			key := "kv_events_publishers"
			if len(m.KvEventsListen) > 0 {
				key = "kv_events_listen"
			}
			return invalid(key, "only for engine \"external\" with kv_events: true (llmgw sets up the sockets of the engines it runs)")
		}
		return nil
	}
	switch {
	case len(m.KvEventsListen) > 0 && len(m.KvEventsPublishers) > 0:
		return invalid("kv_events_listen", "give kv_events_publishers (the agent connects) or kv_events_listen (the engines connect), not both")
	case len(m.KvEventsListen) > 0:
		if len(m.KvEventsListen) != len(m.Endpoints) {
			return invalid("kv_events_listen", "one ZMQ endpoint per endpoint (%d), got %d", len(m.Endpoints), len(m.KvEventsListen))
		}
		for i, ep := range m.KvEventsListen {
			if err := checkZMQBind(fmt.Sprintf("kv_events_listen[%d]", i), ep); err != nil {
				return err
			}
		}
	case len(m.KvEventsPublishers) != len(m.Endpoints):
		return invalid("kv_events_publishers", "kv_events on engine \"external\" needs one ZMQ publisher endpoint per endpoint (%d), got %d (or kv_events_listen, for engines whose publishers connect out)", len(m.Endpoints), len(m.KvEventsPublishers))
	}
	if len(m.KvEventsAllow) > 0 && len(m.KvEventsListen) == 0 {
		return invalid("kv_events_allow", "only with kv_events_listen")
	}
	for i, a := range m.KvEventsAllow {
		if _, err := hostcheck.ParseAllow(a); err != nil {
			return invalid(fmt.Sprintf("kv_events_allow[%d]", i), "%v", err)
		}
	}
	if len(m.KvEventsReplay) != 0 && len(m.KvEventsReplay) != len(m.Endpoints) {
		return invalid("kv_events_replay", "one replay endpoint per endpoint (%d, \"\" for an engine without one) or none, got %d", len(m.Endpoints), len(m.KvEventsReplay))
	}
	for i, ep := range m.KvEventsPublishers {
		if err := checkZMQConnect(fmt.Sprintf("kv_events_publishers[%d]", i), ep); err != nil {
			return err
		}
	}
	for i, ep := range m.KvEventsReplay {
		if ep == "" {
			continue
		}
		if err := checkZMQConnect(fmt.Sprintf("kv_events_replay[%d]", i), ep); err != nil {
			return err
		}
	}
	return nil
}

// maxBufferSteps bounds kv_events_buffer_steps: the agent holds a replay
// of that many batches, each bounded, while it applies them.
const maxBufferSteps = 1_000_000

// zmqHostPort splits tcp://HOST:PORT (an IPv6 host in brackets) without
// package net, which fsm may not import (it must stay off the network).
func zmqHostPort(ep string) (host, port string, ok bool) {
	addr, ok := strings.CutPrefix(ep, "tcp://")
	i := strings.LastIndexByte(addr, ':')
	if !ok || i < 0 {
		return "", "", false
	}
	host, port = addr[:i], addr[i+1:]
	if strings.HasPrefix(host, "[") {
		if !strings.HasSuffix(host, "]") {
			return "", "", false
		}
		host = host[1 : len(host)-1]
	} else if strings.ContainsAny(host, ":[]") {
		return "", "", false
	}
	return host, port, !strings.ContainsAny(host, "/ ")
}

// checkZMQConnect checks a ZMQ endpoint the agent connects to:
// tcp://HOST:PORT with a host that is not a wildcard.
func checkZMQConnect(field, ep string) error {
	host, port, ok := zmqHostPort(ep)
	if !ok {
		return invalid(field, "must be tcp://HOST:PORT, got %q", ep)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return invalid(field, "port must be in 1..65535, got %q", ep)
	}
	if host == "" || host == "*" || host == "::" || host == "0.0.0.0" {
		return invalid(field, "%q is a wildcard the engine binds; name the engine's host, which the agent connects to", ep)
	}
	return nil
}

// checkZMQBind checks a ZMQ endpoint the agent binds: tcp://HOST:PORT
// with a port (a wildcard host binds every address of the agent's node).
func checkZMQBind(field, ep string) error {
	_, port, ok := zmqHostPort(ep)
	if !ok {
		return invalid(field, "must be tcp://HOST:PORT, got %q", ep)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return invalid(field, "port must be in 1..65535, got %q", ep)
	}
	return nil
}

// checkPolicy refuses what a model may do only when it says so explicitly:
// engine flags that run code from outside the image (allow_remote_code) and
// external endpoints on link-local or metadata addresses
// (allow_link_local_endpoints). It runs at the entry points only
// (validateApplied says why). Hosts are judged as written; nothing is
// resolved, so fsm stays deterministic and off the network.
func checkPolicy(m *llmgwv1.Model, args []EngineArg) error {
	if !m.AllowRemoteCode {
		for _, a := range args {
			if flag, why, ok := remoteCodeFlag(m.Engine, a); ok {
				return invalid(fmt.Sprintf("extra_args[%d]", a.Index), "%s %s; set allow_remote_code: true to allow it", flag, why)
			}
		}
	}
	if m.Engine != "external" {
		return nil
	}
	seen := map[string]int{}
	for i, e := range m.Endpoints {
		field := fmt.Sprintf("endpoints[%d]", i)
		u, err := url.Parse(e)
		if err != nil {
			continue // validateEndpoints refused it already
		}
		if u.Hostname() == "" {
			return invalid(field, "must name a host, got %q", e)
		}
		if why := hostcheck.Host(u.Hostname()); why != "" && !m.AllowLinkLocalEndpoints {
			return invalid(field, "%q is %s; set allow_link_local_endpoints: true to allow it", u.Hostname(), why)
		}
		if err := routableEndpoint(field, u); err != nil {
			return err
		}
		if j, dup := seen[u.Host]; dup {
			return invalid(field, "%q is the engine of endpoints[%d] again: each endpoint is one replica", e, j)
		}
		seen[u.Host] = i
	}
	if !m.AllowLinkLocalEndpoints {
		// The owning agent connects to these too (design §6).
		for _, list := range []struct {
			key string
			eps []string
		}{{"kv_events_publishers", m.KvEventsPublishers}, {"kv_events_replay", m.KvEventsReplay}} {
			for i, ep := range list.eps {
				host, _, ok := zmqHostPort(ep)
				if !ok {
					continue // validateKVEndpoints refused it already
				}
				if why := hostcheck.Host(host); why != "" {
					return invalid(fmt.Sprintf("%s[%d]", list.key, i), "%q is %s; set allow_link_local_endpoints: true to allow it", host, why)
				}
			}
		}
	}
	return nil
}

// routableEndpoint refuses the endpoints today's routers cannot reach as
// written: they speak plain HTTP to host:port and send the client's own
// path (/v1/...), so a TLS endpoint or a base path other than the OpenAI
// root "/v1" would be silently dropped. At the entry points only, as a rule
// of this release.
func routableEndpoint(field string, u *url.URL) error {
	if u.Scheme != "http" {
		return invalid(field, "%s:// is not supported yet: routers speak plain HTTP to engines; got %q", u.Scheme, u.String())
	}
	if p := strings.TrimSuffix(u.Path, "/"); p != "" && p != "/v1" {
		return invalid(field, "path %q is not supported: routers forward the client's /v1/... path to host:port; give the base URL (http://HOST:PORT)", u.Path)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return invalid(field, "must be http://HOST:PORT without user, query or fragment, got %q", u.Redacted())
	}
	return nil
}
