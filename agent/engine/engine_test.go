package engine

import (
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"go.uber.org/goleak"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPlan(t *testing.T) {
	rep := &llmgwv1.Replica{Id: "demo-0", Uid: 7, GpuIndices: []uint32{2, 3}}
	self, _ := os.Executable()
	kvJSON := `{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://127.0.0.1:21000","replay_endpoint":"tcp://127.0.0.1:21001","topic":"kv"}`
	tests := []struct {
		name     string
		model    *llmgwv1.Model
		command  []string
		env      map[string]string
		wantArgv []string
		wantEnv  []string
		wantAddr string
		// wantSleep: the engine has sleep mode and its endpoints.
		wantSleep bool
		// otlp is the spec's OTLPTracesEndpoint.
		otlp string
	}{
		{
			name:  "vllm plain",
			model: &llmgwv1.Model{Name: "demo", Engine: "vllm", Model: "meta-llama/Llama-3.1-8B-Instruct"},
			wantArgv: []string{"vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--host=10.0.0.5", "--port=20000",
				"--served-model-name=demo", "--enable-prompt-tokens-details"},
			wantEnv:  []string{"CUDA_VISIBLE_DEVICES=2,3"},
			wantAddr: "10.0.0.5:20000",
		},
		{
			name:  "vllm embedding model: the pooling runner",
			model: &llmgwv1.Model{Name: "emb", Engine: "vllm", Model: "BAAI/bge-small-en-v1.5", Task: "embed"},
			wantArgv: []string{"vllm", "serve", "BAAI/bge-small-en-v1.5", "--host=10.0.0.5", "--port=20000",
				"--served-model-name=emb", "--enable-prompt-tokens-details", "--runner=pooling"},
			wantEnv:  []string{"CUDA_VISIBLE_DEVICES=2,3"},
			wantAddr: "10.0.0.5:20000",
		},
		{
			name: "vllm kv events adapters at start extra args",
			model: &llmgwv1.Model{Name: "demo", Engine: "vllm", Model: "m", KvEvents: true, BlockSize: 32, HashSeed: "42",
				Adapters:    []*llmgwv1.Adapter{{Name: "sql", Path: "/a/sql"}, {Name: "odd", Path: "/a/x,y"}},
				MaxLoraRank: 64, ExtraArgs: []string{"--max-num-seqs", "8"}},
			command: []string{"/opt/vllm/bin/vllm"},
			env:     map[string]string{"HF_HOME": "/data/hf"},
			wantArgv: []string{"/opt/vllm/bin/vllm", "serve", "m", "--host=10.0.0.5", "--port=20000",
				"--served-model-name=demo", "--enable-prompt-tokens-details",
				"--block-size=32", "--prefix-caching-hash-algo=sha256_cbor", "--kv-events-config=" + kvJSON,
				"--enable-lora", "--max-loras=2", "--max-lora-rank=64",
				"--max-num-seqs", "8",
				"--lora-modules", "sql=/a/sql", `{"name":"odd","path":"/a/x,y","base_model_name":"m"}`},
			wantEnv:  []string{"PYTHONHASHSEED=42", "CUDA_VISIBLE_DEVICES=2,3", "HF_HOME=/data/hf"},
			wantAddr: "10.0.0.5:20000",
		},
		{
			name: "vllm runtime adapters and default kv settings",
			model: &llmgwv1.Model{Name: "demo", Engine: "vllm", Model: "m", KvEvents: true,
				Adapters: []*llmgwv1.Adapter{{Name: "a", Path: "/a"}, {Name: "b", Path: "/b"}}, MaxLoadedAdapters: 1},
			wantArgv: []string{"vllm", "serve", "m", "--host=10.0.0.5", "--port=20000",
				"--served-model-name=demo", "--enable-prompt-tokens-details",
				"--block-size=16", "--prefix-caching-hash-algo=sha256_cbor", "--kv-events-config=" + kvJSON,
				"--enable-lora", "--max-loras=1"},
			wantEnv:  []string{"PYTHONHASHSEED=0", "VLLM_ALLOW_RUNTIME_LORA_UPDATING=true", "CUDA_VISIBLE_DEVICES=2,3"},
			wantAddr: "10.0.0.5:20000",
		},
		{
			name:  "vllm traced: the agent's collector",
			model: &llmgwv1.Model{Name: "demo", Engine: "vllm", Model: "m", ExtraArgs: []string{"--max-num-seqs", "8"}},
			otlp:  "http://127.0.0.1:4317",
			wantArgv: []string{"vllm", "serve", "m", "--host=10.0.0.5", "--port=20000",
				"--served-model-name=demo", "--enable-prompt-tokens-details", "--otlp-traces-endpoint=http://127.0.0.1:4317",
				"--max-num-seqs", "8"},
			wantEnv:  []string{"CUDA_VISIBLE_DEVICES=2,3"},
			wantAddr: "10.0.0.5:20000",
		},
		{
			name:  "sim defaults to this executable",
			model: &llmgwv1.Model{Name: "demo", Engine: "sim", Model: "m"},
			wantArgv: []string{self, "sim", "serve", "m", "--host=10.0.0.5", "--port=20000",
				"--served-model-name=demo", "--enable-prompt-tokens-details"},
			wantEnv:  []string{"CUDA_VISIBLE_DEVICES=2,3"},
			wantAddr: "10.0.0.5:20000",
		},
		{
			name: "vllm with autoscale sleep: sleep mode and its dev endpoints",
			model: &llmgwv1.Model{Name: "demo", Engine: "vllm", Model: "m", KvEvents: true,
				Autoscale: &llmgwv1.Autoscale{Max: 4, TargetWaiting: 2, Sleep: true},
				Adapters:  []*llmgwv1.Adapter{{Name: "a", Path: "/a"}}, MaxLoadedAdapters: 1, ExtraArgs: []string{"--max-num-seqs", "8"}},
			wantArgv: []string{"vllm", "serve", "m", "--host=10.0.0.5", "--port=20000",
				"--served-model-name=demo", "--enable-prompt-tokens-details",
				"--block-size=16", "--prefix-caching-hash-algo=sha256_cbor", "--kv-events-config=" + kvJSON,
				"--enable-sleep-mode", "--enable-lora", "--max-loras=1", "--max-num-seqs", "8"},
			wantEnv: []string{"PYTHONHASHSEED=0", "VLLM_SERVER_DEV_MODE=1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING=true",
				"CUDA_VISIBLE_DEVICES=2,3"},
			wantAddr:  "10.0.0.5:20000",
			wantSleep: true,
		},
		{
			name:  "sim with autoscale sleep",
			model: &llmgwv1.Model{Name: "demo", Engine: "sim", Model: "m", Autoscale: &llmgwv1.Autoscale{Sleep: true}},
			wantArgv: []string{self, "sim", "serve", "m", "--host=10.0.0.5", "--port=20000",
				"--served-model-name=demo", "--enable-prompt-tokens-details", "--enable-sleep-mode"},
			wantEnv:   []string{"VLLM_SERVER_DEV_MODE=1", "CUDA_VISIBLE_DEVICES=2,3"},
			wantAddr:  "10.0.0.5:20000",
			wantSleep: true,
		},
		{
			name:  "vllm autoscaled without sleep",
			model: &llmgwv1.Model{Name: "demo", Engine: "vllm", Model: "m", Autoscale: &llmgwv1.Autoscale{Max: 2}},
			wantArgv: []string{"vllm", "serve", "m", "--host=10.0.0.5", "--port=20000",
				"--served-model-name=demo", "--enable-prompt-tokens-details"},
			wantEnv:  []string{"CUDA_VISIBLE_DEVICES=2,3"},
			wantAddr: "10.0.0.5:20000",
		},
		{
			name: "llamacpp with adapters",
			model: &llmgwv1.Model{Name: "demo", Engine: "llamacpp", Model: "/models/q4.gguf",
				Adapters: []*llmgwv1.Adapter{{Name: "a", Path: "/a.gguf"}, {Name: "b", Path: "/b.gguf"}}},
			wantArgv: []string{"llama-server", "-m", "/models/q4.gguf", "--host", "10.0.0.5", "--port", "20000",
				"--alias", "demo", "--metrics", "--lora", "/a.gguf", "--lora", "/b.gguf", "--lora-init-without-apply"},
			wantEnv:  []string{"CUDA_VISIBLE_DEVICES=2,3"},
			wantAddr: "10.0.0.5:20000",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := Plan(Spec{Replica: rep, Model: tt.model, Host: "10.0.0.5", Port: 20000,
				KVEventsPort: 21000, KVReplayPort: 21001, Command: tt.command, Env: tt.env, OTLPTracesEndpoint: tt.otlp})
			if err != nil {
				t.Fatalf("Plan: %v", err)
			}
			if !slices.Equal(l.Argv, tt.wantArgv) {
				t.Errorf("argv\n got %q\nwant %q", l.Argv, tt.wantArgv)
			}
			if !slices.Equal(l.Env, tt.wantEnv) {
				t.Errorf("env\n got %q\nwant %q", l.Env, tt.wantEnv)
			}
			if l.Address != tt.wantAddr {
				t.Errorf("address %q, want %q", l.Address, tt.wantAddr)
			}
			if l.SleepMode != tt.wantSleep {
				t.Errorf("sleep mode %v, want %v", l.SleepMode, tt.wantSleep)
			}
			if want := "http://" + tt.wantAddr + "/health"; l.HealthURL != want {
				t.Errorf("health %q, want %q", l.HealthURL, want)
			}
		})
	}
}

