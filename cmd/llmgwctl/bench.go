package main

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/bench"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// benchCmd is `llmgwctl bench` (design §10): it drives routers over the OpenAI
// API; the control plane at --addr is asked only which engines serve the
// model, to reset their caches before every run and tokenize for the
// ceiling.
func (c *cli) benchCmd() *cobra.Command {
	cfg := bench.DefaultConfig()
	var (
		targets  []string
		metrics  []string
		adapters string
		chart    string
		quiet    bool
		verbose  bool
		caCert   string
		seeds    string
		engines  []string
		replay   []string
	)
	cmd := &cobra.Command{
		Use:   "bench --target URL --model NAME [flags]",
		Short: "Drive routers with a workload and report TTFT, ITL, throughput, cache hits and replica spread",
		Long: `Drive one or more routers with a named workload over the OpenAI API (--api
chat: /v1/chat/completions; responses: /v1/responses) or Anthropic's Messages
API (--api messages: /v1/messages), and report
time to first token, inter-token latency, end-to-end latency (p50/p90/p99),
throughput, errors, the cache-hit share (cached_tokens / prompt_tokens) and the
spread of requests over replicas (X-Llmgw-Replica).

Each --target is benchmarked in turn with the same prompts and printed side by
side; with --targets-round-robin they form one run whose requests alternate
over them. A target may carry a label: --target least-loaded=http://a:8080.

Fair comparisons: before every run the engines' prefix caches are emptied
(--reset-caches, on by default): the ready replicas of --model that the control
plane at --addr lists, or the --engine URLs. Without it the second of two
identical targets inherits the first one's warm cache. An engine without POST
/reset_prefix_cache (vLLM serves it only with VLLM_SERVER_DEV_MODE=1) is warned
of and the run goes on, marked "cache not reset"; with --reset-caches given
explicitly it is an error instead. A run that started warm
anyway is detected (cached tokens that no earlier request of the run had sent)
and refused in a comparison unless --allow-warm.

cache_hit_ceiling is the hit share an ideal router with unbounded caches would
reach on the run's own requests (each block a miss only the first time it is
sent), counted on the engine's own tokenization (POST /tokenize at
--tokenize-url, else the first engine); hit/ceiling reads the hit share
against it. --seeds repeats the comparison per seed and prints mean, range and
seed-by-seed wins; "llmgwctl bench summarize" does the same from saved JSON.

Workloads: ` + strings.Join(bench.WorkloadNames(), ", ") + `.`,
		Example: `  llmgwctl bench --target http://127.0.0.1:8080 --model demo --workload multi-turn --concurrency 8 --requests 200
  llmgwctl bench --target a=http://10.0.0.1:8080 --target b=http://10.0.0.2:8080 --model demo --rate 5 --duration 2m --chart ttft.svg
  llmgwctl bench --target http://r1:8080 --target http://r2:8080 --targets-round-robin --model demo -o json
  llmgwctl bench --target http://127.0.0.1:8080 --model demo --replay /var/lib/llmgw/capture.jsonl,/var/lib/llmgw/capture.jsonl.1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(metrics) > 0 && len(metrics) != len(targets) {
				return fmt.Errorf("--target-metrics: give one per --target, in the same order (%d targets, %d given)", len(targets), len(metrics))
			}
			for i, s := range targets {
				t, err := bench.ParseTarget(s)
				if err != nil {
					return err
				}
				if len(metrics) > 0 {
					if t.Metrics, err = bench.ParseMetricsURL(metrics[i]); err != nil {
						return err
					}
				}
				cfg.Targets = append(cfg.Targets, t)
			}
			if caCert != "" {
				pool, err := readCAs(caCert)
				if err != nil {
					return err
				}
				cfg.RootCAs = pool
			}
			if adapters != "" {
				cfg.Workload.Adapters = strings.Split(adapters, ",")
			}
			if len(replay) > 0 {
				if cmd.Flags().Changed("workload") && cfg.Workload.Name != bench.Replay {
					return fmt.Errorf("--replay: replays a capture; it does not go with --workload %s", cfg.Workload.Name)
				}
				capt, err := bench.LoadCapture(replay...)
				if err != nil {
					return err
				}
				recs := capt.Records
				if capt.TextOnly > 0 {
					fmt.Fprintf(cmd.ErrOrStderr(), "replay: %d of %d requests were captured with their text's chunks only (the router's /tokenize timed out); "+
						"%d of them replay with the engine blocks their text shared with another request, the rest as prompts of their own\n",
						capt.TextOnly, len(recs), capt.Lent)
				}
				cfg.Workload.Name, cfg.Workload.Records = bench.Replay, recs
				// Every captured request, at its time: no budget or
				// loop of its own.
				if !cmd.Flags().Changed("requests") {
					cfg.Requests = len(recs)
				}
				if !cmd.Flags().Changed("concurrency") {
					cfg.Concurrency = 0
				}
			}
			// --rate picks the open loop; the default concurrency then steps aside.
			if cmd.Flags().Changed("rate") && !cmd.Flags().Changed("concurrency") {
				cfg.Concurrency = 0
			}
			// --duration alone means "for this long", not "for this long or 100 requests".
			if cmd.Flags().Changed("duration") && !cmd.Flags().Changed("requests") {
				cfg.Requests = 0
			}
			if cmd.Flags().Changed("seeds") {
				list, err := bench.ParseSeeds(seeds, cfg.Workload.Seed)
				if err != nil {
					return err
				}
				cfg.Seeds = list
			}
			level := slog.LevelWarn
			if verbose {
				level = slog.LevelDebug
			}
			cfg.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if err := cfg.Validate(); err != nil {
				return err
			}
			// Asked for by name, the reset is required: an engine without
			// one is an error, not a run marked "cache not reset".
			cfg.RequireReset = cfg.ResetCaches && cmd.Flags().Changed("reset-caches")
			if err := c.benchEngines(ctx, &cfg, engines, cmd.Flags().Changed("reset-caches")); err != nil {
				return err
			}
			if !quiet && isTerminal(os.Stderr) {
				p := newProgress(cfg, os.Stderr, time.Now)
				defer p.finish()
				cfg.Progress = func(bench.Sample) { p.add() }
			}
			res, runErr := bench.Run(ctx, cfg)
			if len(res.Runs) == 0 {
				return runErr
			}
			if err := c.printBench(res); err != nil {
				return err
			}
			if chart != "" {
				if err := writeChart(chart, res); err != nil {
					return err
				}
			}
			return runErr
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&targets, "target", nil, "router base URL, or label=URL; repeat to compare several side by side")
	f.StringArrayVar(&metrics, "target-metrics", nil, "each --target's operations port (http://host:port, its --ops-addr), in the same order, to report the routers' decisions")
	f.BoolVar(&cfg.RoundRobin, "targets-round-robin", false, "one run alternating requests over all targets, as behind a round-robin balancer")
	f.StringVar(&cfg.Workload.Model, "model", "", "model name sent in every request")
	f.StringVar(&cfg.APIKey, "api-key", os.Getenv("LLMGW_API_KEY"), "router API key sent as `Authorization: Bearer KEY` (env LLMGW_API_KEY)")
	f.StringVar(&caCert, "ca-cert", "", "trust only the CA certificates in this PEM file for https targets (a router whose --https-cert the system does not trust, such as one made by llmgwctl tls init)")
	f.StringVar(&cfg.Workload.Name, "workload", cfg.Workload.Name, "workload: "+strings.Join(bench.WorkloadNames(), ", "))
	f.StringVar(&cfg.API, "api", bench.APIChat, "wire format of the requests: "+strings.Join(bench.APINames(), ", ")+" (/v1/chat/completions, /v1/messages, /v1/responses)")
	f.Uint64Var(&cfg.Workload.Seed, "seed", 1, "seed of the prompts and arrivals, for repeatable runs")
	f.IntVar(&cfg.Workload.MaxTokens, "max-tokens", 0, "max_tokens of each request (0: 128)")
	f.IntVar(&cfg.Workload.Groups, "groups", 0, "shared system prompts (shared-prefix, lora-mix; 0: 8) or shared documents (long-context; 0: 2)")
	f.IntVar(&cfg.Workload.SystemWords, "system-words", 0, "words in a shared system prompt (0: 1000; multi-turn 200)")
	f.IntVar(&cfg.Workload.PromptWords, "prompt-words", 0, "words in each request's own part (0: question 100, multi-turn message 50, agent-session tool output 60, long-context document 4000)")
	f.IntVar(&cfg.Workload.Sessions, "sessions", 0, "multi-turn chats or agent sessions open at once (0: 8)")
	f.IntVar(&cfg.Workload.Turns, "turns", 0, "turns per multi-turn chat (0: 5) or agent session (0: 30)")
	f.Float64Var(&cfg.Workload.SharedShare, "shared-share", 0, "long-context: share of requests reusing a shared document (0: 0.25, negative: none)")
	f.IntVar(&cfg.Workload.ActiveGroups, "active-groups", 0, "shared-prefix, lora-mix: groups active at a time (teams' system prompts used in bursts): requests draw only from these, and the active set moves on every --rotate-every requests, so a group idles (groups/active-groups − 1)·rotate-every requests between bursts (0: all always active)")
	f.IntVar(&cfg.Workload.RotateEvery, "rotate-every", 0, "with --active-groups: requests per phase before the next groups take over (counted in requests so a seed's prompts never depend on timing; under --rate R a phase is rotate-every/R seconds)")
	f.Float64Var(&cfg.Workload.HotShare, "hot-share", 0, "shared-prefix, lora-mix: share of requests using the first system prompt, the rest spread over the others (0: all alike)")
	f.StringVar(&adapters, "adapters", "", "lora-mix: comma-separated adapter names, most popular first (Zipf)")
	f.StringSliceVar(&replay, "replay", nil, "replay a router's capture (llmgw router --capture-path): every request at its captured time, prompts sharing what the captured ones shared, of their lengths; give the rotated files too (FILE,FILE.1,...) to replay all of it")
	f.Float64Var(&cfg.Workload.ReplaySpeed, "replay-speed", 1, "--replay: send this many times faster than captured")
	f.Float64Var(&cfg.Rate, "rate", 0, "open loop: Poisson arrivals per second")
	f.IntVar(&cfg.Concurrency, "concurrency", cfg.Concurrency, "closed loop: clients each sending when answered")
	f.DurationVar(&cfg.Duration, "duration", 0, "stop sending after this long")
	f.IntVar(&cfg.Requests, "requests", cfg.Requests, "stop after this many requests")
	f.DurationVar(&cfg.RequestTimeout, "request-timeout", cfg.RequestTimeout, "bound on one request, stream included")
	f.StringVar(&seeds, "seeds", "", "run the comparison once per seed and summarize: a count from --seed (10), a list (1,4,7) or a range (1-10)")
	f.BoolVar(&cfg.ResetCaches, "reset-caches", true, "empty the engines' prefix caches before every run (the ready replicas of --model at --addr's control plane, or --engine)")
	f.StringArrayVar(&engines, "engine", nil, "an engine's base URL (http://host:port) to reset and tokenize with, instead of asking the control plane; repeat for each")
	f.DurationVar(&cfg.ResetSettle, "reset-settle", cfg.ResetSettle, "wait after resetting the caches, for the routers' KV indexes to hear of it")
	f.StringVar(&cfg.TokenizeURL, "tokenize-url", "", "engine whose POST /tokenize counts the cache_hit_ceiling's blocks (default: the first engine, else the first target)")
	f.IntVar(&cfg.BlockSize, "block-size", 0, "the engines' KV block size in tokens for the ceiling (0: the engine's vllm:cache_config_info, else 16)")
	f.BoolVar(&cfg.AllowWarm, "allow-warm", false, "compare runs even when one started on caches warmed before it")
	f.StringVar(&chart, "chart", "", "also write an SVG chart (TTFT, ITL and end-to-end percentiles, cache-hit share and ceiling, TTFT CDF, the seeds' summary) to this file")
	f.BoolVarP(&quiet, "quiet", "q", false, "no progress bar")
	f.BoolVarP(&verbose, "verbose", "v", false, "log every failed request to stderr")
	cmd.AddCommand(c.benchSummarizeCmd())
	return cmd
}

// benchEngines fills cfg.Engines: the --engine URLs, else the ready
// replicas of the model the control plane lists. When the control plane
// cannot be asked, a single run goes on without a reset (there is nothing
// to compare it with) unless --reset-caches was asked for; a comparison
// stops with what to do.
func (c *cli) benchEngines(ctx context.Context, cfg *bench.Config, urls []string, resetAsked bool) error {
	if len(urls) > 0 {
		for _, u := range urls {
			if _, err := bench.ParseTarget(u); err != nil {
				return fmt.Errorf("--engine %q: want http://host:port", u)
			}
		}
		cfg.Engines = func(context.Context) ([]string, error) { return urls, nil }
		return nil
	}
	if cfg.Workload.Model == "" {
		return nil // Validate names --model
	}
	cfg.Engines = func(ctx context.Context) ([]string, error) { return c.modelEngines(ctx, cfg.Workload.Model) }
	if !cfg.ResetCaches {
		return nil
	}
	if _, err := cfg.Engines(ctx); err != nil {
		runs := len(cfg.Targets) * max(len(cfg.Seeds), 1)
		if cfg.RoundRobin {
			runs = max(len(cfg.Seeds), 1)
		}
		if resetAsked || runs > 1 {
			return fmt.Errorf("--reset-caches: %w; give the engines with --engine URL, or --reset-caches=false to compare on whatever the caches hold", err)
		}
		cfg.Logger.Warn("engines' caches not reset: the control plane could not list them", "err", err)
		cfg.ResetCaches = false
	}
	return nil
}

// modelEngines lists the base URLs of the model's ready replicas.
func (c *cli) modelEngines(ctx context.Context, model string) ([]string, error) {
	var out []string
	err := c.admin(ctx, func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
		resp, err := a.ListReplicas(ctx, &llmgwv1.ListRequest{})
		if err != nil {
			return fmt.Errorf("replica list: %w", err)
		}
		for _, v := range resp.Replicas {
			r, s := v.GetReplica(), v.GetStatus()
			if r.GetModel() == model && s.GetUid() == r.GetUid() && s.GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY && s.GetAddress() != "" {
				out = append(out, "http://"+s.GetAddress())
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("the control plane at %s lists no ready replica of %q", c.addr, model)
	}
	sort.Strings(out)
	return out, nil
}

// benchSummarizeCmd is `llmgwctl bench summarize`: the seeds' summary (and
// chart) of runs saved with -o json, so a script that ran each
// configuration by itself — a model re-applied between them — still gets
// the seed-by-seed comparison.
func (c *cli) benchSummarizeCmd() *cobra.Command {
	var chart string
	cmd := &cobra.Command{
		Use:   "summarize FILE...",
		Short: "Summarize saved bench JSON (-o json) over seeds: mean, range and seed-by-seed wins",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(_ *cobra.Command, files []string) error {
			var res bench.Result
			for _, f := range files {
				runs, err := readRuns(f)
				if err != nil {
					return err
				}
				res.Runs = append(res.Runs, runs...)
			}
			res.Summary = bench.SummarizeSeeds(res.Runs)
			if err := c.printBench(res); err != nil {
				return err
			}
			if chart != "" {
				return writeChart(chart, res)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&chart, "chart", "", "also write the SVG chart of the runs to this file")
	return cmd
}

// readRuns reads one -o json output: a report, or {"runs": [...]}.
func readRuns(path string) ([]bench.Report, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var probe struct {
		Runs  []bench.Report `json:"runs"`
		Label *string        `json:"label"`
	}
	if err := json.Unmarshal(raw, &probe); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if probe.Runs != nil {
		return probe.Runs, nil
	}
	if probe.Label == nil {
		return nil, fmt.Errorf("%s: neither a bench report nor {\"runs\": [...]}", path)
	}
	var r bench.Report
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return []bench.Report{r}, nil
}

// printBench prints one run as itself and several as {"runs": [...]}, so a
// script driving one target reads the keys at the top.
func (c *cli) printBench(res bench.Result) error {
	if c.output == "json" {
		if len(res.Runs) == 1 && res.Summary == nil {
			return c.printJSON(res.Runs[0])
		}
		return c.printJSON(res)
	}
	if res.Summary != nil {
		// The runs seed by seed are -o json's; the table is the verdict.
		header, rows := res.Summary.Table()
		return c.printTable(header, rows)
	}
	header, rows := res.Table()
	return c.printTable(header, rows)
}

// readCAs is --ca-cert: a PEM file of one or more CA certificates.
func readCAs(path string) (*x509.CertPool, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--ca-cert: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(raw) {
		return nil, fmt.Errorf("--ca-cert %s: no PEM certificate in it", path)
	}
	return pool, nil
}

func writeChart(path string, res bench.Result) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--chart: %w", err)
	}
	if err := bench.WriteChart(f, res); err != nil {
		f.Close()
		return fmt.Errorf("--chart: write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--chart: write %s: %w", path, err)
	}
	return nil
}

// progress is the bar on a terminal: a count against the requests of every
// run, and a rate of its own. progressbar's rate counts from its first
// redraw, the first answer, so its first tick divided one request by
// microseconds ("120308 req/s"); this one counts from the bar's creation and
// says nothing until a second has passed.
type progress struct {
	bar   *progressbar.ProgressBar
	start time.Time
	now   func() time.Time
	n     atomic.Int64
}

func newProgress(cfg bench.Config, w io.Writer, now func() time.Time) *progress {
	total := -1
	if cfg.Requests > 0 {
		runs := len(cfg.Targets)
		if cfg.RoundRobin {
			runs = 1
		}
		total = cfg.Requests * runs * max(len(cfg.Seeds), 1)
	}
	return &progress{
		start: now(), now: now,
		bar: progressbar.NewOptions(total,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription("bench"),
			progressbar.OptionShowCount(),
			progressbar.OptionSetSpinnerChangeInterval(0),
			progressbar.OptionClearOnFinish(),
		),
	}
}

func (p *progress) add() {
	n := p.n.Add(1)
	p.bar.Describe("bench " + rateText(n, p.now().Sub(p.start)))
	_ = p.bar.Add(1)
}

func (p *progress) finish() { _ = p.bar.Finish() }

// rateText is the rate of n requests over elapsed, or a placeholder while
// too little time has passed for a rate to mean anything.
func rateText(n int64, elapsed time.Duration) string {
	if elapsed < time.Second {
		return "(- req/s)"
	}
	return fmt.Sprintf("(%.1f req/s)", float64(n)/elapsed.Seconds())
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
