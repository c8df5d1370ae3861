package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/llmgw/llmgw/agent"
)

// agentConfig parses args as `llmgw agent` does and returns the config it
// would run with. A "FILE" argument is replaced by a file holding file.
func agentConfig(t *testing.T, file string, args ...string) (agent.Config, error) {
	t.Helper()
	if file != "" {
		path := filepath.Join(t.TempDir(), "agent.yaml")
		if err := os.WriteFile(path, []byte(file), 0o644); err != nil {
			t.Fatal(err)
		}
		for i, a := range args {
			args[i] = strings.ReplaceAll(a, "FILE", path)
		}
	}
	fs := pflag.NewFlagSet("agent", pflag.ContinueOnError)
	af := bindAgentFlags(fs)
	if err := fs.Parse(args); err != nil {
		return agent.Config{}, err
	}
	return af.config(fs)
}

const agentFile = `
node_id: from-file
control: [10.0.0.1:7400]
advertise_addr: 10.0.1.7
gpus: 4
labels: {gpu: a100, zone: eu-1}
port_range: 30000-30999
engines:
  vllm:
    command: [/opt/vllm/bin/vllm, serve]
    env: {HF_HOME: /models}
  sim:
    command: [/usr/bin/llmgw, sim]
stop_grace: 30s
reconnect_max: 20s
`

func TestAgentConfigSources(t *testing.T) {
	fromFile := func() agent.Config {
		c := agent.DefaultConfig()
		c.NodeID = "from-file"
		c.Control = []string{"10.0.0.1:7400"}
		c.AdvertiseAddr = "10.0.1.7"
		c.GPUs = 4
		c.Labels = map[string]string{"gpu": "a100", "zone": "eu-1"}
		c.PortRange = agent.PortRange{Start: 30000, End: 30999}
		c.Engines = map[string]agent.EngineConfig{
			"vllm": {Command: []string{"/opt/vllm/bin/vllm", "serve"}, Env: map[string]string{"HF_HOME": "/models"}},
			"sim":  {Command: []string{"/usr/bin/llmgw", "sim"}},
		}
		c.StopGrace = 30 * time.Second
		c.ReconnectMax = 20 * time.Second
		c.Version = version
		return c
	}
	tests := []struct {
		name string
		file string
		args []string
		want func() agent.Config
	}{
		{"flags only", "", []string{"--node-id", "n1", "--label", "gpu=h100", "--label", "rack=r2",
			"--port-range", "21000-21099", "--llamacpp-command", "llama-server --verbose", "--control", "a:1,b:2"},
			func() agent.Config {
				c := agent.DefaultConfig()
				c.NodeID = "n1"
				c.Control = []string{"a:1", "b:2"}
				c.Labels = map[string]string{"gpu": "h100", "rack": "r2"}
				c.PortRange = agent.PortRange{Start: 21000, End: 21099}
				c.Engines = map[string]agent.EngineConfig{"llamacpp": {Command: []string{"llama-server", "--verbose"}}}
				c.Version = version
				return c
			}},
		{"file only", agentFile, []string{"--config", "FILE"}, fromFile},
		{"flags win over the file", agentFile, []string{"--config", "FILE", "--node-id", "n2", "--control", "c:1",
			"--gpus", "0", "--port-range", "40000-40009", "--label", "gpu=h100", "--vllm-command", "vllm serve --x",
			"--stop-grace", "5s"},
			func() agent.Config {
				c := fromFile()
				c.NodeID = "n2"
				c.Control = []string{"c:1"}
				c.GPUs = 0
				c.PortRange = agent.PortRange{Start: 40000, End: 40009}
				c.Labels = map[string]string{"gpu": "h100"}
				// The command is the flag's; the file's env stays.
				c.Engines["vllm"] = agent.EngineConfig{Command: []string{"vllm", "serve", "--x"}, Env: map[string]string{"HF_HOME": "/models"}}
				c.StopGrace = 5 * time.Second
				return c
			}},
		{"an empty command flag drops the file's command", agentFile, []string{"--config", "FILE", "--sim-command", ""},
			func() agent.Config {
				c := fromFile()
				delete(c.Engines, "sim")
				return c
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := agentConfig(t, tt.file, tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			if want := tt.want(); !reflect.DeepEqual(got, want) {
				t.Fatalf("config\n%+v\nwant\n%+v", got, want)
			}
			if err := got.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
		})
	}
}

func TestAgentConfigRefuses(t *testing.T) {
	tests := []struct {
		name string
		file string
		args []string
		want string
	}{
		{"unknown file key", "node_idd: x\n", []string{"--config", "FILE"}, "node_idd"},
		{"bad file port range", "port_range: 1\n", []string{"--config", "FILE"}, "port_range"},
		{"missing file", "", []string{"--config", "/nonexistent/agent.yaml"}, "--config"},
		{"bad label flag", "", []string{"--label", "gpu"}, "--label"},
		{"bad port range flag", "", []string{"--port-range", "20000"}, "--port-range"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := agentConfig(t, tt.file, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one naming %s", err, tt.want)
			}
		})
	}
}
