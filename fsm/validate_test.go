package fsm

import (
	"errors"
	"math"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func validModel() *llmgwv1.Model {
	return &llmgwv1.Model{Name: "demo", Engine: "sim", Model: "meta-llama/Llama-3.1-8B-Instruct", Replicas: 2}
}

// modelCase is one row of a ValidateModel table: a change to validModel
// and the field its error names ("" = valid) with part of its reason.
type modelCase struct {
	name   string
	mutate func(m *llmgwv1.Model)
	field  string // "" = valid
	reason string // substring of the reason
}

func TestValidateModel(t *testing.T) {
	runModelCases(t, []modelCase{
		{"valid", func(*llmgwv1.Model) {}, "", ""},
		{"no name", func(m *llmgwv1.Model) { m.Name = "" }, "name", "required"},
		{"upper-case name", func(m *llmgwv1.Model) { m.Name = "Demo" }, "name", "must match"},
		{"name ends in dash", func(m *llmgwv1.Model) { m.Name = "demo-" }, "name", "must match"},
		{"long name", func(m *llmgwv1.Model) { m.Name = strings.Repeat("a", 64) }, "name", "at most 63"},
		{"dotted name", func(m *llmgwv1.Model) { m.Name = "llama-3.1" }, "", ""},
		{"extra args", func(m *llmgwv1.Model) { m.ExtraArgs = []string{"--max-num-seqs", "64", "--enforce-eager"} }, "", ""},
		{"extra args set the port", func(m *llmgwv1.Model) { m.ExtraArgs = []string{"--enforce-eager", "--port=9000"} }, "extra_args[1]", "--port is set by llmgw"},
		{"extra args name the model for llama.cpp", func(m *llmgwv1.Model) { m.Engine = "llamacpp"; m.ExtraArgs = []string{"-m", "x.gguf"} }, "extra_args[0]", "use model"},
		{"extra args for external", func(m *llmgwv1.Model) {
			m.Engine, m.Endpoints, m.ExtraArgs = "external", []string{"http://x"}, []string{"--x"}
		}, "extra_args", "not used"},
		{"no engine", func(m *llmgwv1.Model) { m.Engine = "" }, "engine", "required"},
		{"bad engine", func(m *llmgwv1.Model) { m.Engine = "foo" }, "engine", `"foo" is not one of vllm, llamacpp, sim, external`},
		{"no model path", func(m *llmgwv1.Model) { m.Model = "" }, "model", "required"},
		{"zero replicas", func(m *llmgwv1.Model) { m.Replicas = 0 }, "replicas", "must be at least 1"},
		{"too many gpus", func(m *llmgwv1.Model) { m.GpusPerReplica = 65 }, "gpus_per_replica", "1..64"},
		{"bad profile", func(m *llmgwv1.Model) { m.Profile = "fast" }, "profile", `"fast" is not one of`},
		{"negative weight", func(m *llmgwv1.Model) {
			m.ProfileOverrides = &llmgwv1.ProfileOverrides{Weights: map[string]float64{"queue": -1}}
		}, "profile_overrides.weights.queue", ">= 0"},
		{"unknown scorer", func(m *llmgwv1.Model) {
			m.ProfileOverrides = &llmgwv1.ProfileOverrides{Weights: map[string]float64{"magic": 1}}
		}, "profile_overrides.weights.magic", "not one of"},
		{"kv ceiling above 1", func(m *llmgwv1.Model) { m.ProfileOverrides = &llmgwv1.ProfileOverrides{KvCeiling: 1.5} }, "profile_overrides.kv_ceiling", "(0,1]"},
		{"kv ceiling NaN", func(m *llmgwv1.Model) { m.ProfileOverrides = &llmgwv1.ProfileOverrides{KvCeiling: math.NaN()} }, "profile_overrides.kv_ceiling", "(0,1]"},
		{"kv ceiling 1", func(m *llmgwv1.Model) { m.ProfileOverrides = &llmgwv1.ProfileOverrides{KvCeiling: 1} }, "", ""},
		{"bad picker", func(m *llmgwv1.Model) { m.ProfileOverrides = &llmgwv1.ProfileOverrides{Picker: "best"} }, "profile_overrides.picker", "not one of"},
		{"bad kv score", func(m *llmgwv1.Model) { m.ProfileOverrides = &llmgwv1.ProfileOverrides{KvScore: "cheap"} }, "profile_overrides.kv_score", "not one of"},
		{"kv score cost", func(m *llmgwv1.Model) { m.ProfileOverrides = &llmgwv1.ProfileOverrides{KvScore: "cost"} }, "", ""},
		{"negative queue weight", func(m *llmgwv1.Model) { m.ProfileOverrides = &llmgwv1.ProfileOverrides{KvQueueWeight: -1} }, "profile_overrides.kv_queue_weight", ">= 0"},
		{"infinite target", func(m *llmgwv1.Model) { m.ProfileOverrides = &llmgwv1.ProfileOverrides{TargetWaiting: math.Inf(1)} }, "profile_overrides.target_waiting", "finite"},
		{"hash seed max", func(m *llmgwv1.Model) { m.HashSeed = "4294967295" }, "", ""},
		{"hash seed too big", func(m *llmgwv1.Model) { m.HashSeed = "4294967296" }, "hash_seed", "must be a decimal in 0..4294967295"},
		{"hash seed signed", func(m *llmgwv1.Model) { m.HashSeed = "+1" }, "hash_seed", "decimal"},
		{"hash seed random", func(m *llmgwv1.Model) { m.HashSeed = "random" }, "hash_seed", "decimal"},
		{"kv events on llamacpp", func(m *llmgwv1.Model) { m.Engine = "llamacpp"; m.KvEvents = true }, "kv_events", "only engines vllm, sim and external (vLLM)"},
		{"bad block size", func(m *llmgwv1.Model) { m.BlockSize = 17 }, "block_size", "must be one of"},
		{"lora rank 320", func(m *llmgwv1.Model) { m.MaxLoraRank = 320 }, "", ""},
		{"lora rank 4", func(m *llmgwv1.Model) { m.MaxLoraRank = 4 }, "max_lora_rank", "1,8,16,32,64,128,256,320,512"},
		{"duplicate adapter", func(m *llmgwv1.Model) {
			m.Adapters = []*llmgwv1.Adapter{{Name: "a", Path: "/a"}, {Name: "a", Path: "/b"}}
		}, "adapters[1].name", "duplicate"},
		{"adapter named as model", func(m *llmgwv1.Model) { m.Adapters = []*llmgwv1.Adapter{{Name: "demo", Path: "/a"}} }, "adapters[0].name", "model's own name"},
		{"adapter without path", func(m *llmgwv1.Model) { m.Adapters = []*llmgwv1.Adapter{{Name: "a"}} }, "adapters[0].path", "required"},
		{"too many loaded adapters", func(m *llmgwv1.Model) { m.MaxLoadedAdapters = 1 }, "max_loaded_adapters", "at most"},
		{"bad task", func(m *llmgwv1.Model) { m.Task = "chat" }, "task", "not one of"},
		{"endpoints on sim", func(m *llmgwv1.Model) { m.Endpoints = []string{"http://x"} }, "endpoints", "only allowed"},
		{"external needs endpoints", func(m *llmgwv1.Model) { m.Engine = "external" }, "endpoints", "required"},
		{"external bad endpoint", func(m *llmgwv1.Model) { m.Engine = "external"; m.Endpoints = []string{"x:80"} }, "endpoints[0]", "http://"},
		{"external", func(m *llmgwv1.Model) {
			m.Engine, m.Model, m.Replicas, m.Endpoints = "external", "", 0, []string{"http://api.example.com/v1"}
		}, "", ""},
		{"kv_events on external", func(m *llmgwv1.Model) {
			m.Engine, m.Model, m.Replicas, m.Endpoints, m.KvEvents = "external", "", 0, []string{"http://a:8000", "http://b:8000"}, true
			m.KvEventsPublishers, m.KvEventsReplay, m.KvEventsTopic = []string{"tcp://a:5557", "tcp://[::1]:5557"}, []string{"tcp://a:5558", ""}, "kv"
		}, "", ""},
		{"kv_events on external without publishers", func(m *llmgwv1.Model) {
			m.Engine, m.Model, m.Replicas, m.Endpoints, m.KvEvents = "external", "", 0, []string{"http://a:8000", "http://b:8000"}, true
			m.KvEventsPublishers = []string{"tcp://a:5557"}
		}, "kv_events_publishers", "one ZMQ publisher endpoint per endpoint (2), got 1"},
		{"kv_events on external, wildcard publisher", func(m *llmgwv1.Model) {
			m.Engine, m.Model, m.Replicas, m.Endpoints, m.KvEvents = "external", "", 0, []string{"http://a:8000", "http://b:8000"}, true
			m.KvEventsPublishers = []string{"tcp://a:5557", "tcp://*:5557"}
		}, "kv_events_publishers[1]", "wildcard"},
		{"kv_events on external, bad replay", func(m *llmgwv1.Model) {
			m.Engine, m.Model, m.Replicas, m.Endpoints, m.KvEvents = "external", "", 0, []string{"http://a:8000", "http://b:8000"}, true
			m.KvEventsPublishers, m.KvEventsReplay = []string{"tcp://a:5557", "tcp://b:5557"}, []string{"", "b:5558"}
		}, "kv_events_replay[1]", "tcp://HOST:PORT"},
		{"kv_events on external, replay list short", func(m *llmgwv1.Model) {
			m.Engine, m.Model, m.Replicas, m.Endpoints, m.KvEvents = "external", "", 0, []string{"http://a:8000", "http://b:8000"}, true
			m.KvEventsPublishers, m.KvEventsReplay = []string{"tcp://a:5557", "tcp://b:5557"}, []string{"tcp://a:5558"}
		}, "kv_events_replay", "one replay endpoint per endpoint (2"},
		{"kv_events_listen on external", func(m *llmgwv1.Model) {
			m.Engine, m.Model, m.Replicas, m.Endpoints, m.KvEvents = "external", "", 0, []string{"http://a:8000", "http://b:8000"}, true
			m.KvEventsListen, m.KvEventsAllow = []string{"tcp://0.0.0.0:5557", "tcp://[::1]:5558"}, []string{"10.0.0.0/24", "::1"}
			m.KvEventsBufferSteps = 1000
		}, "", ""},
		{"kv_events_listen and publishers", func(m *llmgwv1.Model) {
			m.Engine, m.Model, m.Replicas, m.Endpoints, m.KvEvents = "external", "", 0, []string{"http://a:8000"}, true
			m.KvEventsListen, m.KvEventsPublishers = []string{"tcp://0.0.0.0:5557"}, []string{"tcp://a:5557"}
		}, "kv_events_listen", "not both"},
		{"kv_events_listen short", func(m *llmgwv1.Model) {
			m.Engine, m.Model, m.Replicas, m.Endpoints, m.KvEvents = "external", "", 0, []string{"http://a:8000", "http://b:8000"}, true
			m.KvEventsListen = []string{"tcp://0.0.0.0:5557"}
		}, "kv_events_listen", "one ZMQ endpoint per endpoint (2), got 1"},
		{"kv_events_listen without a port", func(m *llmgwv1.Model) {
			m.Engine, m.Model, m.Replicas, m.Endpoints, m.KvEvents = "external", "", 0, []string{"http://a:8000"}, true
			m.KvEventsListen = []string{"tcp://0.0.0.0"}
		}, "kv_events_listen[0]", "tcp://HOST:PORT"},
		{"kv_events_allow bad", func(m *llmgwv1.Model) {
			m.Engine, m.Model, m.Replicas, m.Endpoints, m.KvEvents = "external", "", 0, []string{"http://a:8000"}, true
			m.KvEventsListen, m.KvEventsAllow = []string{"tcp://0.0.0.0:5557"}, []string{"10.0.0.0/24", "a.example"}
		}, "kv_events_allow[1]", "address or a CIDR prefix"},
		{"kv_events_allow host bits", func(m *llmgwv1.Model) {
			m.Engine, m.Model, m.Replicas, m.Endpoints, m.KvEvents = "external", "", 0, []string{"http://a:8000"}, true
			m.KvEventsListen, m.KvEventsAllow = []string{"tcp://0.0.0.0:5557"}, []string{"10.0.0.1/24"}
		}, "kv_events_allow[0]", "write 10.0.0.0/24"},
		{"kv_events_allow without listen", func(m *llmgwv1.Model) {
			m.Engine, m.Model, m.Replicas, m.Endpoints, m.KvEvents = "external", "", 0, []string{"http://a:8000"}, true
			m.KvEventsPublishers, m.KvEventsAllow = []string{"tcp://a:5557"}, []string{"10.0.0.1"}
		}, "kv_events_allow", "only with kv_events_listen"},
		{"kv_events_listen on sim", func(m *llmgwv1.Model) {
			m.KvEvents, m.KvEventsListen = true, []string{"tcp://0.0.0.0:5557"}
		}, "kv_events_listen", "only for engine"},
		{"kv_events_buffer_steps without kv_events", func(m *llmgwv1.Model) { m.KvEventsBufferSteps = 100 }, "kv_events_buffer_steps", "only with kv_events"},
		{"kv_events_buffer_steps too many", func(m *llmgwv1.Model) { m.KvEvents, m.KvEventsBufferSteps = true, 2_000_000 }, "kv_events_buffer_steps", "at most 1000000"},
		{"kv publishers without kv_events", func(m *llmgwv1.Model) {
			m.Engine, m.Model, m.Replicas, m.Endpoints = "external", "", 0, []string{"http://a:8000"}
			m.KvEventsPublishers = []string{"tcp://a:5557"}
		}, "kv_events_publishers", "only for engine"},
		{"kv publishers on sim", func(m *llmgwv1.Model) {
			m.KvEvents, m.KvEventsPublishers = true, []string{"tcp://a:5557"}
		}, "kv_events_publishers", "only for engine"},
		{"external with gpus", func(m *llmgwv1.Model) {
			m.Engine, m.Endpoints, m.GpusPerReplica = "external", []string{"http://x"}, 1
		}, "gpus_per_replica", "must be 0"},
	})
}

// runModelCases runs each case through ModelDefaults and ValidateModel.
func runModelCases(t *testing.T, tests []modelCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := validModel()
			tt.mutate(m)
			err := ValidateModel(ModelDefaults(m))
			if tt.field == "" {
				if err != nil {
					t.Fatalf("ValidateModel: %v, want nil", err)
				}
				return
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("ValidateModel: %v, want a *ValidationError", err)
			}
			if ve.Field != tt.field || !strings.Contains(ve.Reason, tt.reason) {
				t.Fatalf("ValidateModel: field %q reason %q, want field %q reason containing %q", ve.Field, ve.Reason, tt.field, tt.reason)
			}
			if !strings.HasPrefix(err.Error(), tt.field+": ") {
				t.Fatalf("error %q does not start with the field", err)
			}
		})
	}
}

