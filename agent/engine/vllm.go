package engine

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// kvEventsConfig is vLLM's KVEventsConfig as --kv-events-config takes it.
// The endpoints are ipc:// paths in the agent's socket directory, which
// vLLM binds and only the agent's user can open; or, the fallback,
// loopback TCP and not wildcards: the agent binds the SUB side and vLLM
// connects to a non-wildcard TCP endpoint (design §6 "KV events").
type kvEventsConfig struct {
	Enable         bool   `json:"enable_kv_cache_events"`
	Publisher      string `json:"publisher"`
	Endpoint       string `json:"endpoint"`
	ReplayEndpoint string `json:"replay_endpoint"`
	Topic          string `json:"topic"`
	// BufferSteps is the replay buffer's size in batches: the model's
	// kv_events_buffer_steps, omitted for vLLM's 10,000. The agent's
	// listener reads a replay as the engine's whole history only when it
	// is shorter than this (design §7.5).
	BufferSteps uint32 `json:"buffer_steps,omitempty"`
}

// planVLLM builds `vllm serve` (or the simulator, which takes the same
// flags) exactly as design §6 lists it.
//
// No value of the model can become an option (issue 26): every option the
// driver sets carries its value after "=", which argparse never reads as
// another option; the model id, the one positional argument, is refused if
// it starts with "-" (vLLM would read "--trust-remote-code" as that flag);
// the operator's extra_args, options by intent, come after the driver's own
// and must start with an option; and --lora-modules, which takes every item
// up to the next option, comes last, so an extra value cannot pass for one
// more LoRA module. fsm refuses all of this when a model is applied; the
// driver holds it again for models stored before that rule.
func planVLLM(s Spec, def []string) (Launch, error) {
	if err := checkListen(s); err != nil {
		return Launch{}, err
	}
	m := s.Model
	if err := checkPositional(m.GetEngine(), "model", m.GetModel()); err != nil {
		return Launch{}, err
	}
	if err := checkExtraArgs(m); err != nil {
		return Launch{}, err
	}
	addr, health := httpAddr(s)
	argv := command(s, def)
	argv = append(argv, "serve", m.GetModel(),
		"--host="+s.Host,
		"--port="+strconv.Itoa(s.Port),
		"--served-model-name="+m.GetName(),
		// Without it vLLM reports no cached_tokens, and routing quality
		// cannot be measured.
		"--enable-prompt-tokens-details",
	)
	if s.OTLPTracesEndpoint != "" {
		argv = append(argv, "--otlp-traces-endpoint="+s.OTLPTracesEndpoint)
	}
	if m.GetTask() == "embed" {
		// vLLM serves /v1/embeddings only from its pooling runner
		// (`--runner pooling`, vLLM ≥ 0.10; older releases spelt it
		// --task embed), and then no completions (design §7.1).
		argv = append(argv, "--runner=pooling")
	}
	var env []string
	if m.GetKvEvents() {
		pub, replay := s.KVEventsEndpoint, s.KVReplayEndpoint
		if pub == "" || replay == "" {
			if s.KVEventsPort <= 0 || s.KVReplayPort <= 0 {
				return Launch{}, fmt.Errorf("engine %s: kv_events without KV endpoints", m.GetEngine())
			}
			pub = "tcp://127.0.0.1:" + strconv.Itoa(s.KVEventsPort)
			replay = "tcp://127.0.0.1:" + strconv.Itoa(s.KVReplayPort)
		}
		bs := m.GetBlockSize()
		if bs == 0 {
			bs = DefaultBlockSize
		}
		seed := m.GetHashSeed()
		if seed == "" {
			seed = DefaultHashSeed
		}
		cfg, err := json.Marshal(kvEventsConfig{
			Enable:         true,
			Publisher:      "zmq",
			Endpoint:       pub,
			ReplayEndpoint: replay,
			Topic:          "kv",
			BufferSteps:    m.GetKvEventsBufferSteps(),
		})
		if err != nil {
			return Launch{}, fmt.Errorf("engine %s: kv events config: %w", m.GetEngine(), err)
		}
		argv = append(argv,
			"--block-size="+strconv.FormatUint(uint64(bs), 10),
			"--prefix-caching-hash-algo=sha256_cbor",
			"--kv-events-config="+string(cfg))
		// Without a fixed seed vLLM draws the root hash at random per
		// process and no router could reproduce a block hash.
		env = append(env, "PYTHONHASHSEED="+seed)
	}
	sleep := m.GetAutoscale().GetSleep()
	if sleep {
		// A replica the autoscaler's count no longer needs sleeps rather
		// than stops (design §5.7 "Sharing GPUs"): its weights wait in host
		// memory. vLLM serves /sleep, /wake_up and /is_sleeping only in
		// its dev mode, which also opens its other development endpoints
		// to whoever reaches the engine's port (design §11).
		argv = append(argv, "--enable-sleep-mode")
		env = append(env, "VLLM_SERVER_DEV_MODE=1")
	}
	var loraModules []string
	if ads := m.GetAdapters(); len(ads) > 0 {
		maxLoras := len(ads)
		if n := m.GetMaxLoadedAdapters(); n > 0 {
			maxLoras = int(n)
		}
		argv = append(argv, "--enable-lora", "--max-loras="+strconv.Itoa(maxLoras))
		if r := m.GetMaxLoraRank(); r > 0 {
			argv = append(argv, "--max-lora-rank="+strconv.FormatUint(uint64(r), 10))
		}
		if m.GetMaxLoadedAdapters() == 0 {
			// Every adapter registered at start (design §7.6). Each item
			// starts with the adapter's name (a DNS-label-like name, fsm)
			// or "{": never "-".
			loraModules = append(loraModules, "--lora-modules")
			for _, a := range ads {
				loraModules = append(loraModules, loraModule(a.GetName(), a.GetPath(), m.GetModel()))
			}
		} else {
			// At most N held: the agent loads them at run time as
			// placements arrive.
			env = append(env, "VLLM_ALLOW_RUNTIME_LORA_UPDATING=true")
		}
	}
	argv = append(argv, m.GetExtraArgs()...)
	argv = append(argv, loraModules...)
	return Launch{Argv: argv, Env: commonEnv(s, env), Address: addr, HealthURL: health, SleepMode: sleep}, nil
}

// loraModule renders one --lora-modules item. vLLM reads `name=path` only
// when the item has no comma; otherwise the JSON form is the unambiguous one.
func loraModule(name, path, base string) string {
	if !strings.Contains(name+path, ",") && !strings.Contains(name, "=") {
		return name + "=" + path
	}
	b, _ := json.Marshal(struct {
		Name string `json:"name"`
		Path string `json:"path"`
		Base string `json:"base_model_name"`
	}{name, path, base})
	return string(b)
}
