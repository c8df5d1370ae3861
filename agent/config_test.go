package agent

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/agent/kv"
	"github.com/llmgw/llmgw/agent/supervisor"
	"github.com/llmgw/llmgw/internal/configfile"
	"github.com/llmgw/llmgw/internal/mtls"
)

// problems splits a Validate error into the setting each line names (what
// comes before the first ": "), in order.
func problems(err error) []string {
	if err == nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(err.Error(), "\n") {
		name, _, _ := strings.Cut(line, ": ")
		out = append(out, name)
	}
	return out
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
		want []string // the settings named, in Validate's order
	}{
		{"ok", func(*Config) {}, nil},
		{"node id", func(c *Config) { c.NodeID = "" }, []string{"--node-id (node_id)"}},
		{"no control", func(c *Config) { c.Control = nil }, []string{"--control (control)"}},
		{"control without port", func(c *Config) { c.Control = []string{"c1"} }, []string{"--control (control)"}},
		{"each bad control address", func(c *Config) { c.Control = []string{"c1", "c2:7400", "c3"} },
			[]string{"--control (control)", "--control (control)"}},
		{"advertise with port", func(c *Config) { c.AdvertiseAddr = "10.0.0.1:80" }, []string{"--advertise-addr (advertise_addr)"}},
		{"no advertise", func(c *Config) { c.AdvertiseAddr = "" }, []string{"--advertise-addr (advertise_addr)"}},
		{"data dir", func(c *Config) { c.DataDir = "" }, []string{"--data-dir (data_dir)"}},
		{"http addr", func(c *Config) { c.HTTPAddr = "nope" }, []string{"--http-addr (http_addr)"}},
		{"grpc port", func(c *Config) { c.GRPCAddr = "127.0.0.1:99999" }, []string{"--grpc-addr (grpc_addr)"}},
		{"load interval", func(c *Config) { c.LoadInterval = 0 }, []string{"--load-interval (load_interval)"}},
		{"gpus", func(c *Config) { c.GPUs = -1 }, []string{"--gpus (gpus)"}},
		{"label without key", func(c *Config) { c.Labels = map[string]string{"": "x", "gpu": "a100"} }, []string{"--label (labels)"}},
		{"port range", func(c *Config) { c.PortRange = PortRange{Start: 30000, End: 20000} }, []string{"--port-range (port_range)"}},
		{"port range beyond 65535", func(c *Config) { c.PortRange = PortRange{Start: 60000, End: 70000} }, []string{"--port-range (port_range)"}},
		{"unknown engine", func(c *Config) { c.Engines = map[string]EngineConfig{"tgi": {}} }, []string{"engines.tgi"}},
		{"empty program", func(c *Config) { c.Engines = map[string]EngineConfig{"vllm": {Command: []string{""}}} },
			[]string{"--vllm-command (engines.vllm.command)"}},
		{"bad env name", func(c *Config) { c.Engines = map[string]EngineConfig{"sim": {Env: map[string]string{"A=B": "c"}}} },
			[]string{"engines.sim.env"}},
		{"ready timeout", func(c *Config) { c.ReadyTimeout = 0 }, []string{"--ready-timeout (ready_timeout)"}},
		{"tracing endpoint without port", func(c *Config) { c.Tracing.OTLPEndpoint = "127.0.0.1" },
			[]string{"--otlp-traces-endpoint (otlp_traces_endpoint)"}},
		{"tracing endpoint port 0", func(c *Config) { c.Tracing.OTLPEndpoint = "127.0.0.1:0" },
			[]string{"--otlp-traces-endpoint (otlp_traces_endpoint)"}},
		{"stop grace", func(c *Config) { c.StopGrace = 0 }, []string{"--stop-grace (stop_grace)"}},
		{"heartbeat", func(c *Config) { c.HeartbeatInterval = -time.Second }, []string{"--heartbeat-interval (heartbeat_interval)"}},
		{"drain quiet", func(c *Config) { c.DrainQuiet = 0 }, []string{"--drain-quiet (drain_quiet)"}},
		{"drain timeout", func(c *Config) { c.DrainTimeout = c.DrainQuiet / 2 }, []string{"--drain-timeout (drain_timeout)"}},
		{"probe interval", func(c *Config) { c.ProbeInterval = 0 }, []string{"probe_interval"}},
		{"no offload tier mirrored", func(c *Config) { c.KVMaxOffloadBlocks = 0 }, nil},
		{"negative offload blocks", func(c *Config) { c.KVMaxOffloadBlocks = -1 }, []string{"kv_max_offload_blocks"}},
		{"offload blocks past the bound", func(c *Config) { c.KVMaxOffloadBlocks = 1<<24 + 1 }, []string{"kv_max_offload_blocks"}},
		{"restart backoff", func(c *Config) {
			c.RestartBackoff = supervisor.Backoff{Initial: 0, Max: -1, StableAfter: -1}
		}, []string{"restart_backoff.initial", "restart_backoff.max", "restart_backoff.stable_after"}},
		{"reconnect", func(c *Config) { c.ReconnectInitial, c.ReconnectMax = time.Second, time.Millisecond }, []string{"reconnect_max"}},
		{"grpc beyond loopback without TLS", func(c *Config) { c.GRPCAddr = "0.0.0.0:7405" }, []string{"--grpc-addr (grpc_addr) 0.0.0.0:7405"}},
		{"http on every interface without TLS", func(c *Config) { c.HTTPAddr = ":7404" }, []string{"--http-addr (http_addr) :7404"}},
		{"beyond loopback with --insecure", func(c *Config) { c.GRPCAddr, c.HTTPAddr, c.Insecure = "0.0.0.0:7405", "10.0.0.1:7404", true }, nil},
		{"beyond loopback with TLS", func(c *Config) {
			c.GRPCAddr, c.HTTPAddr = "0.0.0.0:7405", "0.0.0.0:7404"
			c.TLS = mtls.Files{CA: "ca.pem", Cert: "n1.pem", Key: "n1-key.pem"}
		}, nil},
		{"half a TLS setup", func(c *Config) { c.TLS.CA = "ca.pem" }, []string{"--tls-cert (tls_cert)", "--tls-key (tls_key)"}},
		{"several problems at once", func(c *Config) {
			c.NodeID = ""
			c.AdvertiseAddr = "10.0.0.1:80"
			c.PortRange = PortRange{Start: 0, End: 10}
			c.Engines = map[string]EngineConfig{"tgi": {}, "llamacpp": {Command: []string{""}}}
			c.StopGrace = 0
			c.ReconnectInitial = 0
		}, []string{
			"--node-id (node_id)", "--advertise-addr (advertise_addr)", "--port-range (port_range)",
			"--llamacpp-command (engines.llamacpp.command)", "engines.tgi",
			"--stop-grace (stop_grace)", "reconnect_initial",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			c.NodeID = "n1"
			tt.edit(&c)
			err := c.Validate()
			if got := problems(err); !slices.Equal(got, tt.want) {
				t.Fatalf("Validate names %q, want %q; error:\n%v", got, tt.want, err)
			}
		})
	}
}

