package agent

import (
	"fmt"
	"maps"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/llmgw/llmgw/agent/drain"
	"github.com/llmgw/llmgw/agent/engine"
	"github.com/llmgw/llmgw/agent/kv"
	"github.com/llmgw/llmgw/agent/kv/zmtp"
	"github.com/llmgw/llmgw/agent/replicas"
	"github.com/llmgw/llmgw/agent/session"
	"github.com/llmgw/llmgw/agent/supervisor"
	"github.com/llmgw/llmgw/internal/configfile"
	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/tracing"
)

// EngineConfig overrides how one engine kind is run on this node. In the
// --config file it is engines.<kind>: {command: [...], env: {...}}.
type EngineConfig struct {
	// Command is the program and its leading arguments; empty means the
	// driver's default (vllm, llama-server, this binary's `sim`). It is how
	// tests run the vLLM driver against the simulator.
	Command []string `yaml:"command"`
	// Env is added to every such engine's environment, after the driver's.
	Env map[string]string `yaml:"env"`
}

// PortRange is an inclusive range of TCP ports. It is written start-end
// ("20000-20999") both on the command line and in the --config file: it
// implements encoding.TextUnmarshaler for the file and pflag.Value (Set,
// String, Type) for the flag, so the two spell it the same way.
type PortRange struct {
	Start int `yaml:"start"`
	End   int `yaml:"end"`
}

// String returns the range as start-end.
func (r PortRange) String() string { return fmt.Sprintf("%d-%d", r.Start, r.End) }

// Set parses start-end. It does not check the bounds: Validate does, so
// that a bad range is reported with every other problem.
func (r *PortRange) Set(s string) error {
	a, b, ok := strings.Cut(s, "-")
	start, err1 := strconv.Atoi(strings.TrimSpace(a))
	end, err2 := strconv.Atoi(strings.TrimSpace(b))
	if !ok || err1 != nil || err2 != nil {
		return fmt.Errorf("%q is not start-end", s)
	}
	r.Start, r.End = start, end
	return nil
}

// Type names the flag's value in --help.
func (*PortRange) Type() string { return "start-end" }

// UnmarshalText reads the file's port_range.
func (r *PortRange) UnmarshalText(b []byte) error {
	if err := r.Set(string(b)); err != nil {
		return fmt.Errorf("port_range: %w", err)
	}
	return nil
}

