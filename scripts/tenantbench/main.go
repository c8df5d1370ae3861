// Command tenantbench measures issue 28's must-shows for tenants on a real
// cluster on loopback: 3 `llmgw control` servers, one `llmgw agent` with
// simulated engines, and 3 `llmgw router`s, all separate processes.
//
// Phases:
//
//  1. alone: tenant B streams at half its input-token limit for --alone;
//     its TTFT p99 is the baseline.
//  2. main, --duration: tenant A (input_tpm = --limit) is offered 3 × its
//     limit split 70/20/10 over the routers; B as in phase 1, 10 % of its
//     streams cancelled mid-way. One router is killed at 45 % of the run
//     and the Raft leader at 65 %; a client whose router is gone moves to
//     the next one.
//     2b. side, --side: tenants E and S (the same rpm, S in shadow mode) get
//     the same offered load, and tenant C spends a daily token budget; the
//     leader is killed at 40 %.
//  3. usage: the routers are stopped (they flush), `llmgwctl usage` is read
//     and held against the engines' own counters, every server is
//     restarted and the usage read again.
//
// It prints, per full minute, A's admitted input tokens against the limit;
// B's 429s and TTFT p99 against phase 1; C's tokens against its budget;
// S's shadow refusals against E's refusals; usage against the engines.
// Run it with `make bench-tenants` (BENCH_FLAGS=... passes flags).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/llmgw/llmgw/scripts/internal/benchchat"
	"github.com/llmgw/llmgw/scripts/internal/benchproc"
)

type config struct {
	bin, ctl  string
	dir       string
	duration  time.Duration
	alone     time.Duration
	side      time.Duration
	limit     int
	budget    int
	rpm       int
	keep      bool
	promptLen int
}

func main() {
	var cfg config
	flag.StringVar(&cfg.bin, "llmgw", "bin/llmgw", "the llmgw binary")
	flag.StringVar(&cfg.ctl, "llmgwctl", "bin/llmgwctl", "the llmgwctl binary")
	flag.DurationVar(&cfg.duration, "duration", 5*time.Minute, "the main phase")
	flag.DurationVar(&cfg.alone, "alone", time.Minute, "tenant B alone, for its baseline TTFT")
	flag.DurationVar(&cfg.side, "side", 150*time.Second, "the phase of the shadow pair and the budget")
	flag.IntVar(&cfg.limit, "limit", 60000, "tenant A's input tokens per minute (B's too)")
	flag.IntVar(&cfg.budget, "budget", 150000, "tenant C's daily tokens")
	flag.IntVar(&cfg.rpm, "rpm", 120, "tenants E and S's requests per minute")
	flag.IntVar(&cfg.promptLen, "prompt-words", 150, "words in each prompt")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the processes' data and logs")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "tenantbench-")
	if err != nil {
		fail(err)
	}
	cfg.dir = dir
	b := &bench{cfg: cfg, c: &benchproc.Cluster{Bin: cfg.bin, Ctl: cfg.ctl, Dir: dir}}
	err = b.run(ctx)
	b.c.StopAll()
	if !cfg.keep {
		_ = os.RemoveAll(dir)
	} else {
		fmt.Println("logs and data in", dir)
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "tenantbench:", err)
	os.Exit(1)
}

type bench struct {
	cfg  config
	c    *benchproc.Cluster
	keys map[string]string
}

func (b *bench) startCluster() error {
	if err := b.c.StartServers(3); err != nil {
		return err
	}
	if err := b.c.StartAgent(4, "41000-41099"); err != nil {
		return err
	}
	for i := range 3 {
		if _, err := b.c.StartRouter(fmt.Sprintf("r%d", i+1)); err != nil {
			return err
		}
	}
	if err := b.c.ApplyModel("bench", "name: bench\nengine: sim\nmodel: org/bench\nreplicas: 4\ngpus_per_replica: 1\n"+
		"extra_args: [\"--sim-decode-ms-per-token\", \"2\", \"--sim-prefill-us-per-token\", \"300\", \"--enable-prompt-tokens-details\"]\n"); err != nil {
		return err
	}
	return benchproc.Until(120*time.Second, "every router serving the model", func() bool {
		for _, r := range b.c.Routers {
			if res := b.request(r.Addr, "", false, 4, 0); res.Code != http.StatusOK {
				return false
			}
		}
		return true
	})
}