// fullFile sets every key of the agent's --config file to a value other
// than its default; TestConfigFileKeys checks that it does.
const fullFile = `
node_id: gpu-7
otlp_traces_endpoint: 127.0.0.1:4317
trace_insecure: true
control: [10.0.0.1:7400, 10.0.0.2:7400]
advertise_addr: 10.0.1.7
data_dir: /var/lib/llmgw-agent
http_addr: 0.0.0.0:9404
grpc_addr: 0.0.0.0:9405
load_interval: 100ms
gpus: 8
labels: {gpu: a100, zone: eu-1}
port_range: 30000-30999
engines:
  vllm:
    command: [/opt/vllm/bin/vllm, serve]
    env: {HF_HOME: /models}
  sim:
    command: [/usr/bin/llmgw, sim]
stop_engines_on_exit: true
ready_timeout: 20m
stop_grace: 30s
heartbeat_interval: 1s
drain_quiet: 2s
drain_timeout: 10m
kv_max_frame_bytes: 1048576
kv_events_tcp: true
kv_stream_timeout: 7s
kv_max_offload_blocks: 4194304
probe_interval: 2s
restart_backoff: {initial: 1s, max: 1m, stable_after: 5m}
reconnect_initial: 500ms
reconnect_max: 20s
tls_ca: /etc/llmgw/ca.pem
tls_cert: /etc/llmgw/gpu-7.pem
tls_key: /etc/llmgw/gpu-7-key.pem
insecure: true
`

