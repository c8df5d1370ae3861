package main

import (
	"fmt"
	"maps"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/llmgw/llmgw/agent"
)

// newAgentCmd wires `llmgw agent`: the defaults, then --config's YAML file,
// then the flags given, into agent.Config; then Run until SIGINT or SIGTERM.
func newAgentCmd() *cobra.Command {
	var af *agentFlags
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run the node agent: supervise this node's engines for the control plane",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := af.config(cmd.Flags())
			if err != nil {
				return err
			}
			logger, err := newLogger(cmd)
			if err != nil {
				return err
			}
			a, err := agent.New(cfg, logger)
			if err != nil {
				return err
			}
			ctx, stop := signalContext()
			defer stop()
			return a.Run(ctx)
		},
	}
	af = bindAgentFlags(cmd.Flags())
	return cmd
}

// agentFlags is `llmgw agent`'s flags. Most are bound straight to an
// agent.Config field, so loadUnderFlags can put the file under them; the
// few written in another shape than the file's are kept aside and applied
// by config when given: --label k=v (the file's labels: {k: v}) and
// --<kind>-command "prog args" (the file's engines.<kind>.command list).
type agentFlags struct {
	cfg        agent.Config
	configFile string
	labels     []string
	engineCmds map[string]*string
}

// bindAgentFlags defines the flags on fs, their defaults agent's.
func bindAgentFlags(f *pflag.FlagSet) *agentFlags {
	af := &agentFlags{
		cfg:        agent.DefaultConfig(),
		engineCmds: map[string]*string{"vllm": new(string), "llamacpp": new(string), "sim": new(string)},
	}
	cfg, d := &af.cfg, agent.DefaultConfig()
	host, _ := os.Hostname()
	f.StringVar(&af.configFile, "config", "", "YAML configuration file (keys as the flags, with underscores; labels: {k: v}; engines: {vllm: {command: [...], env: {...}}}); flags override it")
	f.StringVar(&cfg.NodeID, "node-id", host, "this node's id in the cluster")
	f.StringSliceVar(&cfg.Control, "control", d.Control, "control node gRPC addresses, host:port[,host:port...]")
	f.StringVar(&cfg.AdvertiseAddr, "advertise-addr", d.AdvertiseAddr, "the node's address (no port); engines listen on it")
	f.StringVar(&cfg.DataDir, "data-dir", d.DataDir, "directory for the session epoch, port assignments and engine logs")
	f.StringVar(&cfg.HTTPAddr, "http-addr", d.HTTPAddr, "address for /metrics, /healthz and /readyz")
	f.StringVar(&cfg.GRPCAddr, "grpc-addr", d.GRPCAddr, "address for LoadService, which routers subscribe to; advertised with --advertise-addr and the bound port")
	f.DurationVar(&cfg.LoadInterval, "load-interval", d.LoadInterval, "how often each engine's /metrics is read and a load snapshot sent to routers")
	f.IntVar(&cfg.GPUs, "gpus", 0, "number of GPUs this node offers")
	f.StringArrayVar(&af.labels, "label", nil, "node label k=v (repeatable); given, replaces the file's labels")
	f.Var(&cfg.PortRange, "port-range", "engine ports, start-end inclusive")
	for name, v := range af.engineCmds {
		f.StringVar(v, name+"-command", "", "program and leading arguments for "+name+" engines, space-separated (no shell); given, replaces the file's engines."+name+".command")
	}
	f.BoolVar(&cfg.StopEnginesOnExit, "stop-engines-on-exit", false, "stop every engine when the agent exits (default: engines outlive the agent)")
	f.DurationVar(&cfg.ReadyTimeout, "ready-timeout", d.ReadyTimeout, "how long an engine may take to become ready")
	f.DurationVar(&cfg.StopGrace, "stop-grace", d.StopGrace, "time between SIGTERM and SIGKILL when stopping an engine")
	f.DurationVar(&cfg.ProbeInterval, "probe-interval", d.ProbeInterval, "how often each engine's health is probed (external engines too); three failures in a row mean unhealthy")
	f.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", d.HeartbeatInterval, "heartbeat period; three missed means a dead control node")
	f.DurationVar(&cfg.DrainQuiet, "drain-quiet", d.DrainQuiet, "how long a draining replica's engine must be idle before it is stopped")
	f.DurationVar(&cfg.DrainTimeout, "drain-timeout", d.DrainTimeout, "stop a draining replica's engine after this long even if busy")
	f.BoolVar(&cfg.KVTCP, "kv-events-tcp", d.KVTCP, "put managed engines' KV-event sockets on loopback TCP instead of Unix sockets in the data dir (the fallback)")
	f.DurationVar(&cfg.KVStreamTimeout, "kv-stream-timeout", d.KVStreamTimeout, "how long an external engine's KV-event publisher has to connect before its replica is untrusted (routed by tier 1)")
	f.Uint64Var(&cfg.KVMaxFrameBytes, "kv-max-frame-bytes", d.KVMaxFrameBytes, "largest frame (and message) an engine's KV-event sockets accept; a peer declaring more is disconnected")
	// Security (design §11).
	f.StringVar(&cfg.TLS.CA, "tls-ca", "", "CA certificate (PEM); with --tls-cert and --tls-key, every gRPC connection is mutual TLS")
	f.StringVar(&cfg.TLS.Cert, "tls-cert", "", "this agent's certificate (PEM): role agent, named --node-id")
	f.StringVar(&cfg.TLS.Key, "tls-key", "", "the private key of --tls-cert (PEM)")
	f.BoolVar(&cfg.Insecure, "insecure", false, "allow listening beyond loopback without TLS (anyone who can reach the agent can read its load and act as a router)")
	f.StringVar(&cfg.Tracing.OTLPEndpoint, "otlp-traces-endpoint", "", "host:port of an OTLP/gRPC trace receiver the engines send their spans to (vLLM's --otlp-traces-endpoint)")
	f.BoolVar(&cfg.Tracing.Insecure, "trace-insecure", false, "have the engines send spans in plain text to an --otlp-traces-endpoint beyond loopback")
	return af
}

// config returns the configuration fs was parsed into: the defaults, then
// the --config file, then every flag given (design §2). It does not
// validate; agent.New does.
func (af *agentFlags) config(fs *pflag.FlagSet) (agent.Config, error) {
	if af.configFile != "" {
		if err := loadUnderFlags(fs, af.configFile, &af.cfg); err != nil {
			return agent.Config{}, err
		}
	}
	cfg := af.cfg
	if fs.Changed("label") {
		labels, err := parseLabels(af.labels)
		if err != nil {
			return agent.Config{}, err
		}
		cfg.Labels = labels
	}
	// A copy: af.cfg's map is the file's and stays as it was.
	engines := maps.Clone(cfg.Engines)
	for name, v := range af.engineCmds {
		if !fs.Changed(name + "-command") {
			continue
		}
		if engines == nil {
			engines = map[string]agent.EngineConfig{}
		}
		e := engines[name]
		e.Command = strings.Fields(*v)
		if len(e.Command) == 0 && len(e.Env) == 0 {
			delete(engines, name)
		} else {
			engines[name] = e
		}
	}
	cfg.Engines = engines
	cfg.Version = version
	return cfg, nil
}

func parseLabels(in []string) (map[string]string, error) {
	out := make(map[string]string, len(in))
	for _, l := range in {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--label: %q is not k=v", l)
		}
		out[k] = v
	}
	return out, nil
}