// setupTenants creates the tenants and one key each.
func (b *bench) setupTenants() error {
	l := strconv.Itoa(b.cfg.limit)
	rpm := strconv.Itoa(b.cfg.rpm)
	for _, t := range [][]string{
		{"A", "--input-tpm", l},
		{"B", "--input-tpm", l},
		{"E", "--rpm", rpm},
		{"S", "--rpm", rpm, "--shadow"},
		{"C", "--daily-tokens", strconv.Itoa(b.cfg.budget)},
		{"X", "--rpm", "100000000", "--input-tpm", "1000000000000", "--output-tpm", "1000000000000", "--concurrency", "1000000"},
	} {
		if _, err := b.c.CtlOut(append([]string{"tenant", "create", strings.ToLower(t[0])}, t[1:]...)...); err != nil {
			return err
		}
	}
	b.keys = map[string]string{}
	for _, t := range []string{"A", "B", "E", "S", "C", "X", "off"} {
		args := []string{"apikey", "create", "key-" + strings.ToLower(t)}
		if t != "off" {
			args = append(args, "--tenant", strings.ToLower(t))
		}
		out, err := b.c.CtlOut(args...)
		if err != nil {
			return err
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		b.keys[t] = strings.TrimSpace(lines[len(lines)-1])
	}
	// Keys and shares reach every router: each admits a request of A.
	return benchproc.Until(30*time.Second, "tenant A's key in force on every router", func() bool {
		for _, r := range b.c.Routers {
			if res := b.request(r.Addr, b.keys["A"], false, 4, 0); res.Code != http.StatusOK {
				return false
			}
		}
		return true
	})
}

var prompt string

// seqNo numbers the prompts.
var seqNo atomic.Int64

var client = &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}

// request sends one chat completion with key through addr; a stream
// (usage asked) is cancelled after cancelAfter chunks when it is above 0.
func (b *bench) request(addr, key string, stream bool, maxTokens, cancelAfter int) benchchat.Result {
	// A number first: no two prompts share a prefix the engines cached,
	// so every request prefills its whole prompt.
	return benchchat.Do(context.Background(), client, benchchat.Request{Addr: addr, Key: key, Model: "bench",
		Prompt: strconv.FormatInt(seqNo.Add(1), 10) + " " + prompt, MaxTokens: maxTokens, Stream: stream, CancelAfter: cancelAfter})
}

// stream of one tenant's requests: rate per second through routers
// (weights), open loop, until ctx ends.
type stream struct {
	tenant      string
	weights     []float64 // per router
	rps         float64
	stream      bool
	maxTokens   int
	cancelEvery int // every n-th request is cancelled mid-way (0: none)

	mu      sync.Mutex
	results []benchchat.Result
}

func (b *bench) drive(ctx context.Context, s *stream, wg *sync.WaitGroup) {
	defer wg.Done()
	var n atomic.Int64
	var inflight sync.WaitGroup
	defer inflight.Wait()
	for i, w := range s.weights {
		if w == 0 {
			continue
		}
		inflight.Add(1)
		go func() {
			defer inflight.Done()
			period := time.Duration(float64(time.Second) / (s.rps * w))
			t := time.NewTicker(period)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				k := n.Add(1)
				inflight.Add(1)
				go func() {
					defer inflight.Done()
					cancelAfter := 0
					if s.cancelEvery > 0 && k%int64(s.cancelEvery) == 0 {
						cancelAfter = s.maxTokens / 2
					}
					var res benchchat.Result
					for try := range len(b.c.Routers) {
						r := b.c.Routers[(i+try)%len(b.c.Routers)]
						res = b.request(r.Addr, b.keys[s.tenant], s.stream, s.maxTokens, cancelAfter)
						if !res.ConnectError {
							break
						}
					}
					s.mu.Lock()
					s.results = append(s.results, res)
					s.mu.Unlock()
				}()
			}
		}()
	}
	<-ctx.Done()
}

func (s *stream) snapshot() []benchchat.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.results)
}

func p99(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(math.Ceil(0.99*float64(len(ds))))-1)]
}

func ttfts(rs []benchchat.Result) []time.Duration {
	var out []time.Duration
	for _, r := range rs {
		if r.Code == http.StatusOK && r.TTFT > 0 && !r.Cancelled {
			out = append(out, r.TTFT)
		}
	}
	return out
}