func TestPlanRejects(t *testing.T) {
	rep := &llmgwv1.Replica{Id: "demo-0"}
	tests := []struct {
		name string
		spec Spec
		is   error
	}{
		{"unknown engine", Spec{Replica: rep, Model: &llmgwv1.Model{Engine: "tgi", Model: "m"}, Host: "h", Port: 1}, ErrUnknownEngine},
		{"no port", Spec{Replica: rep, Model: &llmgwv1.Model{Engine: "vllm", Model: "m"}, Host: "h"}, nil},
		{"no host", Spec{Replica: rep, Model: &llmgwv1.Model{Engine: "llamacpp", Model: "m"}, Port: 1}, nil},
		{"no model id", Spec{Replica: rep, Model: &llmgwv1.Model{Engine: "vllm"}, Host: "h", Port: 1}, nil},
		{"kv events without ports", Spec{Replica: rep, Model: &llmgwv1.Model{Engine: "vllm", Model: "m", KvEvents: true}, Host: "h", Port: 1}, nil},
		{"external without endpoints", Spec{Replica: rep, Model: &llmgwv1.Model{Engine: "external"}}, nil},
		{"external replica without endpoint", Spec{Replica: rep, Model: &llmgwv1.Model{Engine: "external", Endpoints: []string{"http://a:1"}}}, nil},
		{"external replica of another endpoint", Spec{Replica: &llmgwv1.Replica{Id: "e-0", Endpoint: "http://b:1"}, Model: &llmgwv1.Model{Engine: "external", Endpoints: []string{"http://a:1"}}}, nil},
		{"external bad endpoint", Spec{Replica: &llmgwv1.Replica{Id: "e-0", Endpoint: "http://"}, Model: &llmgwv1.Model{Engine: "external", Endpoints: []string{"http://"}}}, nil},
		{"no model", Spec{Replica: rep}, nil},
		// Issue 26: a model stored before fsm refused these must not reach
		// the engine as options.
		{"vllm model read as a flag", Spec{Replica: rep, Model: &llmgwv1.Model{Engine: "vllm", Model: "--trust-remote-code"}, Host: "h", Port: 1}, nil},
		{"sim model read as a flag", Spec{Replica: rep, Model: &llmgwv1.Model{Engine: "sim", Model: "-x"}, Host: "h", Port: 1}, nil},
		{"vllm extra value taken for a LoRA module", Spec{Replica: rep, Model: &llmgwv1.Model{Engine: "vllm", Model: "m", ExtraArgs: []string{"evil=/tmp/x"},
			Adapters: []*llmgwv1.Adapter{{Name: "a", Path: "/a"}}}, Host: "h", Port: 1}, nil},
		{"vllm extra args after --", Spec{Replica: rep, Model: &llmgwv1.Model{Engine: "vllm", Model: "m", ExtraArgs: []string{"--enforce-eager", "--", "x"}}, Host: "h", Port: 1}, nil},
		{"llamacpp extra value first", Spec{Replica: rep, Model: &llmgwv1.Model{Engine: "llamacpp", Model: "m", ExtraArgs: []string{"x"}}, Host: "h", Port: 1}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Plan(tt.spec)
			if err == nil {
				t.Fatal("Plan succeeded")
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Fatalf("error %v is not %v", err, tt.is)
			}
		})
	}
}