func TestModelDefaults(t *testing.T) {
	in := validModel()
	in.KvEvents = true
	got := ModelDefaults(in)
	if got.Profile != "chat" || got.Task != "generate" || got.GpusPerReplica != 1 || got.BlockSize != 16 || got.HashSeed != "0" {
		t.Fatalf("defaults not filled: %v", got)
	}
	if in.Profile != "" {
		t.Fatal("ModelDefaults modified its argument")
	}
	ext := ModelDefaults(&llmgwv1.Model{Engine: "external"})
	if ext.GpusPerReplica != 0 || ext.BlockSize != 0 {
		t.Fatalf("external got GPU/block defaults: %v", ext)
	}
}

// TestModelPolicy holds the model policy: each rule refuses without its
// allow flag, naming the field and the flag that would allow it, and accepts
// with it.
func TestModelPolicy(t *testing.T) {
	vllm := func(args ...string) func(m *llmgwv1.Model) {
		return func(m *llmgwv1.Model) { m.Engine, m.ExtraArgs = "vllm", args }
	}
	external := func(endpoints ...string) func(m *llmgwv1.Model) {
		return func(m *llmgwv1.Model) {
			m.Engine, m.Model, m.Replicas, m.Endpoints = "external", "", 0, endpoints
		}
	}
	const remote, linkLocal = "allow_remote_code: true", "allow_link_local_endpoints: true"
	tests := []struct {
		name   string
		mutate func(m *llmgwv1.Model)
		field  string // "" = valid even without the allow flag
		reason string // substring of the reason; names the allow flag
	}{
		{"trust remote code", vllm("--enforce-eager", "--max-num-seqs=8", "--trust-remote-code"), "extra_args[2]", "--trust-remote-code runs code from the model repository; set " + remote},
		{"trust remote code with a value", vllm("--trust-remote-code=true"), "extra_args[0]", "--trust-remote-code runs code"},
		{"trust remote code with underscores", vllm("--trust_remote_code"), "extra_args[0]", "--trust-remote-code runs code"},
		{"trust remote code abbreviated", vllm("--trust-rem"), "extra_args[0]", "--trust-remote-code runs code"},
		{"trust remote code on the simulator", func(m *llmgwv1.Model) { m.ExtraArgs = []string{"--trust-remote-code"} }, "extra_args[0]", remote},
		{"no trust remote code", vllm("--no-trust-remote-code"), "", ""},
		{"tool parser plugin", vllm("--tool-parser-plugin", "/models/x/parser.py"), "extra_args[0]", "--tool-parser-plugin imports and runs a Python file; set " + remote},
		{"reasoning parser plugin", vllm("--reasoning_parser_plugin=/p.py"), "extra_args[0]", "--reasoning-parser-plugin imports"},
		{"reasoning parser is not an abbreviation", vllm("--reasoning-parser", "deepseek_r1"), "", ""},
		{"config file", vllm("--config", "/etc/vllm.yaml"), "extra_args[0]", "--config reads further engine flags from a file llmgw cannot check; set " + remote},
		{"config format is another flag", vllm("--config-format", "hf"), "", ""},
		{"worker extension from the image", vllm("--worker-extension-cls", "pkg.Ext"), "", ""},
		{"tokenizer mode custom", vllm("--tokenizer-mode", "custom"), "", ""},
		{"a value is not a flag", vllm("--chat-template", "config"), "", ""},
		{"llama.cpp has no such flag", func(m *llmgwv1.Model) {
			m.Engine, m.ExtraArgs = "llamacpp", []string{"--trust-remote-code", "--jinja"}
		}, "", ""},

		{"public endpoint", external("http://api.example.com/v1", "http://10.0.0.7:8000"), "", ""},
		{"loopback endpoint", external("http://127.0.0.1:8000/v1"), "", ""},
		{"https endpoint", external("http://10.0.0.7:8000", "https://api.example.com/v1"), "endpoints[1]", "https:// is not supported yet"},
		{"endpoint with a base path", external("http://10.0.0.7:8000/vllm/v1"), "endpoints[0]", `path "/vllm/v1" is not supported`},
		{"endpoint with a query", external("http://10.0.0.7:8000/?x=1"), "endpoints[0]", "without user, query or fragment"},
		{"endpoint twice", external("http://10.0.0.7:8000", "http://10.0.0.8:8000", "http://10.0.0.7:8000/v1"), "endpoints[2]", "is the engine of endpoints[0] again"},
		{"kv publisher on a metadata address", func(m *llmgwv1.Model) {
			external("http://10.0.0.7:8000")(m)
			m.KvEvents, m.KvEventsPublishers = true, []string{"tcp://169.254.169.254:5557"}
		}, "kv_events_publishers[0]", "link-local"},
		{"kv replay on a link-local address", func(m *llmgwv1.Model) {
			external("http://10.0.0.7:8000")(m)
			m.KvEvents, m.KvEventsPublishers, m.KvEventsReplay = true, []string{"tcp://10.0.0.7:5557"}, []string{"tcp://[fe80::1]:5558"}
		}, "kv_events_replay[0]", "link-local"},
		{"metadata address", external("http://api.example.com", "http://169.254.169.254/"), "endpoints[1]", `"169.254.169.254" is a link-local address, where cloud metadata services answer; set ` + linkLocal},
		{"link-local IPv4", external("http://169.254.10.1:8000"), "endpoints[0]", "link-local"},
		{"link-local IPv6", external("http://[fe80::1]:8000"), "endpoints[0]", "link-local"},
		{"link-local IPv6 with a zone", external("http://[fe80::a9fe:a9fe%25eth0]/"), "endpoints[0]", "link-local"},
		{"IPv4-mapped link-local", external("http://[::ffff:169.254.169.254]/"), "endpoints[0]", "link-local"},
		{"GCE metadata name", external("http://metadata.google.internal/"), "endpoints[0]", "the GCE metadata service; set " + linkLocal},
		{"GCE metadata name, upper case, rooted", external("http://METADATA.google.internal./"), "endpoints[0]", "GCE metadata"},
		{"bare metadata name", external("http://metadata"), "endpoints[0]", "GCE metadata"},
		{"EC2 IPv6 metadata", external("http://[fd00:ec2::254]/"), "endpoints[0]", "EC2 metadata"},
		{"Alibaba metadata", external("http://100.100.100.200/"), "endpoints[0]", "Alibaba"},
		{"decimal IPv4", external("http://2852039166/"), "endpoints[0]", "not a dotted-quad"},
		{"hex IPv4", external("http://0xa9fea9fe/"), "endpoints[0]", "not a dotted-quad"},
		{"short IPv4", external("http://169.254.43518/"), "endpoints[0]", "not a dotted-quad"},
		{"no host", external("http://:8080/v1"), "endpoints[0]", "must name a host"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := validModel()
			tt.mutate(m)
			err := ValidateModel(ModelDefaults(m))
			if tt.field == "" {
				if err != nil {
					t.Fatalf("ValidateModel: %v, want nil", err)
				}
				return
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("ValidateModel: %v, want a *ValidationError", err)
			}
			if ve.Field != tt.field || !strings.Contains(ve.Reason, tt.reason) {
				t.Fatalf("ValidateModel: field %q reason %q, want field %q reason containing %q", ve.Field, ve.Reason, tt.field, tt.reason)
			}
			// The allow flag the message names makes the model valid; a
			// missing host is no policy and stays refused.
			allowed := proto.Clone(m).(*llmgwv1.Model)
			allowed.AllowRemoteCode = strings.Contains(ve.Reason, remote)
			allowed.AllowLinkLocalEndpoints = strings.Contains(ve.Reason, linkLocal)
			err = ValidateModel(ModelDefaults(allowed))
			switch {
			case allowed.AllowRemoteCode || allowed.AllowLinkLocalEndpoints:
				if err != nil {
					t.Fatalf("with the allow flag: %v, want nil", err)
				}
			case err == nil:
				t.Fatalf("a refusal that names no allow flag was accepted on a second look")
			}
		})
	}
}

// TestApplyKeepsPolicyOut holds why the policy is not part of Apply: an
// UpsertModel entry an older leader committed (before the policy existed) is
// stored on replay by every build, so servers of two releases keep the same
// state.
func TestApplyKeepsPolicyOut(t *testing.T) {
	m := &llmgwv1.Model{Name: "remote", Engine: "vllm", Model: "x", Replicas: 1, ExtraArgs: []string{"--trust-remote-code"}}
	if err := ValidateModel(ModelDefaults(m)); err == nil {
		t.Fatal("ValidateModel accepted --trust-remote-code without allow_remote_code")
	}
	f := New(Config{})
	if _, err := f.Apply(2, upsert(t, m)); err != nil {
		t.Fatalf("Apply refused an entry an older leader may have committed: %v", err)
	}
	if _, ok := f.Model("remote"); !ok {
		t.Fatal("the model of the applied entry is not stored")
	}
}