// TestEngineTraceURL: the engines get the agent's collector as a URL
// whose scheme says plain text or TLS, as vLLM's exporter reads it.
func TestEngineTraceURL(t *testing.T) {
	for _, tt := range []struct {
		cfg  TracingConfig
		want string
	}{
		{TracingConfig{}, ""},
		{TracingConfig{OTLPEndpoint: "127.0.0.1:4317"}, "http://127.0.0.1:4317"},
		{TracingConfig{OTLPEndpoint: "[::1]:4317"}, "http://[::1]:4317"},
		{TracingConfig{OTLPEndpoint: "localhost:4317", Insecure: true}, "http://localhost:4317"},
	} {
		if got := engineTraceURL(tt.cfg); got != tt.want {
			t.Errorf("engineTraceURL(%+v) = %q, want %q", tt.cfg, got, tt.want)
		}
	}
}

func TestConfigFileKeys(t *testing.T) {
	got := DefaultConfig()
	if err := configfile.Decode(strings.NewReader(fullFile), &got); err != nil {
		t.Fatalf("decode: %v", err)
	}
	want := Config{
		NodeID:        "gpu-7",
		Control:       []string{"10.0.0.1:7400", "10.0.0.2:7400"},
		AdvertiseAddr: "10.0.1.7",
		DataDir:       "/var/lib/llmgw-agent",
		HTTPAddr:      "0.0.0.0:9404",
		GRPCAddr:      "0.0.0.0:9405",
		LoadInterval:  100 * time.Millisecond,
		GPUs:          8,
		Labels:        map[string]string{"gpu": "a100", "zone": "eu-1"},
		PortRange:     PortRange{Start: 30000, End: 30999},
		Engines: map[string]EngineConfig{
			"vllm": {Command: []string{"/opt/vllm/bin/vllm", "serve"}, Env: map[string]string{"HF_HOME": "/models"}},
			"sim":  {Command: []string{"/usr/bin/llmgw", "sim"}},
		},
		StopEnginesOnExit:  true,
		ReadyTimeout:       20 * time.Minute,
		StopGrace:          30 * time.Second,
		HeartbeatInterval:  time.Second,
		DrainQuiet:         2 * time.Second,
		DrainTimeout:       10 * time.Minute,
		KVMaxFrameBytes:    1 << 20,
		KVTCP:              true,
		KVStreamTimeout:    7 * time.Second,
		KVMaxOffloadBlocks: 4 << 20,
		ProbeInterval:      2 * time.Second,
		RestartBackoff:     supervisor.Backoff{Initial: time.Second, Max: time.Minute, StableAfter: 5 * time.Minute},
		ReconnectInitial:   500 * time.Millisecond,
		ReconnectMax:       20 * time.Second,
		TLS:                mtls.Files{CA: "/etc/llmgw/ca.pem", Cert: "/etc/llmgw/gpu-7.pem", Key: "/etc/llmgw/gpu-7-key.pem"},
		Insecure:           true,
		Tracing:            TracingConfig{OTLPEndpoint: "127.0.0.1:4317", Insecure: true},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded\n%+v\nwant\n%+v", got, want)
	}
	if err := got.Validate(); err != nil {
		t.Fatalf("the full file does not validate: %v", err)
	}
	// Every key is in the file: each tagged setting of want differs from
	// its default, so one left out of fullFile would have decoded to the
	// default and failed the comparison above.
	for _, key := range unchangedKeys(t, reflect.ValueOf(want), reflect.ValueOf(DefaultConfig()), "") {
		t.Errorf("fullFile leaves %s at its default: add it", key)
	}
}