// TestPlanExternal: an external replica probes the one endpoint it stands
// for, at its root whatever base path the endpoint has, and checks that the
// engine serves the model's name.
func TestPlanExternal(t *testing.T) {
	m := &llmgwv1.Model{Name: "demo", Engine: "external", Endpoints: []string{"http://10.1.1.1:8000", "http://10.1.1.2:8000/v1/"}}
	for _, tt := range []struct{ endpoint, addr string }{
		{"http://10.1.1.1:8000", "10.1.1.1:8000"},
		{"http://10.1.1.2:8000/v1/", "10.1.1.2:8000"},
	} {
		l, err := Plan(Spec{Replica: &llmgwv1.Replica{Id: "demo-7", Endpoint: tt.endpoint}, Model: m})
		if err != nil {
			t.Fatalf("Plan(%s): %v", tt.endpoint, err)
		}
		want := Launch{Address: tt.addr, HealthURL: "http://" + tt.addr + "/health", ModelsURL: "http://" + tt.addr + "/v1/models", ServedModel: "demo"}
		if l.Address != want.Address || l.HealthURL != want.HealthURL || l.ModelsURL != want.ModelsURL || l.ServedModel != want.ServedModel || len(l.Argv) != 0 {
			t.Errorf("Plan(%s) = %+v, want %+v", tt.endpoint, l, want)
		}
	}
}

