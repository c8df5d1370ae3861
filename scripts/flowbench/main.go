// Command flowbench measures issue 29's must-shows for flow control at
// saturation on a real cluster on loopback: control servers, one agent
// placing simulated replicas on a GPU profile, two routers with flow
// control on and one with it off, all separate processes.
//
// Phases (each a table; a JSON file of every figure):
//
//  0. capacity: a closed loop at 1.5 × the fleet's slots through both
//     flow routers; capacity is the served requests and output tokens
//     per second.
//  1. alone: tenant B (interactive) at 0.3 × capacity through both
//     routers: its TTFT p99 is the baseline.
//  2. mixed: B as in phase 1, and tenant A (batch) offered 3 × capacity
//     through router 1 only: B's TTFT p99 against phase 1 and its
//     refusals, the fleet's output against capacity, A's share of the
//     service per minute, and priority inversions counted from both
//     routers' /metrics scraped every 50 ms.
//  3. fairness: 10 tenants of one class at 2 × capacity in all: Jain's
//     index on served tokens per minute.
//  4. one of them at 10 × the others' rate (2 × capacity in all): its
//     share of the service against its max-min fair share.
//  5. cost: 0.5 × capacity through the flow router and the router without
//     flow control in turn, in slices: each one's CPU per 1000 requests.
//
// Every request is accounted for: served (200 and a whole stream),
// refused (429 with x-llmgw-flow-reason and Retry-After; queue_timeout
// only after its class's TTL) or lost, which must not happen. It exits 1
// when a must-show fails, naming it. Run it with `make bench-flow`
// (BENCH_FLAGS=... passes flags).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/llmgw/llmgw/scripts/internal/benchchat"
	"github.com/llmgw/llmgw/scripts/internal/benchproc"
)

type config struct {
	bin, ctl string
	out      string
	keep     bool
	seed     uint64
	phases   string

	servers      int
	replicas     int
	gpu          string
	modelID      string
	maxNumSeqs   int
	maxModelLen  int
	maxBatched   int
	enginePrio   bool
	portRange    string
	flow         bool
	replicaConc  int
	promptWords  int
	maxTokens    int
	capacityTime time.Duration
	alone        time.Duration
	mixed        time.Duration
	fair         time.Duration
	costSlice    time.Duration
	costSlices   int
	costIdle     time.Duration
	scrapeEvery  time.Duration
	capacityRPS  float64
	aLoad        float64
}

