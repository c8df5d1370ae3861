package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/agent"
)

// newAgentCmd wires `llmgw agent`: flags into agent.Config, then Run until
// SIGINT or SIGTERM.
func newAgentCmd() *cobra.Command {
	d := agent.DefaultConfig()
	cfg := d
	var (
		labels     []string
		portRange  string
		engineCmds = map[string]*string{"vllm": new(string), "llamacpp": new(string), "sim": new(string)}
	)
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run the node agent: supervise this node's engines for the control plane",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := newLogger(cmd)
			if err != nil {
				return err
			}
			if cfg.Labels, err = parseLabels(labels); err != nil {
				return err
			}
			if cfg.PortRangeStart, cfg.PortRangeEnd, err = parsePortRange(portRange); err != nil {
				return err
			}
			cfg.Engines = map[string]agent.EngineConfig{}
			for name, v := range engineCmds {
				if f := strings.Fields(*v); len(f) > 0 {
					cfg.Engines[name] = agent.EngineConfig{Command: f}
				}
			}
			cfg.Version = version
			a, err := agent.New(cfg, logger)
			if err != nil {
				return err
			}
			ctx, stop := signalContext()
			defer stop()
			return a.Run(ctx)
		},
	}
	host, _ := os.Hostname()
	f := cmd.Flags()
	f.StringVar(&cfg.NodeID, "node-id", host, "this node's id in the cluster")
	f.StringSliceVar(&cfg.Control, "control", d.Control, "control node gRPC addresses, host:port[,host:port...]")
	f.StringVar(&cfg.AdvertiseAddr, "advertise-addr", d.AdvertiseAddr, "the node's address (no port); engines listen on it")
	f.StringVar(&cfg.DataDir, "data-dir", d.DataDir, "directory for the session epoch, port assignments and engine logs")
	f.StringVar(&cfg.HTTPAddr, "http-addr", d.HTTPAddr, "address for /metrics, /healthz and /readyz")
	f.StringVar(&cfg.GRPCAddr, "grpc-addr", d.GRPCAddr, "address for LoadService, which routers subscribe to; advertised with --advertise-addr and the bound port")
	f.DurationVar(&cfg.LoadInterval, "load-interval", d.LoadInterval, "how often each engine's /metrics is read and a load snapshot sent to routers")
	f.IntVar(&cfg.GPUs, "gpus", 0, "number of GPUs this node offers")
	f.StringArrayVar(&labels, "label", nil, "node label k=v (repeatable)")
	f.StringVar(&portRange, "port-range", fmt.Sprintf("%d-%d", d.PortRangeStart, d.PortRangeEnd), "engine ports, start-end inclusive")
	for name, v := range engineCmds {
		f.StringVar(v, name+"-command", "", "program and leading arguments for "+name+" engines, space-separated (no shell)")
	}
	f.BoolVar(&cfg.StopEnginesOnExit, "stop-engines-on-exit", false, "stop every engine when the agent exits (default: engines outlive the agent)")
	f.DurationVar(&cfg.ReadyTimeout, "ready-timeout", d.ReadyTimeout, "how long an engine may take to become ready")
	f.DurationVar(&cfg.StopGrace, "stop-grace", d.StopGrace, "time between SIGTERM and SIGKILL when stopping an engine")
	f.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", d.HeartbeatInterval, "heartbeat period; three missed means a dead control node")
	f.DurationVar(&cfg.DrainQuiet, "drain-quiet", d.DrainQuiet, "how long a draining replica's engine must be idle before it is stopped")
	f.DurationVar(&cfg.DrainTimeout, "drain-timeout", d.DrainTimeout, "stop a draining replica's engine after this long even if busy")
	return cmd
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

func parsePortRange(s string) (int, int, error) {
	a, b, ok := strings.Cut(s, "-")
	start, err1 := strconv.Atoi(strings.TrimSpace(a))
	end, err2 := strconv.Atoi(strings.TrimSpace(b))
	if !ok || err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("--port-range: %q is not start-end", s)
	}
	return start, end, nil
}
