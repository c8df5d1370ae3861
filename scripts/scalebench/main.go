// Command scalebench measures elastic capacity (issue 30, design §5.7) on a
// cluster of separate processes on loopback: a control server, an agent
// whose GPUs run simulated engines, and a router, from the `make build`
// binaries. Each phase applies its own autoscaled model, drives load at it
// and reads what happened from the clients' side (every request's status
// and time to first token), from `llmgwctl model status` (the count, the
// replicas, the autoscaler's decisions) and from the engines' /metrics.
//
// Phases (--phases):
//
//   - zero: a model scaled to 0 takes a burst of --zero-burst concurrent
//     requests: none lost, the first token within the cold start + 1 s,
//     and the new replica never given more than its --max-num-seqs in its
//     first 10 s.
//   - step: load steps from 1 to 6 × one replica's capacity and back down:
//     the replicas grow, TTFT p90 comes back under the SLO, the count
//     returns to min after scale_down_after, no request fails.
//   - flap: a stationary load near a threshold for --flap: at most one
//     scale action.
//   - share: two models with a GPU each and one spare (a pinned model
//     holds the rest): a burst on the higher-priority one takes the idle
//     one's GPU, asleep, never the pinned model's; after it, the idle
//     model's next request wakes it within the simulated wake + 1 s.
//
// It exits 1 naming each must-show that failed; every figure is in --out.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/llmgw/llmgw/scripts/internal/benchproc"
)

type config struct {
	bin, ctl, out string
	keep          bool
	seed          uint64
	phases        string

	gpus        int
	gpu         string
	modelID     string
	maxNumSeqs  int
	portRange   string
	promptWords int
	maxTokens   int
	simArgs     string

	zeroBurst    int
	zeroDownFor  time.Duration
	capacityTime time.Duration
	stepLow      time.Duration
	stepHigh     time.Duration
	stepTail     time.Duration
	stepDownFor  time.Duration
	ttftSLO      time.Duration
	flap         time.Duration
	flapLoad     float64
	shareBurst   time.Duration
	shareLoad    float64
	capacityRPS  float64
}

func main() {
	var cfg config
	flag.StringVar(&cfg.bin, "llmgw", "bin/llmgw", "the llmgw binary")
	flag.StringVar(&cfg.ctl, "llmgwctl", "bin/llmgwctl", "the llmgwctl binary")
	flag.StringVar(&cfg.out, "out", "bench-out/scalebench.json", "the JSON file of every figure")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the processes' data and logs")
	flag.Uint64Var(&cfg.seed, "seed", 1, "seed of the arrivals")
	flag.StringVar(&cfg.phases, "phases", "zero,step,flap,share", "the phases to run, in order")
	flag.IntVar(&cfg.gpus, "gpus", 8, "the agent's simulated GPUs")
	flag.StringVar(&cfg.gpu, "sim-gpu", "l4", "the engines' GPU profile")
	flag.StringVar(&cfg.modelID, "model-id", "meta-llama/Llama-3.1-8B-Instruct", "the model the simulator prices (its shape and weights)")
	flag.IntVar(&cfg.maxNumSeqs, "max-num-seqs", 16, "the engines' batch size")
	flag.StringVar(&cfg.portRange, "port-range", "42300-42399", "the engines' ports")
	flag.IntVar(&cfg.promptWords, "prompt-words", 200, "words in each prompt")
	flag.IntVar(&cfg.maxTokens, "max-tokens", 32, "each request's max_tokens")
	flag.StringVar(&cfg.simArgs, "sim-args", "", "more engine arguments, comma-separated (e.g. the simulator's load-time flags)")
	flag.IntVar(&cfg.zeroBurst, "zero-burst", 200, "zero: concurrent requests at a model scaled to 0")
	flag.DurationVar(&cfg.zeroDownFor, "zero-scale-down-after", 20*time.Second, "zero: the model's scale_down_after (how long idle before it goes to 0)")
	flag.DurationVar(&cfg.capacityTime, "capacity-time", 30*time.Second, "step: the closed loop measuring one replica's capacity")
	flag.Float64Var(&cfg.capacityRPS, "capacity-rps", 0, "step and flap: one replica's capacity in requests per second (0: measure it)")
	flag.DurationVar(&cfg.stepLow, "step-low", time.Minute, "step: 1 × capacity before the step")
	flag.DurationVar(&cfg.stepHigh, "step-high", 3*time.Minute, "step: 6 × capacity")
	flag.DurationVar(&cfg.stepDownFor, "step-scale-down-after", time.Minute, "step: the model's scale_down_after")
	flag.DurationVar(&cfg.stepTail, "step-tail", 2*time.Minute, "step: 0.3 × capacity after the step, beyond scale_down_after")
	flag.DurationVar(&cfg.ttftSLO, "ttft-slo", 2*time.Second, "step: the model's TTFT p90 SLO")
	flag.DurationVar(&cfg.flap, "flap", 10*time.Minute, "flap: how long the stationary load runs")
	flag.Float64Var(&cfg.flapLoad, "flap-load", 1.9, "flap: the stationary load in replicas' capacity")
	flag.DurationVar(&cfg.shareBurst, "share-burst", 2*time.Minute, "share: how long the burst on model b lasts")
	flag.Float64Var(&cfg.shareLoad, "share-load", 2.5, "share: the burst in one replica's capacity (b's max is 3 replicas: above 3 its queue cannot drain)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "scalebench-")
	if err != nil {
		fail(err)
	}
	b := &bench{cfg: cfg, c: &benchproc.Cluster{Bin: cfg.bin, Ctl: cfg.ctl, Dir: dir}, report: &report{},
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2048}}}
	err = b.run(ctx)
	b.c.StopAll()
	if cfg.keep {
		fmt.Println("logs and data in", dir)
	} else {
		_ = os.RemoveAll(dir)
	}
	if err != nil {
		fail(err)
	}
	if err := b.report.write(cfg.out); err != nil {
		fail(err)
	}
	b.report.printVerdicts()
	if failed := b.report.failed(); len(failed) > 0 {
		fmt.Fprintln(os.Stderr, "scalebench: must-shows failed:", strings.Join(failed, "; "))
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "scalebench:", err)
	os.Exit(1)
}

