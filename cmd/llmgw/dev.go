package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/llmgw/llmgw/agent"
	"github.com/llmgw/llmgw/controlplane"
	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/tracing"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router"
	"github.com/llmgw/llmgw/sim"
)

// devOptions are `llmgw dev`'s flags: where each component listens, and the
// demo model's shape.
type devOptions struct {
	httpAddr, grpcAddr, raftAddr   string
	opsAddr                        string
	controlHTTPAddr, agentHTTPAddr string
	agentGRPCAddr                  string
	dataDir                        string
	replicas, gpus                 int
	portRange                      string
	// portOffset is added to every port dev listens on and to its
	// engines' port range, given on their own flags or not, so a second
	// dev runs beside the first with one flag.
	portOffset                           int
	vllmCommand, llamacppCommand, simCmd string
	decodeMS                             float64
	// simGPU is the demo engines' GPU profile; a --sim-decode-ms-per-token
	// given instead keeps the old per-request timing.
	simGPU string
	// capture is the router's --capture-path ("": none).
	capture string
	// simLoadScale scales the demo engines' simulated start, sleep and
	// wake (llmgw sim serve --sim-load-scale).
	simLoadScale float64
	// tracing is the router's and the control node's tracing, and where
	// the agent's engines send their spans (the flags of llmgw router).
	tracing   tracing.Config
	extraArgs []string
}

// demoEngineArgs are the demo model's simulator flags: a GPU profile, or
// simple timing when a decode time was asked for.
func (o devOptions) demoEngineArgs(decodeSet bool) []string {
	if decodeSet {
		return []string{"--sim-timing", "simple", "--sim-decode-ms-per-token", strconv.FormatFloat(o.decodeMS, 'f', -1, 64)}
	}
	return []string{"--sim-gpu", o.simGPU, "--sim-load-scale", strconv.FormatFloat(o.simLoadScale, 'f', -1, 64)}
}

func newDevCmd() *cobra.Command { return devCmd(&devOptions{tracing: tracing.DefaultConfig()}) }