func main() {
	var cfg config
	flag.StringVar(&cfg.bin, "llmgw", "bin/llmgw", "the llmgw binary")
	flag.StringVar(&cfg.ctl, "llmgwctl", "bin/llmgwctl", "the llmgwctl binary")
	flag.StringVar(&cfg.out, "out", "bench-out/flowbench.json", "the JSON file of every figure")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the processes' data and logs")
	flag.Uint64Var(&cfg.seed, "seed", 1, "seed of the arrivals")
	flag.StringVar(&cfg.phases, "phases", "0,1,2,3,4,5", "the phases to run (capacity, 0, is run unless --capacity-rps is given)")
	flag.IntVar(&cfg.servers, "servers", 1, "control servers")
	flag.IntVar(&cfg.replicas, "replicas", 8, "simulated replicas (one GPU each)")
	flag.StringVar(&cfg.gpu, "sim-gpu", "l4", "the replicas' GPU profile")
	flag.StringVar(&cfg.modelID, "model-id", "meta-llama/Llama-3.1-8B-Instruct", "the model the simulator prices (its shape)")
	flag.IntVar(&cfg.maxNumSeqs, "max-num-seqs", 16, "the engines' batch size")
	flag.IntVar(&cfg.maxModelLen, "max-model-len", 4096, "the engines' context")
	flag.IntVar(&cfg.maxBatched, "max-num-batched-tokens", 0, "the engines' step token budget (0: vLLM's default for the GPU)")
	flag.BoolVar(&cfg.enginePrio, "engine-priority", false, "engines run --scheduling-policy priority (the routers then tell them each request's class)")
	flag.StringVar(&cfg.portRange, "port-range", "42200-42299", "the engines' ports")
	flag.BoolVar(&cfg.flow, "flow", true, "flow control on routers 1 and 2 (false: off on every router, the figures without it)")
	flag.IntVar(&cfg.replicaConc, "replica-concurrency", 16, "flow.replica_concurrency of the flow routers")
	flag.IntVar(&cfg.promptWords, "prompt-words", 200, "words in each prompt")
	flag.IntVar(&cfg.maxTokens, "max-tokens", 32, "each request's max_tokens")
	flag.DurationVar(&cfg.capacityTime, "capacity-time", time.Minute, "phase 0")
	flag.DurationVar(&cfg.alone, "alone", 2*time.Minute, "phase 1")
	flag.DurationVar(&cfg.mixed, "mixed", 3*time.Minute, "phase 2")
	flag.DurationVar(&cfg.fair, "fair", 2*time.Minute, "phases 3 and 4, each")
	flag.DurationVar(&cfg.costSlice, "cost-slice", 30*time.Second, "phase 5's slice")
	flag.IntVar(&cfg.costSlices, "cost-slices", 3, "phase 5's slices per router")
	flag.DurationVar(&cfg.costIdle, "cost-idle", 15*time.Second, "phase 5's measure of the routers at rest, before its slices")
	flag.DurationVar(&cfg.scrapeEvery, "scrape-every", 50*time.Millisecond, "how often phase 2 reads the routers' /metrics")
	flag.Float64Var(&cfg.capacityRPS, "capacity-rps", 0, "skip phase 0 and take this capacity, requests per second")
	flag.Float64Var(&cfg.aLoad, "a-load", 3, "phase 2: tenant A's offered load in capacities (the issue's 3 ×)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "flowbench-")
	if err != nil {
		fail(err)
	}
	b := &bench{cfg: cfg, c: &benchproc.Cluster{Bin: cfg.bin, Ctl: cfg.ctl, Dir: dir}, report: &report{ClassMismatch: map[string]int{}}}
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
	if failed := b.report.failed(); len(failed) > 0 {
		fmt.Fprintln(os.Stderr, "flowbench: must-shows failed:", strings.Join(failed, "; "))
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "flowbench:", err)
	os.Exit(1)
}

const model = "bench"

// The classes of the flow routers' configuration, highest first, and
// their TTLs, which judge a queue_timeout.
var classTTL = map[string]time.Duration{"interactive": 30 * time.Second, "standard": 30 * time.Second, "batch": 60 * time.Second}

type bench struct {
	cfg    config
	c      *benchproc.Cluster
	report *report
	client *http.Client
	load   *loader
	// Routers 0 and 1 have flow control (with --flow), 2 does not.
	tenants map[string]*tenant
	// classFlags is whether llmgwctl took --default-class; without it
	// the routers' default class is interactive and the other tenants
	// lower theirs with x-llmgw-priority.
	classFlags bool
}

func (b *bench) run(ctx context.Context) error {
	b.client = &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 4096, DisableCompression: true}}
	fmt.Printf("starting %d server(s), an agent with %d replicas and 3 routers in %s\n", b.cfg.servers, b.cfg.replicas, b.c.Dir)
	if err := b.startCluster(); err != nil {
		return err
	}
	if err := b.setupTenants(); err != nil {
		return err
	}
	addrs := make([]string, len(b.c.Routers))
	for i, r := range b.c.Routers {
		addrs[i] = r.Addr
	}
	b.load = newLoader(b.client, model, addrs, b.cfg.promptWords, b.cfg.maxTokens)
	probe := b.load.send(ctx, b.tenants["cap"], 0)
	b.load.take()
	if probe.outcome != served {
		return fmt.Errorf("the probe request: %d %s", probe.code, probe.why)
	}
	b.report.Setup = setup{Replicas: b.cfg.replicas, GPU: b.cfg.gpu, ModelID: b.cfg.modelID, MaxNumSeqs: b.cfg.maxNumSeqs, MaxNumBatched: b.cfg.maxBatched, EnginePriority: b.cfg.enginePrio,
		MaxTokens: b.cfg.maxTokens, PromptWords: b.cfg.promptWords, Flow: b.cfg.flow, ReplicaConcurrency: b.cfg.replicaConc,
		ClassFlags: b.classFlags, Seed: b.cfg.seed, PromptTokens: probe.in}
	fmt.Printf("each request: %d prompt tokens, %d output tokens; tenant classes from llmgwctl flags: %v\n\n",
		probe.in, probe.out, b.classFlags)

	want := map[string]bool{}
	for _, p := range strings.Split(b.cfg.phases, ",") {
		want[strings.TrimSpace(p)] = true
	}
	capRPS := b.cfg.capacityRPS
	if capRPS == 0 {
		c, err := b.capacity(ctx)
		if err != nil {
			return err
		}
		capRPS = c.RPS
	} else {
		b.report.Capacity = &capacityResult{RPS: capRPS, OutTokensPerSec: capRPS * float64(b.cfg.maxTokens), Given: true}
	}
	for _, p := range []struct {
		id  string
		run func(context.Context, float64) error
	}{{"1", b.alone}, {"2", b.mixed}, {"3", b.fairEqual}, {"4", b.fairHeavy}, {"5", b.cost}} {
		if !want[p.id] {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := p.run(ctx, capRPS); err != nil {
			return err
		}
	}
	b.report.printLost()
	b.report.printVerdicts()
	return nil
}

// routerConfig is a router's YAML: no connection or in-flight bound a
// benchmark from one address would hit, and flow control on with the
// issue's classes when flow (and --flow), else off.
func (b *bench) routerConfig(flow bool) string {
	s := "max_connections: 0\nmax_conns_per_addr: 0\nmax_inflight: 100000\nmax_key_inflight: 0\n"
	if !b.cfg.flow || !flow {
		return s + "flow:\n  enabled: false\n"
	}
	def := "standard"
	if !b.classFlags {
		def = "interactive"
	}
	return s + fmt.Sprintf(`flow:
  enabled: true
  replica_concurrency: %d
  default_class: %s
  classes:
    - {name: interactive, ttl: 30s, max_queued: 2000, max_queued_bytes: 67108864, headroom: 0}
    - {name: standard, ttl: 30s, max_queued: 2000, headroom: 0.05}
    - {name: batch, ttl: 60s, max_queued: 500, headroom: 0.1}
`, b.cfg.replicaConc, def)
}

