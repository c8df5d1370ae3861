// Command fleetsim measures how the control plane's cost and the KV lag grow
// with the fleet (issue "Real fleets", build item 5): a real 3-server
// control plane and K real routers (`llmgw control`, `llmgw router`,
// built from this tree) on loopback, and N fake agents in this process
// speaking the real AgentService — each a node with R GPUs, reporting the
// R replicas placed on it ready at a fake address (no engines) and
// churning their KV block sets at its share of E block events/s, in the
// format the agent sends (net stored/removed hashes per replica, every
// flush interval; a reset with the whole set in full copies).
//
// For each fleet size (--replicas) it starts a fresh cluster, applies one
// model of that many replicas with a node selector only the fake nodes
// match and times its placement; times --scale-steps scale steps of the
// model (down by one replica and back up, each from the apply to the
// affected agent's new desired set: placement's reaction to a changed
// count, issue 30); with --place-only it stops there. Otherwise it waits
// until every router's index holds every replica's blocks, then measures a
// window at each event rate (--rates, increasing) until the KV lag p99
// passes --lag-limit:
//
//   - control CPU (cores, from /proc/PID/stat) and memory (VmRSS, Go heap
//     in use), per replica and per 1 k events/s;
//   - the KV lag from an agent's event to every router's index, p50/p99
//     (probes, probe.go);
//   - the signals of a plane that does not keep up: watch overflows,
//     router reconnects, gaps, full-copy requests, agent sessions broken;
//   - router memory per million (block, replica) entries;
//
// then, at --fanout-rate, adds --add-routers routers one at a time: the
// control CPU each costs, and the time each takes to hold a full copy.
// It prints a table per fleet and, with --json, everything as JSON.
//
// The servers' per-session bounds (agent_kv_blocks_per_replica and the
// rest) are left at their defaults, which the fleet stays within; only
// max_agent_sessions_per_address is raised, through the servers' config
// file, since every fake agent dials from 127.0.0.1 and the default is 64.
//
// Run it with `make bench-fleet` (BENCH_FLAGS=... passes flags).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// config is the harness's flags.
type config struct {
	llmgw            string
	replicas         []int
	perAgent         int
	blocks           int
	rates            []float64
	routers          int
	addRouters       int
	fanoutRate       float64
	flush            time.Duration
	window, warmup   time.Duration
	probeInterval    time.Duration
	probePoll        time.Duration
	probeTimeout     time.Duration
	lagLimit         time.Duration
	setupTimeout     time.Duration
	profileDir       string
	jsonOut, keep    bool
	heartbeatTimeout time.Duration
	ports            portRange
	// placeOnly stops each fleet after its placement and scale steps:
	// no KV sweep, no fan-out.
	placeOnly  bool
	scaleSteps int
	// scaleRate: with placeOnly, the steps are timed again with the
	// agents live (reporting, a drained replica STOPPED at once) at this
	// many KV events/s; 0 skips them.
	scaleRate float64
}

func (c config) validate() error {
	switch {
	case len(c.replicas) == 0:
		return errors.New("--replicas: give at least one fleet size")
	case c.perAgent < 2:
		return fmt.Errorf("--replicas-per-agent: must be at least 2 (one carries the probes), got %d", c.perAgent)
	case c.blocks < 1:
		return fmt.Errorf("--blocks: must be at least 1, got %d", c.blocks)
	case c.routers < 1:
		return fmt.Errorf("--routers: must be at least 1, got %d", c.routers)
	case c.addRouters < 0:
		return fmt.Errorf("--add-routers: must not be negative, got %d", c.addRouters)
	case c.flush <= 0 || c.window <= 0 || c.warmup < 0:
		return errors.New("--flush, --window: must be positive; --warmup not negative")
	case c.probeInterval <= 0 || c.probePoll <= 0 || c.probeTimeout <= 0:
		return errors.New("--probe-interval, --probe-poll, --probe-timeout: must be positive")
	case c.lagLimit <= 0 || c.setupTimeout <= 0:
		return errors.New("--lag-limit, --setup-timeout: must be positive")
	case c.scaleSteps < 0:
		return fmt.Errorf("--scale-steps: must not be negative, got %d", c.scaleSteps)
	case c.scaleRate < 0:
		return fmt.Errorf("--scale-rate: must not be negative, got %g", c.scaleRate)
	case c.ports.lo != 0 && c.ports.hi-c.ports.lo+1 < 15+3*(c.routers+c.addRouters):
		return fmt.Errorf("--ports: %d ports, want at least %d (5 a server, 3 a router)", c.ports.hi-c.ports.lo+1, 15+3*(c.routers+c.addRouters))
	}
	for _, r := range c.replicas {
		if r < c.perAgent {
			return fmt.Errorf("--replicas: %d is fewer than --replicas-per-agent %d", r, c.perAgent)
		}
	}
	for i, r := range c.rates {
		if r <= 0 || (i > 0 && r <= c.rates[i-1]) {
			return fmt.Errorf("--rates: must be positive and increasing, got %v", c.rates)
		}
	}
	return nil
}