func count(rs []benchchat.Result, code int) int {
	n := 0
	for _, r := range rs {
		if r.Code == code {
			n++
		}
	}
	return n
}

func (b *bench) run(ctx context.Context) error {
	prompt = strings.Repeat("lorem ipsum ", b.cfg.promptLen/2)
	fmt.Println("starting 3 servers, an agent and 3 routers in", b.cfg.dir)
	if err := b.startCluster(); err != nil {
		return err
	}
	if err := b.setupTenants(); err != nil {
		return err
	}
	probe := b.request(b.c.Routers[0].Addr, b.keys["X"], false, 4, 0)
	if probe.Input == 0 {
		return errors.New("the probe request reported no prompt tokens")
	}
	fmt.Printf("each prompt is %d tokens\n", probe.Input)
	perReq := float64(probe.Input)
	even := []float64{1.0 / 3, 1.0 / 3, 1.0 / 3}

	if err := b.cost(ctx); err != nil {
		return err
	}

	// 1. B alone.
	bRate := 0.5 * float64(b.cfg.limit) / perReq / 60
	alone := &stream{tenant: "B", weights: even, rps: bRate, stream: true, maxTokens: 32}
	var wg sync.WaitGroup
	actx, acancel := context.WithTimeout(ctx, b.cfg.alone)
	wg.Add(1)
	go b.drive(actx, alone, &wg)
	wg.Wait()
	acancel()
	aloneP99 := p99(ttfts(alone.snapshot()))
	fmt.Printf("B alone: %d requests, TTFT p99 %v\n", len(alone.snapshot()), aloneP99)

	// 2. Main.
	aRate := 3 * float64(b.cfg.limit) / perReq / 60
	streams := map[string]*stream{
		"A": {tenant: "A", weights: []float64{0.7, 0.2, 0.1}, rps: aRate, maxTokens: 8},
		"B": {tenant: "B", weights: even, rps: bRate, stream: true, maxTokens: 32, cancelEvery: 10},
	}
	// The shadow pair and the budget run in a phase of their own, after
	// the main one, so the isolation figure is A's load against B's.
	side := map[string]*stream{
		"E": {tenant: "E", weights: even, rps: 2 * float64(b.cfg.rpm) / 60, maxTokens: 8},
		"S": {tenant: "S", weights: even, rps: 2 * float64(b.cfg.rpm) / 60, maxTokens: 8},
		"C": {tenant: "C", weights: even, rps: 1.5 * float64(b.cfg.budget) / (perReq + 32) / (0.6 * b.cfg.side.Seconds()), maxTokens: 32},
	}
	start := time.Now()
	mctx, mcancel := context.WithTimeout(ctx, b.cfg.duration)
	defer mcancel()
	for _, s := range streams {
		wg.Add(1)
		go b.drive(mctx, s, &wg)
	}
	killRouterAt, killLeaderAt := time.Duration(0.45*float64(b.cfg.duration)), time.Duration(0.65*float64(b.cfg.duration))
	events := map[int]string{}
	go func() {
		select {
		case <-mctx.Done():
			return
		case <-time.After(killRouterAt):
		}
		b.c.Routers[2].Kill()
		events[int(killRouterAt/time.Minute)] += " router r3 killed"
		fmt.Printf("%v: killed router r3\n", killRouterAt)
		select {
		case <-mctx.Done():
			return
		case <-time.After(killLeaderAt - killRouterAt):
		}
		if lead := b.killLeader(); lead != "" {
			events[int(killLeaderAt/time.Minute)] += " leader " + lead + " killed"
			fmt.Printf("%v: killed leader %s\n", killLeaderAt, lead)
		}
	}()
	wg.Wait()
	fmt.Printf("main phase done after %v\n", time.Since(start).Round(time.Second))

	// 2b. The shadow pair and the budget, a leader killed at 40 %.
	sctx, scancel := context.WithTimeout(ctx, b.cfg.side)
	defer scancel()
	for _, s := range side {
		wg.Add(1)
		go b.drive(sctx, s, &wg)
	}
	go func() {
		select {
		case <-sctx.Done():
		case <-time.After(time.Duration(0.4 * float64(b.cfg.side))):
			fmt.Printf("side phase: killed leader %s\n", b.killLeader())
		}
	}()
	wg.Wait()
	fmt.Println()

	// A per full minute.
	ra := streams["A"].snapshot()
	minutes := int(b.cfg.duration / time.Minute)
	fmt.Printf("A: input_tpm limit %d, offered 3x split 70/20/10\n", b.cfg.limit)
	fmt.Println("| minute | admitted input tokens | × limit | 429s | events |")
	fmt.Println("|---|---|---|---|---|")
	worst := 0.0
	for m := range minutes {
		tok, refused := 0, 0
		for _, r := range ra {
			if int(r.Sent.Sub(start)/time.Minute) != m {
				continue
			}
			if r.Code == http.StatusOK {
				tok += r.Input
			} else if r.Code == http.StatusTooManyRequests {
				refused++
			}
		}
		ratio := float64(tok) / float64(b.cfg.limit)
		worst = max(worst, math.Abs(ratio-1))
		fmt.Printf("| %d | %d | %.3f | %d |%s |\n", m+1, tok, ratio, refused, events[m])
	}
	fmt.Printf("A: worst minute off the limit by %.1f %%\n\n", 100*worst)

	rb := streams["B"].snapshot()
	fmt.Printf("B (isolation, half its limit): %d requests, %d × 429, %d other errors, TTFT p99 %v vs %v alone (× %.2f)\n",
		len(rb), count(rb, http.StatusTooManyRequests), len(rb)-count(rb, http.StatusOK)-count(rb, http.StatusTooManyRequests),
		p99(ttfts(rb)), aloneP99, float64(p99(ttfts(rb)))/float64(max(1, aloneP99)))

	rc := side["C"].snapshot()
	ctok := 0
	for _, r := range rc {
		if r.Code == http.StatusOK {
			ctok += r.Input + r.Out
		}
	}
	fmt.Printf("C (daily budget %d): %d tokens served (%+d vs the budget; one request's output reservation is 32), %d × 429\n",
		b.cfg.budget, ctok, ctok-b.cfg.budget, count(rc, http.StatusTooManyRequests))

	// 3. Usage: stop the routers (they flush), read, hold against the
	// engines, restart the servers, read again.
	for _, r := range b.c.Routers {
		r.Stop()
	}
	engIn, engOut, err := b.engineTokens()
	if err != nil {
		return err
	}
	u1, err := b.usage()
	if err != nil {
		return err
	}
	eRefused := count(side["E"].snapshot(), http.StatusTooManyRequests)
	fmt.Printf("E refused %d (roll-up %d); S (shadow) counted %d would-be refusals and was refused %d times: %+.1f %%\n",
		eRefused, u1["e"].Refused, u1["s"].ShadowRefused, count(side["S"].snapshot(), http.StatusTooManyRequests),
		100*(float64(u1["s"].ShadowRefused)-float64(eRefused))/float64(max(1, eRefused)))
	var in, out uint64
	for _, c := range u1 {
		in += c.InputTokens
		out += c.OutputTokens
	}
	cancelled := 0
	for _, r := range rb {
		if r.Cancelled {
			cancelled++
		}
	}
	fmt.Printf("usage (every tenant, %d streams cancelled mid-way): input %d vs engines %d (%+.3f %%), output %d vs engines %d (%+.3f %%)\n",
		cancelled, in, engIn, 100*(float64(in)-float64(engIn))/float64(engIn), out, engOut, 100*(float64(out)-float64(engOut))/float64(engOut))
	for _, s := range b.c.Servers {
		s.Stop()
	}
	for _, s := range b.c.Servers {
		if err := s.Start(b.cfg.bin); err != nil {
			return err
		}
	}
	if err := benchproc.Until(60*time.Second, "a leader after restarting every server", func() bool { return b.c.Leader() != "" }); err != nil {
		return err
	}
	var u2 map[string]counts
	if err := benchproc.Until(30*time.Second, "usage readable after the restart", func() bool { u2, err = b.usage(); return err == nil }); err != nil {
		return err
	}
	same := true
	for t, c := range u1 {
		if u2[t] != c {
			same = false
			fmt.Printf("tenant %s: %+v before the restart, %+v after\n", t, c, u2[t])
		}
	}
	fmt.Printf("usage after restarting every router and server: identical %v\n", same)
	return nil
}

