// Package engine holds the drivers that turn a placed replica into a process
// the supervisor can run (design §6 "Drivers"): argv, environment, the address
// routers will be told, and the URL that says the engine is ready.
//
// Drivers are pure: they start nothing and read nothing but their input, so
// every flag the agent promises an engine is checked by a table test, and the
// same spec always yields the same launch.
package engine

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Engine names as models spell them (design §4).
const (
	VLLM     = "vllm"
	LlamaCpp = "llamacpp"
	Sim      = "sim"
	External = "external"
)

// Defaults applied where a model leaves a KV-event setting unset. The
// replicated ClusterConfig carries cluster-wide defaults, but DesiredReplicas
// does not deliver it to agents, so the agent falls back to vLLM's own
// block size and a fixed seed (the router must hash with the same one).
const (
	DefaultBlockSize = 16
	DefaultHashSeed  = "0"
)

// ErrUnknownEngine is returned for an engine name no driver serves.
var ErrUnknownEngine = errors.New("unknown engine")

// Spec is everything a driver needs to know about one replica on this node.
type Spec struct {
	Replica *llmgwv1.Replica
	Model   *llmgwv1.Model
	// Host is the node's advertised address: engines listen on it so routers
	// on other machines reach them (design §6 "Addresses").
	Host string
	// Port is the engine's HTTP port, allocated by the agent.
	Port int
	// KVEventsEndpoint and KVReplayEndpoint are the KV-event PUB and
	// replay endpoints, ipc://PATH in the agent's socket directory (design
	// §6 "KV events"); used only when the model has kv_events. Empty, the
	// loopback TCP ports below are (the fallback).
	KVEventsEndpoint, KVReplayEndpoint string
	// KVEventsPort and KVReplayPort are the loopback ports of the KV-event
	// PUB and replay endpoints when they are not ipc.
	KVEventsPort, KVReplayPort int
	// Command is the program to run with its leading arguments; empty means
	// the driver's default.
	Command []string
	// Env is added to the engine's environment after the driver's own
	// variables, so an operator can override any of them.
	Env map[string]string
	// OTLPTracesEndpoint, set, is given to vLLM (and the simulator) as
	// --otlp-traces-endpoint: the engine exports a span per request,
	// the child of the router's attempt (design §9 "Tracing").
	OTLPTracesEndpoint string
}

// Launch is what the supervisor runs. An empty Argv means there is no
// process to run (external engines): the supervisor only probes.
type Launch struct {
	Argv []string
	// Env holds KEY=VALUE pairs added to the agent's environment.
	Env []string
	// Address is host:port of the engine's HTTP server, reported to the
	// control plane as the replica's address.
	Address string
	// HealthURL answers 200 once the engine serves requests.
	HealthURL string
	// SleepMode is set when the engine was started with vLLM's sleep mode
	// and its endpoints (--enable-sleep-mode, VLLM_SERVER_DEV_MODE=1): a
	// model with autoscale.sleep. The supervisor then puts it to sleep and
	// wakes it as the desired set says, through /sleep, /wake_up and
	// /is_sleeping on the origin of HealthURL (design §6 "Sleep").
	SleepMode bool
	// ModelsURL and ServedModel, set for engines llmgw does not start, are
	// the engine's OpenAI model list and the name it must list: routers
	// send requests under the model's own name, and an engine that serves
	// another answers every one of them 404 however healthy it is.
	ModelsURL, ServedModel string
}

// Plan turns a spec into a launch for the model's engine.
func Plan(s Spec) (Launch, error) {
	if s.Model == nil || s.Replica == nil {
		return Launch{}, errors.New("engine: spec without model or replica")
	}
	switch s.Model.GetEngine() {
	case VLLM:
		return planVLLM(s, []string{"vllm"})
	case Sim:
		self, err := os.Executable()
		if err != nil {
			return Launch{}, fmt.Errorf("engine sim: locate own executable: %w", err)
		}
		return planVLLM(s, []string{self, "sim"})
	case LlamaCpp:
		return planLlamaCpp(s)
	case External:
		return planExternal(s)
	default:
		return Launch{}, fmt.Errorf("engine %q: %w", s.Model.GetEngine(), ErrUnknownEngine)
	}
}

