package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/fsm"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseModelFile(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr string // substring naming the field; "" means valid
	}{
		{"the issue's example", "name: demo\nengine: sim\nmodel: meta-llama/Llama-3.1-8B-Instruct\nreplicas: 2\ngpus_per_replica: 1\nprofile: chat\n", ""},
		{"replicas omitted means one", "name: demo\nengine: sim\nmodel: m\n", ""},
		{"unknown key", "name: demo\nengine: sim\nmodel: m\nreplica: 2\n", "replica: line 4: unknown key"},
		{"negative replicas", "name: demo\nengine: sim\nmodel: m\nreplicas: -1\n", "replicas:"},
		{"zero replicas", "name: demo\nengine: sim\nmodel: m\nreplicas: 0\n", "replicas:"},
		{"bad engine", "name: demo\nengine: tgi\nmodel: m\n", "engine: line 2:"},
		{"bad name", "name: Demo_1\nengine: sim\nmodel: m\n", "name:"},
		{"bad profile", "name: demo\nengine: sim\nmodel: m\nprofile: fast\n", "profile:"},
		{"hash seed out of range", "name: demo\nengine: vllm\nmodel: m\nkv_events: true\nhash_seed: \"4294967296\"\n", "hash_seed:"},
		{"wrong type", "name: demo\nengine: sim\nmodel: m\nreplicas: two\n", "replicas: line 4: cannot unmarshal"},
		// Issue 26: nothing an engine would read as an option, and no
		// replica count YAML would truncate or no cluster could place.
		{"replicas a fraction", "name: demo\nengine: sim\nmodel: m\nreplicas: 1.5\n", "replicas: line 4: must be a whole number, got 1.5"},
		{"replicas an exponent", "name: demo\nengine: sim\nmodel: m\nreplicas: 1e9\n", "replicas: line 4: must be a whole number, got 1e9"},
		{"replicas a billion", "name: demo\nengine: sim\nmodel: m\nreplicas: 1000000000\n", "replicas: line 4: must be at most 4096"},
		{"gpus a fraction", "name: demo\nengine: sim\nmodel: m\ngpus_per_replica: 0.5\n", "gpus_per_replica: line 4: must be a whole number"},
		{"model read as a flag", "name: demo\nengine: vllm\nmodel: \"--trust-remote-code\"\n", `model: line 3: must not start with "-"`},
		{"adapter named as a flag", "name: demo\nengine: vllm\nmodel: m\nadapters:\n  - {name: \"-x\", path: /a}\n", "adapters[0].name: line 5: must match"},
		{"adapter path read as a flag", "name: demo\nengine: vllm\nmodel: m\nadapters:\n  - {name: x, path: \"--trust-remote-code\"}\n", `adapters[0].path: line 5: must not start with "-"`},
		{"remote code spelt otherwise", "name: demo\nengine: vllm\nmodel: m\nextra_args: [\"--trust_remote_code=true\"]\n", "extra_args[0]: line 4: --trust-remote-code runs code"},
		{"a LoRA module smuggled into extra_args", "name: demo\nengine: vllm\nmodel: m\nextra_args: [\"x=/tmp/evil\"]\n", "extra_args[0]: line 4: \"x=/tmp/evil\" is not an option"},
		{"two documents", "name: a\nengine: sim\nmodel: m\n---\nname: b\n", "more than one document"},
		{"empty", "", "empty"},
		{"not yaml", "{{{", "model file"},
		{"remote code refused", "name: demo\nengine: vllm\nmodel: m\nextra_args: [--enforce-eager, --trust-remote-code]\n", "extra_args[1]: line 4: --trust-remote-code runs code from the model repository; set allow_remote_code: true"},
		{"remote code allowed", "name: demo\nengine: vllm\nmodel: m\nextra_args: [--trust-remote-code]\nallow_remote_code: true\n", ""},
		{"kv affinity off", "name: demo\nengine: sim\nmodel: m\nkv_events: true\nprofile_overrides: {kv_affinity: false}\n", ""},
		{"kv_affinity not a bool", "name: demo\nengine: sim\nmodel: m\nprofile_overrides:\n  kv_affinity: maybe\n", "kv_affinity: line 5"},
		{"allow_remote_code not a bool", "name: demo\nengine: vllm\nmodel: m\nallow_remote_code: please\n", "allow_remote_code"},
		{"metadata endpoint refused", "name: ext\nengine: external\nendpoints: [\"http://169.254.169.254/\"]\n", "endpoints[0]: line 3: \"169.254.169.254\" is a link-local address"},
		{"metadata endpoint allowed", "name: ext\nengine: external\nendpoints: [\"http://169.254.169.254/\"]\nallow_link_local_endpoints: true\n", ""},
		{"external vLLM with kv events", "name: ext\nengine: external\nendpoints: [\"http://10.0.0.7:8000\", \"http://10.0.0.8:8000\"]\nkv_events: true\n" +
			"kv_events_publishers: [\"tcp://10.0.0.7:5557\", \"tcp://10.0.0.8:5557\"]\nkv_events_replay: [\"tcp://10.0.0.7:5558\", \"\"]\nkv_events_topic: kv\n", ""},
		{"external kv events, a publisher short", "name: ext\nengine: external\nendpoints: [\"http://10.0.0.7:8000\", \"http://10.0.0.8:8000\"]\nkv_events: true\n" +
			"kv_events_publishers: [\"tcp://10.0.0.7:5557\"]\n", "kv_events_publishers: line 5: kv_events on engine \"external\" needs one ZMQ publisher endpoint per endpoint (2), got 1 (or kv_events_listen, for engines whose publishers connect out)"},
		// Issue 30: elastic capacity.
		{"autoscale", "name: chat\nengine: sim\nmodel: m\nautoscale:\n  min: 0\n  max: 4\n  target_waiting: 2\n  ttft_p90_slo: 800ms\n  scale_down_after: 2m\n  cooldown: 30s\n  sleep: true\npriority: 3\n", ""},
		{"autoscale starts at its min", "name: chat\nengine: sim\nmodel: m\nautoscale: {min: 2, max: 4, target_waiting: 2}\n", ""},
		{"autoscale without a target", "name: chat\nengine: sim\nmodel: m\nautoscale: {min: 0, max: 4}\n", "autoscale: line 4: needs a target"},
		{"autoscale max below min", "name: chat\nengine: sim\nmodel: m\nautoscale: {min: 3, max: 2, target_waiting: 1}\n", "autoscale.min: line 4: 3 is above autoscale.max 2"},
		{"autoscale fractional seconds", "name: chat\nengine: sim\nmodel: m\nautoscale: {max: 2, target_waiting: 1, cooldown: 1500ms}\n", "autoscale.cooldown: line 4: 1.5s must be a whole number of 1s"},
		{"autoscale duration not a duration", "name: chat\nengine: sim\nmodel: m\nautoscale: {max: 2, target_waiting: 1, cooldown: soon}\n", "cooldown"},
		{"autoscale unknown key", "name: chat\nengine: sim\nmodel: m\nautoscale: {max: 2, target_waiting: 1, target: 3}\n", "autoscale.target: line 4: unknown key"},
		{"autoscale on external", "name: ext\nengine: external\nendpoints: [\"http://10.0.0.7:8000\"]\nautoscale: {max: 2, target_waiting: 1}\n", "autoscale: line 4: not for engine \"external\""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := parseModelFile(strings.NewReader(tt.in))
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("parseModelFile: %v", err)
				}
				if m.Replicas < 1 || m.Profile == "" {
					t.Fatalf("defaults not filled: %v", m)
				}
				for key, got := range map[string]bool{"allow_remote_code": m.AllowRemoteCode, "allow_link_local_endpoints": m.AllowLinkLocalEndpoints} {
					if want := strings.Contains(tt.in, key+": true"); got != want {
						t.Fatalf("%s = %v, want %v", key, got, want)
					}
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestParseModelFileEveryProblem: a file with several problems reports
// each of them, naming its key and line and no Go type (issue 34).
func TestParseModelFileEveryProblem(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{"unknown key and a negative count", "name: demo\nengine: sim\nmodel: m\nfoo: 1\nreplicas: -2\n",
			[]string{"foo: line 4: unknown key", "replicas: line 5: -2 is out of range"}},
		{"three kinds at once", "name: demo\nengine: sim\nmodel: m\nreplicas: two\ngpus_per_replica: -1\nautoscale:\n  max: 2\n  target_waiting: 1\n  cooldown: 1500ms\n  bogus: x\n",
			[]string{"replicas: line 4: cannot unmarshal", "gpus_per_replica: line 5: -1 is out of range", "autoscale.bogus: line 10: unknown key", "autoscale.cooldown: line 9: 1.5s must be a whole number"}},
		{"a list where the model belongs", "- name: demo\n", []string{"(document): line 1: must be a mapping of keys"}},
		{"a validation rule, with its line", "name: demo\nengine: sim\nmodel: m\n\nprofile: fast\n", []string{"profile: line 5:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseModelFile(strings.NewReader(tt.in))
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
			for _, goName := range []string{"main.", "modelFile", "autoscaleFile", "not found in type"} {
				if strings.Contains(err.Error(), goName) {
					t.Errorf("error names Go's %q:\n%v", goName, err)
				}
			}
		})
	}
}

// FuzzParseModelFile feeds the model file (outside input). It must not
// panic, and what it accepts is a model the control plane's own validation
// accepts, with its values where no engine reads an option (issue 26).
func FuzzParseModelFile(f *testing.F) {
	f.Add("name: demo\nengine: vllm\nmodel: m\nreplicas: 2\nextra_args: [--max-num-seqs, \"8\"]\n")
	f.Add("name: demo\nengine: vllm\nmodel: \"--trust-remote-code\"\nreplicas: 1.5\n")
	f.Add("name: demo\nengine: vllm\nmodel: m\nadapters: [{name: a, path: /a}]\nreplicas: 1e9\n")
	f.Fuzz(func(t *testing.T, doc string) {
		m, err := parseModelFile(strings.NewReader(doc))
		if err != nil {
			return
		}
		if err := fsm.ValidateModel(m); err != nil {
			t.Fatalf("accepted a model validation refuses: %v", err)
		}
		if strings.HasPrefix(m.Model, "-") || m.Replicas > fsm.MaxReplicas {
			t.Fatalf("accepted %v", m)
		}
	})
}

// TestParseModelFileAutoscale: durations become the spec's units, an
// omitted replica count starts at autoscale's min.
func TestParseModelFileAutoscale(t *testing.T) {
	m, err := parseModelFile(strings.NewReader("name: chat\nengine: sim\nmodel: m\nautoscale:\n  min: 2\n  max: 6\n  target_kv_usage: 0.7\n" +
		"  ttft_p90_slo: 800ms\n  scale_down_after: 2m\n  cooldown: 30s\n  hold_timeout: 10m\n  max_held: 50\n  warm_concurrency: 8\n  sleep: true\npriority: -2\npinned: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	a := m.GetAutoscale()
	if m.Replicas != 2 || a.Min != 2 || a.Max != 6 || a.TargetKvUsage != 0.7 || a.TtftP90SloMs != 800 || a.ScaleDownAfterS != 120 ||
		a.CooldownS != 30 || a.HoldTimeoutS != 600 || a.MaxHeld != 50 || a.WarmConcurrency != 8 || !a.Sleep || m.Priority != -2 || !m.Pinned {
		t.Fatalf("model %v", m)
	}
}

// TestExampleModelFiles: every model file in deploy/examples, which the
// README and docs/operations.md apply, is one llmgwctl accepts; the
// embedding example is an embedding model.
func TestExampleModelFiles(t *testing.T) {
	files, err := filepath.Glob("../../deploy/examples/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			in, err := os.Open(f)
			if err != nil {
				t.Fatal(err)
			}
			defer in.Close()
			m, err := parseModelFile(in)
			if err != nil {
				t.Fatal(err)
			}
			if filepath.Base(f) == "embed.yaml" && m.Task != "embed" {
				t.Errorf("task %q, want embed", m.Task)
			}
		})
	}
}