type bench struct {
	cfg    config
	c      *benchproc.Cluster
	report *report
	client *http.Client
	router string // the router's API address
}

func (b *bench) run(ctx context.Context) error {
	fmt.Printf("starting a control server, an agent with %d GPUs and a router in %s\n", b.cfg.gpus, b.c.Dir)
	if err := b.c.StartServers(1); err != nil {
		return err
	}
	if err := b.c.StartAgent(b.cfg.gpus, b.cfg.portRange); err != nil {
		return err
	}
	// One client address sends everything: the router's per-address and
	// per-key bounds would refuse the load generator, not the fleet.
	cfgPath := filepath.Join(b.c.Dir, "r1.yaml")
	if err := os.WriteFile(cfgPath, []byte("max_connections: 0\nmax_conns_per_addr: 0\nmax_inflight: 100000\nmax_key_inflight: 0\n"), 0o644); err != nil {
		return fmt.Errorf("router config: %w", err)
	}
	r, err := b.c.StartRouter("r1", "--config", cfgPath)
	if err != nil {
		return err
	}
	b.router = r.Addr
	b.report.Setup = setup{GPUs: b.cfg.gpus, GPU: b.cfg.gpu, ModelID: b.cfg.modelID, MaxNumSeqs: b.cfg.maxNumSeqs,
		PromptWords: b.cfg.promptWords, MaxTokens: b.cfg.maxTokens, SimArgs: b.cfg.simArgs, Seed: b.cfg.seed}
	for _, p := range strings.Split(b.cfg.phases, ",") {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var err error
		switch strings.TrimSpace(p) {
		case "zero":
			err = b.zero(ctx)
		case "step":
			err = b.step(ctx)
		case "flap":
			err = b.flapPhase(ctx)
		case "share":
			err = b.share(ctx)
		default:
			err = fmt.Errorf("--phases: unknown phase %q (zero, step, flap, share)", p)
		}
		if err != nil {
			return fmt.Errorf("phase %s: %w", p, err)
		}
	}
	return nil
}

// spec is an autoscaled model's file for this bench, starting at
// replicas.
func (b *bench) spec(name string, replicas int, autoscale string) string {
	args := []string{"--sim-gpu", b.cfg.gpu, "--max-num-seqs", fmt.Sprint(b.cfg.maxNumSeqs), "--max-model-len", "4096"}
	if b.cfg.simArgs != "" {
		args = append(args, strings.Split(b.cfg.simArgs, ",")...)
	}
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = fmt.Sprintf("%q", a)
	}
	return fmt.Sprintf("name: %s\nengine: sim\nmodel: %s\nreplicas: %d\ngpus_per_replica: 1\nextra_args: [%s]\nautoscale: %s\n",
		name, b.cfg.modelID, replicas, strings.Join(quoted, ", "), autoscale)
}