// killLeader kills -9 the leader and starts it again 2 s later; it
// returns the leader's id ("" when none was known).
func (b *bench) killLeader() string {
	lead := b.c.Leader()
	for _, s := range b.c.Servers {
		if s.Name == lead {
			s.Kill()
			time.Sleep(2 * time.Second)
			_ = s.Start(b.cfg.bin)
			return lead
		}
	}
	return ""
}

type counts struct {
	Requests      uint64 `json:"requests"`
	Refused       uint64 `json:"refused"`
	ShadowRefused uint64 `json:"shadow_refused"`
	InputTokens   uint64 `json:"input_tokens"`
	CachedTokens  uint64 `json:"cached_tokens"`
	OutputTokens  uint64 `json:"output_tokens"`
}

// usage sums `llmgwctl usage -o json` per tenant, read from the leader
// (a follower's copy may lag).
func (b *bench) usage() (map[string]counts, error) {
	lead := b.c.Leader()
	var out string
	err := errors.New("no leader")
	for _, s := range b.c.Servers {
		if s.Name == lead && s.Running() {
			var o []byte
			o, err = exec.Command(b.cfg.ctl, "--addr", s.Addr, "--timeout", "20s", "usage", "--since", "48h", "-o", "json").Output()
			out = string(o)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("usage from the leader %q: %w", lead, err)
	}
	var rows []struct {
		Tenant string `json:"tenant"`
		Counts counts `json:"counts"`
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		return nil, fmt.Errorf("decode usage: %w: %s", err, out)
	}
	sum := map[string]counts{}
	for _, r := range rows {
		c := sum[r.Tenant]
		c.Requests += r.Counts.Requests
		c.Refused += r.Counts.Refused
		c.ShadowRefused += r.Counts.ShadowRefused
		c.InputTokens += r.Counts.InputTokens
		c.CachedTokens += r.Counts.CachedTokens
		c.OutputTokens += r.Counts.OutputTokens
		sum[r.Tenant] = c
	}
	return sum, nil
}

// engineTokens sums every engine's vllm:prompt_tokens_total and
// vllm:generation_tokens_total.
func (b *bench) engineTokens() (in, out uint64, err error) {
	o, err := b.c.CtlOut("replica", "list", "-o", "json")
	if err != nil {
		return 0, 0, err
	}
	var list []struct {
		Address string `json:"address"`
	}
	if err := json.Unmarshal([]byte(o), &list); err != nil {
		return 0, 0, err
	}
	for _, r := range list {
		if r.Address == "" {
			continue
		}
		resp, err := client.Get("http://" + r.Address + "/metrics")
		if err != nil {
			return 0, 0, err
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			l := sc.Text()
			f := strings.Fields(l)
			if len(f) < 2 {
				continue
			}
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			switch {
			case strings.HasPrefix(l, "vllm:prompt_tokens_total"):
				in += uint64(v)
			case strings.HasPrefix(l, "vllm:generation_tokens_total"):
				out += uint64(v)
			}
		}
		resp.Body.Close()
	}
	return in, out, nil
}

// cost alternates 15 s of closed-loop load through router r1 with a key
// of tenant X (every limit set, none binding) and with a key of no
// tenant (metering only), four times each, and prints r1's CPU per
// request and the throughput of each.
func (b *bench) cost(ctx context.Context) error {
	r := b.c.Routers[0]
	type agg struct {
		n   int64
		cpu time.Duration
		d   time.Duration
	}
	res := map[string]*agg{"limits on (tenant X)": {}, "limits off (no tenant)": {}}
	for round := range 8 {
		name, key := "limits on (tenant X)", b.keys["X"]
		if round%2 == 1 {
			name, key = "limits off (no tenant)", b.keys["off"]
		}
		var n atomic.Int64
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		c0, t0 := r.CPU(), time.Now()
		var wg sync.WaitGroup
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for cctx.Err() == nil {
					if res := b.request(r.Addr, key, false, 1, 0); res.Code == http.StatusOK {
						n.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		cancel()
		a := res[name]
		a.n += n.Load()
		a.cpu += r.CPU() - c0
		a.d += time.Since(t0)
	}
	fmt.Println("| router r1 | requests/s | CPU µs per request |")
	fmt.Println("|---|---|---|")
	for _, name := range []string{"limits off (no tenant)", "limits on (tenant X)"} {
		a := res[name]
		fmt.Printf("| %s | %.0f | %.0f |\n", name, float64(a.n)/a.d.Seconds(), float64(a.cpu.Microseconds())/float64(a.n))
	}
	fmt.Println()
	return nil
}