// unchangedKeys returns the file keys whose value in got equals the one in
// def, descending into nested structs and into every entry of a map of
// structs (a field counts as set if some entry sets it). It fails the test
// for an exported field without a yaml tag, which would be read under a
// key nobody chose.
func unchangedKeys(t *testing.T, got, def reflect.Value, prefix string) []string {
	t.Helper()
	var out []string
	typ := got.Type()
	for i := range typ.NumField() {
		f := typ.Field(i)
		tag, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch {
		case !f.IsExported() || tag == "-":
			continue
		case tag == "" && opts == "inline":
			out = append(out, unchangedKeys(t, got.Field(i), def.Field(i), prefix)...)
			continue
		case tag == "":
			t.Errorf("%s%s has no yaml tag", prefix, f.Name)
			continue
		}
		key := prefix + tag
		g, d := got.Field(i), def.Field(i)
		switch {
		case f.Type.Kind() == reflect.Struct && !reflect.PointerTo(f.Type).Implements(reflect.TypeFor[interface{ UnmarshalText([]byte) error }]()):
			out = append(out, unchangedKeys(t, g, d, key+".")...)
		case f.Type.Kind() == reflect.Map && f.Type.Elem().Kind() == reflect.Struct:
			if g.Len() == 0 {
				out = append(out, key)
				continue
			}
			zero := reflect.New(f.Type.Elem()).Elem()
			var entries [][]string
			for _, k := range g.MapKeys() {
				entries = append(entries, unchangedKeys(t, g.MapIndex(k), zero, key+".*."))
			}
			// Unset in every entry.
			for _, k := range entries[0] {
				if !slices.ContainsFunc(entries[1:], func(e []string) bool { return !slices.Contains(e, k) }) {
					out = append(out, k)
				}
			}
		case reflect.DeepEqual(g.Interface(), d.Interface()):
			out = append(out, key)
		}
	}
	return out
}

func TestConfigFileRefuses(t *testing.T) {
	tests := []struct {
		name, file, want string
	}{
		{"unknown key", "node_idd: x\n", "node_idd"},
		{"unknown engine key", "engines: {vllm: {cmd: [vllm]}}\n", "cmd"},
		{"port range not start-end", "port_range: 20000\n", "port_range"},
		{"duration without unit", "stop_grace: 30\n", "time.Duration"},
		{"version is not configured", "version: v9\n", "version"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			err := configfile.Decode(strings.NewReader(tt.file), &c)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("decode %q = %v, want an error naming %s", tt.file, err, tt.want)
			}
			if !reflect.DeepEqual(c, DefaultConfig()) {
				t.Fatalf("a refused file changed the config: %+v", c)
			}
		})
	}
}

func TestPortRange(t *testing.T) {
	tests := []struct {
		in      string
		want    PortRange
		wantErr bool
	}{
		{"20000-20999", PortRange{20000, 20999}, false},
		{" 1 - 2 ", PortRange{1, 2}, false},
		{"20000", PortRange{}, true},
		{"a-b", PortRange{}, true},
		{"1-2-3", PortRange{}, true},
	}
	for _, tt := range tests {
		var r PortRange
		err := r.Set(tt.in)
		if (err != nil) != tt.wantErr || r != tt.want {
			t.Errorf("Set(%q) = %v, %v; want %v (error %v)", tt.in, r, err, tt.want, tt.wantErr)
		}
		if err == nil && r.String() != strings.ReplaceAll(tt.in, " ", "") {
			t.Errorf("Set(%q).String() = %q", tt.in, r.String())
		}
	}
}

// TestKVMaxOffloadBlocks: kv_max_offload_blocks reaches the replica set
// as it reads it, 0 (no offload tier) as a negative value.
func TestKVMaxOffloadBlocks(t *testing.T) {
	for _, tt := range []struct{ key, want int }{{1 << 20, 1 << 20}, {4 << 20, 4 << 20}, {0, -1}} {
		c := DefaultConfig()
		c.KVMaxOffloadBlocks = tt.key
		if got := c.replicasConfig().KVMaxOffloadBlocks; got != tt.want {
			t.Errorf("kv_max_offload_blocks %d: replicas.Config has %d, want %d", tt.key, got, tt.want)
		}
	}
	if got := DefaultConfig().KVMaxOffloadBlocks; got != kv.DefaultMaxOffloadBlocks {
		t.Errorf("default %d, want the listener's %d", got, kv.DefaultMaxOffloadBlocks)
	}
}