func main() {
	cfg := config{}
	var replicas, rates, ports string
	flag.StringVar(&cfg.llmgw, "llmgw", "", "the llmgw binary; it must serve pprof as the harness's build does (default: build ./cmd/llmgw with the pprof overlay into a temporary directory)")
	flag.StringVar(&replicas, "replicas", "100,500,2000", "fleet sizes, in replicas, comma-separated; each gets a fresh cluster")
	flag.IntVar(&cfg.perAgent, "replicas-per-agent", 8, "replicas (GPUs) per fake node")
	flag.IntVar(&cfg.blocks, "blocks", 1024, "KV blocks held per replica (the sets churn at constant size)")
	flag.StringVar(&rates, "rates", "1000,10000,50000,100000,200000,400000,800000,1600000", "KV block events/s over the whole fleet (stored + removed hashes), increasing; the sweep stops after the first point whose lag p99 passes --lag-limit")
	flag.IntVar(&cfg.routers, "routers", 2, "routers watching from the start")
	flag.IntVar(&cfg.addRouters, "add-routers", 2, "routers added one at a time after the sweep, for the fan-out cost and the time to a full copy")
	flag.Float64Var(&cfg.fanoutRate, "fanout-rate", 20000, "KV events/s while routers are added")
	flag.DurationVar(&cfg.flush, "flush", 250*time.Millisecond, "how often a fake agent sends its KV changes (the agent's own is 250 ms)")
	flag.DurationVar(&cfg.window, "window", 20*time.Second, "measurement window per point")
	flag.DurationVar(&cfg.warmup, "warmup", 3*time.Second, "time at a new rate before its window")
	flag.DurationVar(&cfg.probeInterval, "probe-interval", 100*time.Millisecond, "one lag probe per interval, round robin over the agents")
	flag.DurationVar(&cfg.probePoll, "probe-poll", 5*time.Millisecond, "how often each router is polled for a probe")
	flag.DurationVar(&cfg.probeTimeout, "probe-timeout", 10*time.Second, "a probe not on every router by then is lost (and counted at this lag)")
	flag.DurationVar(&cfg.lagLimit, "lag-limit", 500*time.Millisecond, "the sweep stops after the first rate whose event-to-every-router lag p99 passes it")
	flag.DurationVar(&cfg.setupTimeout, "setup-timeout", 3*time.Minute, "longest wait for the cluster, the placement and the routers' first full index")
	flag.DurationVar(&cfg.heartbeatTimeout, "heartbeat-timeout", 500*time.Millisecond, "the servers' --heartbeat-timeout and --election-timeout")
	flag.StringVar(&cfg.profileDir, "profile-dir", "", "save a CPU profile of every server (and the first router) per point into this directory")
	flag.BoolVar(&cfg.jsonOut, "json", false, "print the result as JSON")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the processes' data and logs (their directory is printed)")
	flag.StringVar(&ports, "ports", "", "LO-HI: the loopback ports the servers and routers listen on (default: any free port)")
	flag.BoolVar(&cfg.placeOnly, "place-only", false, "measure each fleet's placement and scale steps only: no KV sweep, no fan-out")
	flag.IntVar(&cfg.scaleSteps, "scale-steps", 5, "after placement, scale the model down by one and back up this many times, each step timed from the apply to the placement's commit and to the agent's new desired set")
	flag.Float64Var(&cfg.scaleRate, "scale-rate", 10000, "with --place-only: time the scale steps again with the agents live (every agent reporting each flush, a drained replica STOPPED at once) at this many KV events/s over the fleet; 0 skips")
	flag.Parse()
	var err error
	if cfg.replicas, err = parseInts(replicas); err != nil {
		fmt.Fprintln(os.Stderr, "fleetsim: --replicas:", err)
		os.Exit(2)
	}
	if cfg.rates, err = parseFloats(rates); err != nil {
		fmt.Fprintln(os.Stderr, "fleetsim: --rates:", err)
		os.Exit(2)
	}
	if cfg.ports, err = parsePorts(ports); err != nil {
		fmt.Fprintln(os.Stderr, "fleetsim: --ports:", err)
		os.Exit(2)
	}
	if err := cfg.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "fleetsim:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := run(ctx, cfg, log)
	if res != nil {
		res.print(os.Stdout, cfg.jsonOut)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetsim:", err)
		os.Exit(1)
	}
}

func parseInts(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func parseFloats(s string) ([]float64, error) {
	var out []float64
	for f := range strings.SplitSeq(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}