func checkListen(s Spec) error {
	if s.Host == "" {
		return errors.New("engine: no advertise address")
	}
	if s.Port <= 0 || s.Port > 65535 {
		return fmt.Errorf("engine: port %d out of range", s.Port)
	}
	if s.Model.GetModel() == "" {
		return fmt.Errorf("engine: model %q has no model path or id", s.Model.GetName())
	}
	return nil
}

// checkPositional refuses a positional argument an engine's parser would
// read as an option: vLLM's argparse (and the simulator's flag parser) take
// any item starting with "-" for one, so a model id "--trust-remote-code"
// would turn that flag on (issue 26). fsm refuses such a model at apply; a
// model stored before that rule must not slip through here.
func checkPositional(engine, key, v string) error {
	if strings.HasPrefix(v, "-") {
		return fmt.Errorf("engine %s: %s %q starts with \"-\" and would be read as an option; apply the model again with an id or a path", engine, key, v)
	}
	return nil
}

// checkExtraArgs refuses extra_args whose first item is not an option (the
// engine would read it as a positional argument) or that hold "--" (after
// which the engine reads every item as one). fsm's ParseEngineArgs refuses
// these and more at apply; the driver holds the two that could change what
// the engine is told, for models stored before that rule.
func checkExtraArgs(m *llmgwv1.Model) error {
	extra := m.GetExtraArgs()
	if len(extra) > 0 && !strings.HasPrefix(extra[0], "-") {
		return fmt.Errorf("engine %s: extra_args[0] %q is not an option and would be read as a positional argument; apply the model again", m.GetEngine(), extra[0])
	}
	if i := slices.Index(extra, "--"); i >= 0 {
		return fmt.Errorf("engine %s: extra_args[%d] is \"--\", after which every item would be read as a positional argument; apply the model again", m.GetEngine(), i)
	}
	return nil
}

func command(s Spec, def []string) []string {
	if len(s.Command) > 0 {
		return append([]string(nil), s.Command...)
	}
	return def
}

func httpAddr(s Spec) (addr, health string) {
	addr = net.JoinHostPort(s.Host, strconv.Itoa(s.Port))
	return addr, "http://" + addr + "/health"
}

// commonEnv is the environment every process-backed engine gets: the GPUs
// the replica was given, then the operator's overrides.
func commonEnv(s Spec, env []string) []string {
	if idx := s.Replica.GetGpuIndices(); len(idx) > 0 {
		parts := make([]string, len(idx))
		for i, g := range idx {
			parts[i] = strconv.FormatUint(uint64(g), 10)
		}
		env = append(env, "CUDA_VISIBLE_DEVICES="+strings.Join(parts, ","))
	}
	return appendEnvMap(env, s.Env)
}

func appendEnvMap(env []string, m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+m[k])
	}
	return env
}

// planExternal points at an engine llmgw does not run: the one endpoint
// the replica stands for (placement gives each endpoint its own replica,
// design §5.5). Its base URL may end in the OpenAI root /v1, which the
// probes do not want.
func planExternal(s Spec) (Launch, error) {
	ep := s.Replica.GetEndpoint()
	if !slices.Contains(s.Model.GetEndpoints(), ep) {
		return Launch{}, fmt.Errorf("engine external: replica %s names endpoint %q, which is not one of model %q's", s.Replica.GetId(), ep, s.Model.GetName())
	}
	u, err := url.Parse(ep)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return Launch{}, fmt.Errorf("engine external: endpoint %q is not an http URL", ep)
	}
	base := u.Scheme + "://" + u.Host
	return Launch{Address: u.Host, HealthURL: base + "/health", ModelsURL: base + "/v1/models", ServedModel: s.Model.GetName()}, nil
}