func (b *bench) startCluster() error {
	if err := b.c.StartServers(b.cfg.servers); err != nil {
		return err
	}
	if err := b.c.StartAgent(b.cfg.replicas, b.cfg.portRange); err != nil {
		return err
	}
	// Whether llmgwctl has the class flags decides the routers' default
	// class, so it is asked before they start.
	out, _ := exec.Command(b.cfg.ctl, "tenant", "create", "--help").CombinedOutput()
	b.classFlags = strings.Contains(string(out), "--default-class")
	for i, flow := range []bool{true, true, false} {
		path := filepath.Join(b.c.Dir, fmt.Sprintf("r%d.yaml", i+1))
		if err := os.WriteFile(path, []byte(b.routerConfig(flow)), 0o644); err != nil {
			return fmt.Errorf("router config: %w", err)
		}
		if _, err := b.c.StartRouter(fmt.Sprintf("r%d", i+1), "--config", path); err != nil {
			return err
		}
	}
	budget := ""
	if b.cfg.maxBatched > 0 {
		budget = fmt.Sprintf(", \"--max-num-batched-tokens\", \"%d\"", b.cfg.maxBatched)
	}
	if b.cfg.enginePrio {
		budget += `, "--scheduling-policy", "priority"`
	}
	spec := fmt.Sprintf("name: %s\nengine: sim\nmodel: %s\nreplicas: %d\ngpus_per_replica: 1\n"+
		"extra_args: [\"--sim-gpu\", %q, \"--max-num-seqs\", \"%d\", \"--max-model-len\", \"%d\"%s]\n",
		model, b.cfg.modelID, b.cfg.replicas, b.cfg.gpu, b.cfg.maxNumSeqs, b.cfg.maxModelLen, budget)
	if err := b.c.ApplyModel(model, spec); err != nil {
		return err
	}
	return benchproc.Until(3*time.Minute, fmt.Sprintf("every router routing to %d replicas", b.cfg.replicas), func() bool {
		for _, r := range b.c.Routers {
			if addrs, err := b.routable(r.Ops); err != nil || len(addrs) < b.cfg.replicas {
				return false
			}
		}
		return true
	})
}

// routable is the engine addresses a router's /sd/replicas lists.
func (b *bench) routable(ops string) ([]string, error) {
	resp, err := b.client.Get("http://" + ops + "/sd/replicas")
	if err != nil {
		return nil, fmt.Errorf("sd: %w", err)
	}
	defer resp.Body.Close()
	var groups []struct {
		Targets []string `json:"targets"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&groups); err != nil {
		return nil, fmt.Errorf("sd: %w", err)
	}
	var out []string
	for _, g := range groups {
		out = append(out, g.Targets...)
	}
	return out, nil
}

// setupTenants creates the tenants and a key each: b interactive, a
// batch, f0…f9, cap and cost standard.
func (b *bench) setupTenants() error {
	classes := map[string]string{"a": "batch", "b": "interactive", "cap": "standard", "cost": "standard"}
	for i := range 10 {
		classes[fmt.Sprintf("f%d", i)] = "standard"
	}
	b.tenants = map[string]*tenant{}
	for name, class := range classes {
		args := []string{"tenant", "create", name}
		t := &tenant{name: name, class: class, ttl: classTTL[class], routers: []int{0, 1}}
		if b.classFlags {
			args = append(args, "--default-class", class, "--max-class", class)
		} else if class != "interactive" {
			t.header = http.Header{hdrPriority: {class}}
		}
		if _, err := b.c.CtlOut(args...); err != nil {
			return err
		}
		out, err := b.c.CtlOut("apikey", "create", "key-"+name, "--tenant", name)
		if err != nil {
			return err
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		t.key = strings.TrimSpace(lines[len(lines)-1])
		b.tenants[name] = t
	}
	// Every key in force on every router: one short request each, all at
	// once.
	return benchproc.Until(60*time.Second, "every tenant's key in force on every router", func() bool {
		var wg sync.WaitGroup
		var mu sync.Mutex
		ok := true
		for _, t := range b.tenants {
			for _, r := range b.c.Routers {
				wg.Go(func() {
					res := benchchat.Do(context.Background(), b.client, benchchat.Request{Addr: r.Addr, Key: t.key, Model: model,
						Prompt: "ready?", MaxTokens: 1, Stream: true, Header: t.header})
					if res.Code != http.StatusOK {
						mu.Lock()
						ok = false
						mu.Unlock()
					}
				})
			}
		}
		wg.Wait()
		return ok
	})
}