// FuzzPlan feeds drivers models as the control plane might send them: no
// input may panic, and a launch that plans must have an address and probe.
func FuzzPlan(f *testing.F) {
	f.Add("vllm", "m", "http://10.0.0.1:8000", "demo-0", uint32(16), "sql", "/a,b")
	f.Add("external", "", "10.0.0.1:8000/", "demo-x", uint32(0), "", "")
	f.Add("external", "", "http://[::1", "demo-9999999999999999999", uint32(0), "", "")
	f.Add("llamacpp", "/m.gguf", "", "a-1", uint32(0), "a=b", "/x")
	f.Add("vllm", "--trust-remote-code", "", "a-1", uint32(0), "", "")
	f.Fuzz(func(t *testing.T, eng, model, endpoint, id string, bs uint32, adName, adPath string) {
		m := &llmgwv1.Model{Name: "demo", Engine: eng, Model: model, Endpoints: []string{endpoint},
			KvEvents: bs%2 == 1, BlockSize: bs, Adapters: []*llmgwv1.Adapter{{Name: adName, Path: adPath}}}
		l, err := Plan(Spec{Replica: &llmgwv1.Replica{Id: id, Endpoint: endpoint}, Model: m, Host: "127.0.0.1", Port: 20000,
			KVEventsPort: 20001, KVReplayPort: 20002, Command: []string{"engine"}})
		if err != nil {
			return
		}
		if l.Address == "" || l.HealthURL == "" {
			t.Fatalf("launch without address or probe: %+v", l)
		}
		// The one positional argument vLLM's parser reads, the model,
		// never passes for an option (issue 26).
		if i := slices.Index(l.Argv, "serve"); i >= 0 && strings.HasPrefix(l.Argv[i+1], "-") {
			t.Fatalf("model %q placed where vLLM reads an option: %q", model, l.Argv)
		}
	})
}

// TestVLLMKVEndpoints: the driver gives vLLM the agent's ipc endpoints
// when it has them (design §6 "KV events"), loopback TCP ports otherwise,
// and refuses kv_events with neither.
func TestVLLMKVEndpoints(t *testing.T) {
	rep := &llmgwv1.Replica{Id: "demo-0", Model: "demo"}
	model := &llmgwv1.Model{Name: "demo", Engine: "vllm", Model: "m", KvEvents: true}
	for _, tc := range []struct {
		name      string
		spec      Spec
		pub, repl string
		// steps is the model's kv_events_buffer_steps, passed on as
		// vLLM's buffer_steps.
		steps uint32
	}{
		{"ipc", Spec{KVEventsEndpoint: "ipc:///run/llmgw/kv/a.pub", KVReplayEndpoint: "ipc:///run/llmgw/kv/a.replay"},
			"ipc:///run/llmgw/kv/a.pub", "ipc:///run/llmgw/kv/a.replay", 0},
		{"tcp", Spec{KVEventsPort: 21000, KVReplayPort: 21001}, "tcp://127.0.0.1:21000", "tcp://127.0.0.1:21001", 0},
		{"buffer steps", Spec{KVEventsPort: 21000, KVReplayPort: 21001}, "tcp://127.0.0.1:21000", "tcp://127.0.0.1:21001", 500},
		{"neither", Spec{}, "", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.spec
			m := proto.CloneOf(model)
			m.KvEventsBufferSteps = tc.steps
			s.Replica, s.Model, s.Host, s.Port = rep, m, "10.0.0.5", 20000
			l, err := Plan(s)
			if tc.pub == "" {
				if err == nil {
					t.Fatal("kv_events without endpoints planned")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var cfg kvEventsConfig
			for _, a := range l.Argv {
				if v, ok := strings.CutPrefix(a, "--kv-events-config="); ok {
					if err := json.Unmarshal([]byte(v), &cfg); err != nil {
						t.Fatal(err)
					}
				}
			}
			if cfg.Endpoint != tc.pub || cfg.ReplayEndpoint != tc.repl {
				t.Errorf("endpoints %q %q, want %q %q", cfg.Endpoint, cfg.ReplayEndpoint, tc.pub, tc.repl)
			}
			if cfg.BufferSteps != tc.steps {
				t.Errorf("buffer_steps %d, want %d", cfg.BufferSteps, tc.steps)
			}
		})
	}
}