// devCmd is `llmgw dev` with its flags bound to o.
func devCmd(o *devOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run a control node, an agent with simulated replicas and a router in one process",
		Long: `dev is the quickstart (design §2): one control node (single-node Raft), one agent
(node "dev") running the model "demo" on simulated vLLM engines, and a router
serving the OpenAI API. The three are the real components and talk gRPC over
loopback, as they would across machines. Ctrl-C stops everything, engines
included.

It listens on seven ports (the flags below; 8080 and 7400-7406) and starts
engines on --port-range. A second dev beside the first needs one flag:
--port-offset 100 adds 100 to every one of them, the defaults and those
given (8180, 7500-7506, engines on 20100-21099), and keeps its state apart
(.data/dev-100 unless --data-dir is given).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(cmd)
			if err != nil {
				return err
			}
			ctx, stop := signalContext()
			defer stop()
			if o.simLoadScale < 0 || o.simLoadScale > 1 {
				return fmt.Errorf("--sim-load-scale: %v: must be in [0, 1]", o.simLoadScale)
			}
			if _, ok := sim.LookupGPU(o.simGPU); !ok {
				return fmt.Errorf("--sim-gpu: %q: not a profile (%s)", o.simGPU, strings.Join(sim.GPUProfileNames(), ", "))
			}
			o.extraArgs = o.demoEngineArgs(cmd.Flags().Changed("sim-decode-ms-per-token"))
			if err := o.offsetPorts(cmd.Flags().Changed); err != nil {
				return err
			}
			return runDev(ctx, *o, log)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.httpAddr, "http-addr", "127.0.0.1:8080", "the router's OpenAI API (loopback only: dev runs without TLS)")
	f.StringVar(&o.opsAddr, "ops-addr", router.DefaultOpsAddr, "the router's operations port: /metrics, /sd/replicas, /debug/kvindex")
	f.StringVar(&o.grpcAddr, "grpc-addr", "127.0.0.1:7400", "the control plane's gRPC (llmgwctl's --addr)")
	f.StringVar(&o.raftAddr, "raft-addr", "127.0.0.1:7401", "the control node's Raft transport")
	f.StringVar(&o.controlHTTPAddr, "control-http-addr", "127.0.0.1:7403", "the control node's /metrics, /healthz, /readyz and web console (/ui/)")
	f.StringVar(&o.agentHTTPAddr, "agent-http-addr", "127.0.0.1:7404", "the agent's /metrics, /healthz, /readyz")
	f.StringVar(&o.agentGRPCAddr, "agent-grpc-addr", "127.0.0.1:7405", "the agent's LoadService, which the router subscribes to")
	f.StringVar(&o.dataDir, "data-dir", ".data/dev", "where Raft, the agent and the router keep their state (.data/dev-N with --port-offset N)")
	f.IntVar(&o.portOffset, "port-offset", 0, "added to every port above, given or default, and to --port-range, so a second dev runs beside the first (--port-offset 100)")
	f.IntVar(&o.replicas, "replicas", 2, "replicas of the demo model")
	f.IntVar(&o.gpus, "gpus", 8, "GPUs the simulated node reports (each replica takes one)")
	f.StringVar(&o.portRange, "port-range", "20000-20999", "ports for engines, FIRST-LAST")
	f.StringVar(&o.capture, "capture-path", "", "record the router's traffic, without text, to this file (llmgw router --capture-path) for llmgwctl bench --replay")
	traceFlags(f, &o.tracing, "the router's requests, the control node's gRPC calls and the engines' llm_request spans, joined", "the router and the control node start", "a request's")
	f.Float64Var(&o.decodeMS, "sim-decode-ms-per-token", 20, "the demo engines' decode time per token, milliseconds, with simple timing instead of --sim-gpu")
	f.StringVar(&o.simGPU, "sim-gpu", "a100-40gb", "the demo engines' GPU profile (llmgw sim serve --sim-gpu): Llama-3.1-8B on it decodes at about 14 ms per token alone")
	f.Float64Var(&o.simLoadScale, "sim-load-scale", 0, "scale of the demo engines' simulated start, sleep and wake on --sim-gpu, 0..1 (0: ready at once; 1: as long as vLLM takes to load the model there)")
	f.StringVar(&o.vllmCommand, "vllm-command", "", "program (and leading args, space-separated) the vllm driver runs; default vllm")
	f.StringVar(&o.llamacppCommand, "llamacpp-command", "", "program (and leading args) the llamacpp driver runs; default llama-server")
	f.StringVar(&o.simCmd, "sim-command", "", "program (and leading args) the sim driver runs; default this binary's sim")
	return cmd
}

// runDev starts the three components and stops them in the reverse order of
// the data path: the router first (no new requests), then the agent (which
// stops every engine), then the control node.
func runDev(ctx context.Context, o devOptions, log *slog.Logger) error {
	if o.replicas < 1 {
		return errors.New("--replicas: must be at least 1")
	}
	if o.gpus < o.replicas {
		return fmt.Errorf("--gpus: %d cannot hold %d replicas of one GPU each", o.gpus, o.replicas)
	}
	if err := o.checkLoopback(); err != nil {
		return err
	}
	if err := o.checkPortsFree(); err != nil {
		return err
	}

	ccfg, acfg, rcfg, err := o.configs()
	if err != nil {
		return err
	}

	control, err := controlplane.New(ccfg, log.With("component", "control"))
	if err != nil {
		return fmt.Errorf("control: %w", err)
	}
	var group runGroup
	defer group.stopAll()
	group.start("control", control.Run)
	select {
	case <-control.Ready():
	case err := <-group.failed:
		return portHint(err)
	case <-ctx.Done():
		return nil
	}
	if err := applyDemo(ctx, o, log); err != nil {
		return err
	}

	ag, err := agent.New(acfg, log.With("component", "agent"))
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	group.start("agent", ag.Run)
	rt, err := router.New(rcfg, log.With("component", "router"))
	if err != nil {
		return fmt.Errorf("router: %w", err)
	}
	group.start("router", rt.Run)
	log.Info("llmgw dev is up", "openai_api", "http://"+displayAddr(o.httpAddr)+"/v1", "router_ops", "http://"+displayAddr(o.opsAddr),
		"control_grpc", o.grpcAddr, "model", "demo", "replicas", o.replicas)
	group.start("demo ready note", func(ctx context.Context) error { return noteReady(ctx, rt, o.replicas, readyHint, log) })

	select {
	case <-ctx.Done():
		log.Info("stopping: router, then agent and engines, then control")
		return nil
	case err := <-group.failed:
		return portHint(err)
	}
}

// readyHint is how long noteReady waits before saying where to look.
const readyHint = time.Minute

// noteReady logs once the router can send demo's requests to all its
// replicas — a request before that is a 503 no_replica_available, the
// first thing a new user would otherwise meet — and, if that takes over a
// minute, how many are routable and where to look. It then waits for ctx,
// as a member of the run group must.
func noteReady(ctx context.Context, rt interface{ Routable(string) int }, want int, hintAfter time.Duration, log *slog.Logger) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	hint := time.NewTimer(hintAfter)
	defer hint.Stop()
	for n := rt.Routable("demo"); n < want; n = rt.Routable("demo") {
		select {
		case <-ctx.Done():
			return nil
		case <-hint.C:
			log.Warn("demo is not ready yet: see bin/llmgwctl replica list, and the agent's log lines above", "routable", n, "replicas", want, "waited", hintAfter)
		case <-tick.C:
		}
	}
	log.Info("demo is ready to serve", "replicas", want)
	<-ctx.Done()
	return nil
}

// configs are the control node's, the agent's and the router's
// configurations dev runs: o's addresses and demo, and its tracing for all
// three (the agent's engines, the simulators, are given the endpoint).
func (o devOptions) configs() (controlplane.Config, agent.Config, router.Config, error) {
	var (
		acfg agent.Config
		rcfg router.Config
	)
	if ps := o.tracing.Validate(); len(ps) > 0 {
		return controlplane.Config{}, acfg, rcfg, fmt.Errorf("--%s: %w", ps[0].Flag, ps[0].Err)
	}
	ccfg := controlplane.DefaultConfig()
	ccfg.NodeID = "dev-control"
	ccfg.DataDir = filepath.Join(o.dataDir, "control")
	ccfg.GRPCAddr, ccfg.RaftAddr, ccfg.HTTPAddr = o.grpcAddr, o.raftAddr, o.controlHTTPAddr
	ccfg.GossipAddr = ""
	ccfg.Bootstrap = true
	// The console reads the router's decision counters on its operations
	// port, where /metrics is.
	ccfg.ConsoleRouters = []string{"http://" + o.opsAddr}
	ccfg.Version = version
	ccfg.Tracing = o.tracing
	if err := ccfg.Validate(); err != nil {
		return ccfg, acfg, rcfg, fmt.Errorf("control: %w", err)
	}

	acfg = agent.DefaultConfig()
	acfg.NodeID = "dev"
	acfg.Control = []string{o.grpcAddr}
	acfg.AdvertiseAddr = "127.0.0.1"
	acfg.DataDir = filepath.Join(o.dataDir, "agent")
	acfg.HTTPAddr = o.agentHTTPAddr
	acfg.GRPCAddr = o.agentGRPCAddr
	acfg.GPUs = o.gpus
	acfg.Version = version
	acfg.StopEnginesOnExit = true
	acfg.StopGrace = 5 * time.Second
	if _, err := fmt.Sscanf(o.portRange, "%d-%d", &acfg.PortRange.Start, &acfg.PortRange.End); err != nil {
		return ccfg, acfg, rcfg, fmt.Errorf("--port-range: %q is not FIRST-LAST", o.portRange)
	}
	acfg.Tracing.OTLPEndpoint = o.tracing.OTLPEndpoint
	acfg.Engines = map[string]agent.EngineConfig{}
	for name, command := range map[string]string{"vllm": o.vllmCommand, "llamacpp": o.llamacppCommand, "sim": o.simCmd} {
		if command != "" {
			acfg.Engines[name] = agent.EngineConfig{Command: strings.Fields(command)}
		}
	}
	if err := acfg.Validate(); err != nil {
		return ccfg, acfg, rcfg, fmt.Errorf("agent: %w", err)
	}

	rcfg = router.DefaultConfig()
	rcfg.ID = "dev-router"
	rcfg.Control = []string{o.grpcAddr}
	rcfg.HTTPAddr = o.httpAddr
	rcfg.OpsAddr = o.opsAddr
	rcfg.DataDir = filepath.Join(o.dataDir, "router")
	rcfg.Capture.Path = o.capture
	rcfg.Tracing = o.tracing
	if err := rcfg.Validate(); err != nil {
		return ccfg, acfg, rcfg, fmt.Errorf("router: %w", err)
	}

	return ccfg, acfg, rcfg, nil
}

// checkLoopback refuses any dev listener beyond loopback (design §11): dev
// runs with no TLS and no API keys, so whoever could reach one of its
// ports could administer the cluster or use its models. Serving a network
// is for control, agent and router run as themselves, where TLS or
// --insecure is an explicit choice. (The engines bind the agent's advertise
// address, 127.0.0.1 here, and gossip is off.)
func (o *devOptions) checkLoopback() error {
	for _, l := range o.listeners() {
		if !mtls.IsLoopback(*l.addr) {
			return fmt.Errorf("--%s %s: llmgw dev listens on loopback only (it runs without TLS); use 127.0.0.1, or run llmgw control, agent and router to serve a network", l.flag, *l.addr)
		}
	}
	return nil
}

// listeners are dev's addresses with the flag that sets each, in the
// order its help lists them.
func (o *devOptions) listeners() []struct {
	flag string
	addr *string
} {
	return []struct {
		flag string
		addr *string
	}{
		{"http-addr", &o.httpAddr}, {"ops-addr", &o.opsAddr}, {"grpc-addr", &o.grpcAddr}, {"raft-addr", &o.raftAddr},
		{"control-http-addr", &o.controlHTTPAddr}, {"agent-http-addr", &o.agentHTTPAddr}, {"agent-grpc-addr", &o.agentGRPCAddr},
	}
}

// offsetPorts adds --port-offset to the port of every listener and to the
// engines' port range, given or default — so the command line of a dev
// that runs, plus one flag, is a second one beside it — and moves the
// default data directory to .data/dev-N (changed says whether --data-dir
// was given), since two devs cannot share one Raft store.
func (o *devOptions) offsetPorts(changed func(flag string) bool) error {
	if o.portOffset == 0 {
		return nil
	}
	if o.portOffset < 0 || o.portOffset > 40000 {
		return fmt.Errorf("--port-offset: %d must be in [0, 40000]", o.portOffset)
	}
	for _, l := range o.listeners() {
		host, port, err := net.SplitHostPort(*l.addr)
		if err != nil {
			return fmt.Errorf("--%s %s: %w", l.flag, *l.addr, err)
		}
		n, err := strconv.Atoi(port)
		if err != nil || n+o.portOffset > 65535 {
			return fmt.Errorf("--port-offset %d: moves --%s %s beyond port 65535", o.portOffset, l.flag, *l.addr)
		}
		*l.addr = net.JoinHostPort(host, strconv.Itoa(n+o.portOffset))
	}
	var first, last int
	if _, err := fmt.Sscanf(o.portRange, "%d-%d", &first, &last); err != nil {
		return fmt.Errorf("--port-range: %q is not FIRST-LAST", o.portRange)
	}
	if last+o.portOffset > 65535 {
		return fmt.Errorf("--port-offset %d: moves --port-range %s beyond port 65535", o.portOffset, o.portRange)
	}
	o.portRange = fmt.Sprintf("%d-%d", first+o.portOffset, last+o.portOffset)
	if !changed("data-dir") {
		o.dataDir = fmt.Sprintf("%s-%d", o.dataDir, o.portOffset)
	}
	return nil
}

// checkPortsFree refuses to start when one of dev's ports is taken, naming
// its flag and the one flag that moves them all: the usual cause is a dev
// already running, and without this the error would be a component's
// "bind: address already in use" after the control node had started.
func (o *devOptions) checkPortsFree() error {
	for _, l := range o.listeners() {
		ln, err := net.Listen("tcp", *l.addr)
		if err != nil {
			if errors.Is(err, syscall.EADDRINUSE) {
				return fmt.Errorf("--%s %s: the port is in use (another llmgw dev?): %s", l.flag, *l.addr, portOffsetHint)
			}
			return fmt.Errorf("--%s %s: %w", l.flag, *l.addr, err)
		}
		if err := ln.Close(); err != nil {
			return fmt.Errorf("--%s %s: %w", l.flag, *l.addr, err)
		}
	}
	return nil
}

// portOffsetHint is what a port clash says to do.
const portOffsetHint = "give --port-offset 100 (or any N) to move every port of this dev, or stop the other one"

// portHint adds portOffsetHint to a component's failure to bind a port
// taken between checkPortsFree and its start.
func portHint(err error) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("%w: %s", err, portOffsetHint)
	}
	return err
}

// applyDemo writes the demo model through AdminService, as llmgwctl would:
// dev's flags are its source of truth, so a restart with --replicas 3
// rescales it. It then logs whether the router requires API keys.
func applyDemo(ctx context.Context, o devOptions, log *slog.Logger) error {
	conn, err := grpc.NewClient(o.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connect to the control plane: %w", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = llmgwv1.NewAdminServiceClient(conn).ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: &llmgwv1.Model{
		Name:           "demo",
		Engine:         "sim",
		Model:          "meta-llama/Llama-3.1-8B-Instruct",
		Replicas:       uint32(o.replicas),
		GpusPerReplica: 1,
		Profile:        "chat",
		ExtraArgs:      o.extraArgs,
	}})
	if err != nil {
		return fmt.Errorf("apply the demo model: %w", err)
	}
	// Whether the router wants keys (issue 28: one llmgwctl apikey create
	// locked a newcomer's dev cluster for good, the README's curl got 401
	// after every restart, and nothing said why).
	keys, err := llmgwv1.NewAdminServiceClient(conn).ListApiKeys(ctx, &llmgwv1.ListRequest{})
	switch {
	case err != nil:
		log.Warn("cannot tell whether API keys are required", "err", err)
	case keys.KeysRequired:
		log.Warn("API keys are required: requests without a valid key get 401 (llmgwctl apikey require off serves them again)",
			"keys", len(keys.Keys))
	default:
		log.Info("API keys are not required: every request is served without one", "keys", len(keys.Keys))
	}
	return nil
}

// runGroup runs components, each with its own context so they can be stopped
// one at a time in a chosen order; the first to fail is reported on failed.
type runGroup struct {
	members []*member
	failed  chan error
}

type member struct {
	name   string
	cancel context.CancelFunc
	done   chan struct{}
}

func (g *runGroup) start(name string, run func(context.Context) error) {
	if g.failed == nil {
		g.failed = make(chan error, 8)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &member{name: name, cancel: cancel, done: make(chan struct{})}
	g.members = append(g.members, m)
	go func() {
		defer close(m.done)
		if err := run(ctx); err != nil && ctx.Err() == nil {
			g.failed <- fmt.Errorf("%s: %w", name, err)
		} else if ctx.Err() == nil {
			g.failed <- fmt.Errorf("%s stopped unexpectedly", name)
		}
	}()
}

// stopAll stops the members in reverse start order, each fully before the
// next: started control, agent, router → stopped router, agent, control.
func (g *runGroup) stopAll() {
	for i := len(g.members) - 1; i >= 0; i-- {
		m := g.members[i]
		m.cancel()
		<-m.done
	}
}

func displayAddr(addr string) string {
	if strings.HasPrefix(addr, ":") {
		return "localhost" + addr
	}
	return addr
}
