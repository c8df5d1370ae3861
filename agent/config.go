package agent

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/llmgw/llmgw/agent/drain"
	"github.com/llmgw/llmgw/agent/engine"
	"github.com/llmgw/llmgw/agent/supervisor"
)

// EngineConfig overrides how one engine kind is run on this node.
type EngineConfig struct {
	// Command is the program and its leading arguments; empty means the
	// driver's default (vllm, llama-server, this binary's `sim`). It is how
	// tests run the vLLM driver against the simulator.
	Command []string
	// Env is added to every such engine's environment, after the driver's.
	Env map[string]string
}

// Config is an agent's configuration. Errors from Validate name the flag of
// `llmgw agent` that sets the field.
type Config struct {
	// NodeID names this node in the cluster. Required.
	NodeID string
	// Control lists control-node gRPC addresses (host:port); the agent uses
	// one at a time and learns the rest from the control plane (plan §5.6).
	Control []string
	// AdvertiseAddr is the node's address (no port): engines listen on it
	// and routers reach them there (plan §6 "Addresses").
	AdvertiseAddr string
	// DataDir keeps the session epoch, port assignments, engine logs and
	// the records of running engines the next agent re-adopts (plan §6).
	DataDir string
	// HTTPAddr serves /metrics, /healthz and /readyz.
	HTTPAddr string
	// GRPCAddr serves LoadService to routers (plan §6 "Load snapshots").
	// Routers are told AdvertiseAddr with the port actually bound, so port
	// 0 works.
	GRPCAddr string
	// LoadInterval spaces the reads of each engine's /metrics and the
	// snapshots sent to routers.
	LoadInterval time.Duration
	GPUs         int
	Labels       map[string]string
	Version      string
	// PortRangeStart..PortRangeEnd (inclusive) is where engine ports come
	// from.
	PortRangeStart, PortRangeEnd int
	// Engines is keyed by engine name: vllm, llamacpp, sim.
	Engines map[string]EngineConfig
	// StopEnginesOnExit stops every engine before Run returns, and has the
	// kernel kill them should the agent die. Otherwise engines outlive the
	// agent (plan §6).
	StopEnginesOnExit bool
	// ReadyTimeout bounds an engine's start; StopGrace is SIGTERM's grace.
	ReadyTimeout, StopGrace time.Duration
	// HeartbeatInterval spaces heartbeats; three missed is a dead server.
	HeartbeatInterval time.Duration
	// DrainQuiet is how long a draining replica's engine must show no
	// request running or waiting before it is stopped; DrainTimeout stops
	// it however busy it is (package drain).
	DrainQuiet, DrainTimeout time.Duration

	// ProbeInterval spaces engine health probes.
	ProbeInterval time.Duration
	// RestartBackoff spaces restarts of a crashing engine.
	RestartBackoff supervisor.Backoff
	// ReconnectInitial doubles per failed session up to ReconnectMax, with
	// jitter, so a fleet of agents does not stampede a recovering server.
	ReconnectInitial, ReconnectMax time.Duration
	// Jitter returns a value in [0, 1); nil means math/rand/v2. Tests inject
	// it to make reconnect delays deterministic.
	Jitter func() float64
	// Now is the clock used for epochs; nil means time.Now.
	Now func() time.Time
}

// DefaultConfig returns the defaults of plan §5.6 and §6.
func DefaultConfig() Config {
	return Config{
		Control:           []string{"127.0.0.1:7400"},
		AdvertiseAddr:     "127.0.0.1",
		DataDir:           "llmgw-agent",
		HTTPAddr:          "127.0.0.1:7404", // 7400-7403 are a control node's
		GRPCAddr:          "127.0.0.1:7405",
		LoadInterval:      50 * time.Millisecond,
		PortRangeStart:    20000,
		PortRangeEnd:      20999,
		ReadyTimeout:      10 * time.Minute,
		StopGrace:         10 * time.Second,
		HeartbeatInterval: 500 * time.Millisecond,
		DrainQuiet:        drain.DefaultConfig().Quiet,
		DrainTimeout:      drain.DefaultConfig().Timeout,
		ProbeInterval:     time.Second,
		RestartBackoff:    supervisor.DefaultBackoff(),
		ReconnectInitial:  250 * time.Millisecond,
		ReconnectMax:      10 * time.Second,
	}
}

// Validate reports the first bad field, naming its flag.
func (c *Config) Validate() error {
	if c.NodeID == "" {
		return errors.New("--node-id: required")
	}
	if len(c.Control) == 0 {
		return errors.New("--control: at least one control address is required")
	}
	for _, a := range c.Control {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("--control: %q is not host:port: %w", a, err)
		}
	}
	if c.AdvertiseAddr == "" {
		return errors.New("--advertise-addr: required")
	}
	if _, _, err := net.SplitHostPort(c.AdvertiseAddr); err == nil {
		return fmt.Errorf("--advertise-addr: %q must be an address without a port", c.AdvertiseAddr)
	}
	if c.DataDir == "" {
		return errors.New("--data-dir: required")
	}
	if _, p, err := net.SplitHostPort(c.HTTPAddr); err != nil {
		return fmt.Errorf("--http-addr: %q is not host:port: %w", c.HTTPAddr, err)
	} else if _, err := strconv.ParseUint(p, 10, 16); err != nil {
		return fmt.Errorf("--http-addr: bad port %q", p)
	}
	if _, p, err := net.SplitHostPort(c.GRPCAddr); err != nil {
		return fmt.Errorf("--grpc-addr: %q is not host:port: %w", c.GRPCAddr, err)
	} else if _, err := strconv.ParseUint(p, 10, 16); err != nil {
		return fmt.Errorf("--grpc-addr: bad port %q", p)
	}
	if c.LoadInterval <= 0 {
		return fmt.Errorf("--load-interval: must be positive, got %s", c.LoadInterval)
	}
	if c.GPUs < 0 {
		return errors.New("--gpus: must not be negative")
	}
	if c.PortRangeStart < 1 || c.PortRangeEnd > 65535 || c.PortRangeStart > c.PortRangeEnd {
		return fmt.Errorf("--port-range: %d-%d is not a range within 1-65535", c.PortRangeStart, c.PortRangeEnd)
	}
	for name, e := range c.Engines {
		switch name {
		case engine.VLLM, engine.LlamaCpp, engine.Sim:
		default:
			return fmt.Errorf("--%s-command: unknown engine %q", name, name)
		}
		if len(e.Command) > 0 && e.Command[0] == "" {
			return fmt.Errorf("--%s-command: empty program", name)
		}
	}
	if c.ReadyTimeout <= 0 {
		return errors.New("--ready-timeout: must be positive")
	}
	if c.StopGrace <= 0 {
		return errors.New("--stop-grace: must be positive")
	}
	if c.HeartbeatInterval <= 0 {
		return errors.New("--heartbeat-interval: must be positive")
	}
	if err := c.drainConfig().Validate(); err != nil {
		return err
	}
	if c.ProbeInterval <= 0 {
		return errors.New("probe interval: must be positive")
	}
	if c.RestartBackoff.Initial <= 0 || c.RestartBackoff.Max < c.RestartBackoff.Initial {
		return errors.New("restart backoff: initial must be positive and at most max")
	}
	if c.ReconnectInitial <= 0 || c.ReconnectMax < c.ReconnectInitial {
		return errors.New("reconnect backoff: initial must be positive and at most max")
	}
	return nil
}

func (c *Config) drainConfig() drain.Config {
	return drain.Config{Quiet: c.DrainQuiet, Timeout: c.DrainTimeout, Now: c.Now}
}