// MarshalText writes the range as the file spells it.
func (r PortRange) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// Config is an agent's configuration. The yaml tags are the keys of
// `llmgw agent --config`: the flag names with underscores, except --label
// (labels: {k: v}) and --<kind>-command (engines.<kind>.command). Errors
// from Validate name both the flag and the key.
type Config struct {
	// NodeID names this node in the cluster. Required.
	NodeID string `yaml:"node_id"`
	// Control lists control-node gRPC addresses (host:port); the agent uses
	// one at a time and learns the rest from the control plane (design §5.6).
	Control []string `yaml:"control"`
	// AdvertiseAddr is the node's address (no port): engines listen on it
	// and routers reach them there (design §6 "Addresses").
	AdvertiseAddr string `yaml:"advertise_addr"`
	// DataDir keeps the session epoch, port assignments, engine logs and
	// the records of running engines the next agent re-adopts (design §6).
	DataDir string `yaml:"data_dir"`
	// HTTPAddr serves /metrics, /healthz and /readyz.
	HTTPAddr string `yaml:"http_addr"`
	// GRPCAddr serves LoadService to routers (design §6 "Load snapshots").
	// Routers are told AdvertiseAddr with the port actually bound, so port
	// 0 works.
	GRPCAddr string `yaml:"grpc_addr"`
	// LoadInterval spaces the reads of each engine's /metrics and the
	// snapshots sent to routers.
	LoadInterval time.Duration `yaml:"load_interval"`
	// GPUs is how many GPUs the node offers the scheduler.
	GPUs int `yaml:"gpus"`
	// Labels are the node's labels, which placement constraints match.
	Labels map[string]string `yaml:"labels"`
	// Version is the agent's build, reported to the control plane; set by
	// the binary, not configured.
	Version string `yaml:"-"`
	// PortRange is where engine ports come from.
	PortRange PortRange `yaml:"port_range"`
	// Engines is keyed by engine name: vllm, llamacpp, sim.
	Engines map[string]EngineConfig `yaml:"engines"`
	// StopEnginesOnExit stops every engine before Run returns, and has the
	// kernel kill them should the agent die. Otherwise engines outlive the
	// agent (design §6).
	StopEnginesOnExit bool `yaml:"stop_engines_on_exit"`
	// ReadyTimeout bounds an engine's start.
	ReadyTimeout time.Duration `yaml:"ready_timeout"`
	// StopGrace is SIGTERM's grace before SIGKILL.
	StopGrace time.Duration `yaml:"stop_grace"`
	// HeartbeatInterval spaces heartbeats; three missed is a dead server.
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`
	// DrainQuiet is how long a draining replica's engine must show no
	// request running or waiting before it is stopped; DrainTimeout stops
	// it however busy it is (package drain).
	DrainQuiet   time.Duration `yaml:"drain_quiet"`
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// KVMaxFrameBytes caps a frame, and a message's frames together, that
	// an engine's KV-event sockets accept (design §11 "Limits"): a peer
	// declaring more loses its connection before anything is allocated.
	KVMaxFrameBytes uint64 `yaml:"kv_max_frame_bytes"`
	// KVTCP puts the KV-event sockets of engines the agent runs on
	// loopback TCP (guarded by the peer's user) instead of Unix sockets in
	// data_dir/kv, mode 0700 (design §6 "KV events"): for an engine build
	// that cannot bind ipc endpoints.
	KVTCP bool `yaml:"kv_events_tcp"`
	// KVStreamTimeout is how long an external engine's KV-event publisher
	// has to connect (or be connected to) before its replica is marked
	// untrusted and routed by tier 1 (design §6 "External engines").
	KVStreamTimeout time.Duration `yaml:"kv_stream_timeout"`
	// KVMaxOffloadBlocks caps the blocks each replica's KV mirror holds in
	// its engine's offload tiers, CPU and storage together (design §7.5
	// step 6): vLLM does not report their size, so past this the replica
	// is untrusted and routed by tier 1. 0 mirrors no offload tier.
	// Raised past its default (2^20, about 150 MB of mirror per replica),
	// the control plane's agent_kv_blocks_per_replica (every tier counted)
	// must be raised with it. Key only (no flag): kv_max_offload_blocks.
	KVMaxOffloadBlocks int `yaml:"kv_max_offload_blocks"`
	// TLS is the CA, certificate and key (--tls-ca, --tls-cert, --tls-key;
	// design §11). Given, the agent dials control servers over mutual TLS,
	// demanding a server certificate, and serves LoadService to routers
	// only; its own certificate must be of role agent and name NodeID, the
	// one node a control server lets it attach as. Empty is plain text.
	TLS mtls.Files `yaml:",inline"`
	// Insecure lets the agent listen beyond loopback without TLS. Without
	// it a plain-text --grpc-addr or --http-addr beyond loopback is refused
	// at start: anyone who can reach them could read the node's load and
	// engines' logs, and routers could not tell this agent from another.
	Insecure bool `yaml:"insecure"`
	// Tracing, when its otlp_endpoint is given (--otlp-traces-endpoint),
	// has the engines the agent starts send their spans there (vLLM's
	// --otlp-traces-endpoint): they join the routers' traces (design §9
	// "Tracing").
	Tracing TracingConfig `yaml:",inline"`

	// The settings below have no flag; only the file sets them.

	// ProbeInterval spaces engine health probes.
	ProbeInterval time.Duration `yaml:"probe_interval"`
	// RestartBackoff spaces restarts of a crashing engine.
	RestartBackoff supervisor.Backoff `yaml:"restart_backoff"`
	// ReconnectInitial doubles per failed session up to ReconnectMax, with
	// jitter, so a fleet of agents does not stampede a recovering server.
	ReconnectInitial time.Duration `yaml:"reconnect_initial"`
	ReconnectMax     time.Duration `yaml:"reconnect_max"`
	// Jitter returns a value in [0, 1); nil means math/rand/v2. Tests inject
	// it to make reconnect delays deterministic.
	Jitter func() float64 `yaml:"-"`
	// Now is the clock used for epochs; nil means time.Now.
	Now func() time.Time `yaml:"-"`
	// Resolver resolves external engines' host names each time the agent
	// connects to one (design §6 "External engines"); nil means
	// net.DefaultResolver. Tests inject it to resolve names without DNS.
	Resolver replicas.Resolver `yaml:"-"`
}

// DefaultConfig returns the defaults of design §5.6 and §6.
func DefaultConfig() Config {
	return Config{
		Control:            []string{"127.0.0.1:7400"},
		AdvertiseAddr:      "127.0.0.1",
		DataDir:            "llmgw-agent",
		HTTPAddr:           "127.0.0.1:7404", // 7400-7403 are a control node's
		GRPCAddr:           "127.0.0.1:7405",
		LoadInterval:       50 * time.Millisecond,
		PortRange:          PortRange{Start: 20000, End: 20999},
		ReadyTimeout:       10 * time.Minute,
		StopGrace:          10 * time.Second,
		HeartbeatInterval:  500 * time.Millisecond,
		DrainQuiet:         drain.DefaultConfig().Quiet,
		DrainTimeout:       drain.DefaultConfig().Timeout,
		KVMaxFrameBytes:    zmtp.DefaultMaxMessageBytes,
		KVStreamTimeout:    replicas.DefaultKVStreamTimeout,
		KVMaxOffloadBlocks: kv.DefaultMaxOffloadBlocks,
		ProbeInterval:      time.Second,
		RestartBackoff:     supervisor.DefaultBackoff(),
		ReconnectInitial:   250 * time.Millisecond,
		ReconnectMax:       10 * time.Second,
	}
}

// Validate reports every problem at once (errors.Join), so an operator
// fixes a configuration in one pass rather than one error per start. Each
// problem starts with the setting it is about: the flag of `llmgw agent`
// and the key of its --config file ("--data-dir (data_dir): required"), or
// the key alone for the settings only the file sets.
func (c *Config) Validate() error {
	var p configfile.Problems
	positive := func(name string, d time.Duration) {
		if d <= 0 {
			p.Add(name, "must be positive, got %s", d)
		}
	}
	listenAddr := func(name, addr string) {
		if _, port, err := net.SplitHostPort(addr); err != nil {
			p.Add(name, "%q is not host:port: %w", addr, err)
		} else if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			p.Add(name, "bad port %q", port)
		}
	}

	if c.NodeID == "" {
		p.Add(configfile.Flag("node-id"), "required")
	}
	if len(c.Control) == 0 {
		p.Add(configfile.Flag("control"), "at least one control address is required")
	}
	for _, a := range c.Control {
		if _, _, err := net.SplitHostPort(a); err != nil {
			p.Add(configfile.Flag("control"), "%q is not host:port: %w", a, err)
		}
	}
	if c.AdvertiseAddr == "" {
		p.Add(configfile.Flag("advertise-addr"), "required")
	} else if _, _, err := net.SplitHostPort(c.AdvertiseAddr); err == nil {
		p.Add(configfile.Flag("advertise-addr"), "%q must be an address without a port", c.AdvertiseAddr)
	}
	if c.DataDir == "" {
		p.Add(configfile.Flag("data-dir"), "required")
	}
	listenAddr(configfile.Flag("http-addr"), c.HTTPAddr)
	listenAddr(configfile.Flag("grpc-addr"), c.GRPCAddr)
	positive(configfile.Flag("load-interval"), c.LoadInterval)
	if c.GPUs < 0 {
		p.Add(configfile.Flag("gpus"), "must not be negative, got %d", c.GPUs)
	}
	if _, ok := c.Labels[""]; ok {
		p.Add(configfile.FlagKey("label", "labels"), "a label needs a key")
	}
	if r := c.PortRange; r.Start < 1 || r.End > 65535 || r.Start > r.End {
		p.Add(configfile.Flag("port-range"), "%s is not a range within 1-65535", r)
	}
	for _, name := range slices.Sorted(maps.Keys(c.Engines)) {
		e := c.Engines[name]
		switch name {
		case engine.VLLM, engine.LlamaCpp, engine.Sim:
		default:
			p.Add("engines."+name, "unknown engine (known: %s, %s, %s)", engine.VLLM, engine.LlamaCpp, engine.Sim)
			continue
		}
		if len(e.Command) > 0 && e.Command[0] == "" {
			p.Add(configfile.FlagKey(name+"-command", "engines."+name+".command"), "empty program")
		}
		for _, k := range slices.Sorted(maps.Keys(e.Env)) {
			if k == "" || strings.ContainsAny(k, "=\x00") {
				p.Add("engines."+name+".env", "%q is not an environment variable name", k)
			}
		}
	}
	positive(configfile.Flag("ready-timeout"), c.ReadyTimeout)
	positive(configfile.Flag("stop-grace"), c.StopGrace)
	positive(configfile.Flag("heartbeat-interval"), c.HeartbeatInterval)
	// What drain.Config.Validate checks, named for the agent's user.
	positive(configfile.Flag("drain-quiet"), c.DrainQuiet)
	if c.DrainTimeout < c.DrainQuiet {
		p.Add(configfile.Flag("drain-timeout"), "%s must be at least --drain-quiet %s", c.DrainTimeout, c.DrainQuiet)
	}
	// A vLLM batch for a long prompt is about a megabyte; 1 GiB is past
	// any use and still well below what a 64-bit length could claim.
	if c.KVMaxFrameBytes < 64<<10 || c.KVMaxFrameBytes > 1<<30 {
		p.Add(configfile.Flag("kv-max-frame-bytes"), "must be between 65536 and 1073741824, got %d", c.KVMaxFrameBytes)
	}
	positive("probe_interval", c.ProbeInterval)
	positive(configfile.Flag("kv-stream-timeout"), c.KVStreamTimeout)
	if c.KVMaxOffloadBlocks < 0 || c.KVMaxOffloadBlocks > maxKVOffloadBlocks {
		p.Add("kv_max_offload_blocks", "must be between 0 and %d, got %d", maxKVOffloadBlocks, c.KVMaxOffloadBlocks)
	}
	positive("restart_backoff.initial", c.RestartBackoff.Initial)
	if c.RestartBackoff.Max < c.RestartBackoff.Initial {
		p.Add("restart_backoff.max", "%s must be at least restart_backoff.initial %s", c.RestartBackoff.Max, c.RestartBackoff.Initial)
	}
	if c.RestartBackoff.StableAfter < 0 {
		p.Add("restart_backoff.stable_after", "must not be negative, got %s", c.RestartBackoff.StableAfter)
	}
	positive("reconnect_initial", c.ReconnectInitial)
	if c.ReconnectMax < c.ReconnectInitial {
		p.Add("reconnect_max", "%s must be at least reconnect_initial %s", c.ReconnectMax, c.ReconnectInitial)
	}
	for _, f := range c.TLS.Missing() {
		p.Add(configfile.Flag(f), "required when any of --tls-ca, --tls-cert, --tls-key is given")
	}
	if !c.TLS.Enabled() {
		for _, l := range []struct{ flag, addr string }{{"grpc-addr", c.GRPCAddr}, {"http-addr", c.HTTPAddr}} {
			if _, _, err := net.SplitHostPort(l.addr); err == nil { // else reported above
				p.Join(mtls.CheckListen(configfile.Flag(l.flag), l.addr, nil, c.Insecure))
			}
		}
	}
	if c.Tracing.OTLPEndpoint != "" {
		if err := tracing.CheckEndpoint(c.Tracing.OTLPEndpoint); err != nil {
			p.Add(configfile.Flag("otlp-traces-endpoint"), "%w", err)
		}
	}
	return p.Err()
}

// maxKVOffloadBlocks bounds kv_max_offload_blocks: 16 Mi blocks is some
// 2.4 GB of mirror per replica, past any host's CPU tier of 16-token
// blocks for a model worth routing by prefix.
const maxKVOffloadBlocks = 1 << 24

// kvOffloadBlocks is kv_max_offload_blocks as replicas.Config takes it,
// where 0 is the listener's default and a negative value none.
func kvOffloadBlocks(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// replicasConfig is the replica set's part of c.
func (c *Config) replicasConfig() replicas.Config {
	engines := make(map[string]replicas.Engine, len(c.Engines))
	for name, e := range c.Engines {
		engines[name] = replicas.Engine{Command: e.Command, Env: e.Env}
	}
	return replicas.Config{
		NodeID: c.NodeID, AdvertiseAddr: c.AdvertiseAddr, DataDir: c.DataDir, LogDir: c.logDir(),
		Engines: engines, StopEnginesOnExit: c.StopEnginesOnExit,
		ReadyTimeout: c.ReadyTimeout, StopGrace: c.StopGrace, ProbeInterval: c.ProbeInterval, RestartBackoff: c.RestartBackoff,
		Drain:           drain.Config{Quiet: c.DrainQuiet, Timeout: c.DrainTimeout, Now: c.Now},
		KVMaxFrameBytes: c.KVMaxFrameBytes, KVTCP: c.KVTCP, KVStreamTimeout: c.KVStreamTimeout, Now: c.Now, Resolver: c.Resolver,
		KVMaxOffloadBlocks: kvOffloadBlocks(c.KVMaxOffloadBlocks),
		OTLPTracesEndpoint: engineTraceURL(c.Tracing),
	}
}

// TracingConfig is the agent's tracing: only where its engines send their
// spans. The engines sample as their callers decided (parent-based), so
// the agent has no sampling ratio, and it starts no spans of its own.
type TracingConfig struct {
	// OTLPEndpoint is the host:port of an OTLP/gRPC trace receiver; empty:
	// the engines are given none.
	OTLPEndpoint string `yaml:"otlp_traces_endpoint"`
	// Insecure has the engines send in plain text beyond loopback.
	Insecure bool `yaml:"trace_insecure"`
}

// engineTraceURL is --otlp-traces-endpoint as vLLM's exporter reads it: an
// http:// URL for plain text (a collector on loopback, or insecure), an
// https:// one for TLS; "" when tracing is off.
func engineTraceURL(t TracingConfig) string {
	switch {
	case t.OTLPEndpoint == "":
		return ""
	case t.Insecure || tracing.IsLoopback(t.OTLPEndpoint):
		return "http://" + t.OTLPEndpoint
	}
	return "https://" + t.OTLPEndpoint
}

// sessionConfig is the control session's part of c.
func (c *Config) sessionConfig(tls *mtls.Source) session.Config {
	return session.Config{
		NodeID: c.NodeID, Control: c.Control, EpochPath: filepath.Join(c.DataDir, "epoch"),
		HeartbeatInterval: c.HeartbeatInterval, ReconnectInitial: c.ReconnectInitial, ReconnectMax: c.ReconnectMax,
		Jitter: c.Jitter, TLS: tls, Now: c.Now,
	}
}

// logDir holds the engines' output, a file per replica.
func (c *Config) logDir() string { return filepath.Join(c.DataDir, "logs") }
