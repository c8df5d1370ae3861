package main

import (
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/bench"
)

// benchCmd is `llmgwctl bench` (design §10): it drives routers over the OpenAI
// API, not the control plane, so --addr plays no part.
func (c *cli) benchCmd() *cobra.Command {
	cfg := bench.DefaultConfig()
	var (
		targets  []string
		adapters string
		chart    string
		quiet    bool
		verbose  bool
		caCert   string
	)
	cmd := &cobra.Command{
		Use:   "bench --target URL --model NAME [flags]",
		Short: "Drive routers with a workload and report TTFT, ITL, throughput, cache hits and replica spread",
		Long: `Drive one or more routers with a named workload over the OpenAI API and report
time to first token, inter-token latency, end-to-end latency (p50/p90/p99),
throughput, errors, the cache-hit share (cached_tokens / prompt_tokens) and the
spread of requests over replicas (X-Llmgw-Replica).

Each --target is benchmarked in turn with the same prompts and printed side by
side; with --targets-round-robin they form one run whose requests alternate
over them. A target may carry a label: --target least-loaded=http://a:8080.

Workloads: ` + strings.Join(bench.WorkloadNames(), ", ") + `.`,
		Example: `  llmgwctl bench --target http://127.0.0.1:8080 --model demo --workload multi-turn --concurrency 8 --requests 200
  llmgwctl bench --target a=http://10.0.0.1:8080 --target b=http://10.0.0.2:8080 --model demo --rate 5 --duration 2m --chart ttft.svg
  llmgwctl bench --target http://r1:8080 --target http://r2:8080 --targets-round-robin --model demo -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, s := range targets {
				t, err := bench.ParseTarget(s)
				if err != nil {
					return err
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
			// --rate picks the open loop; the default concurrency then steps aside.
			if cmd.Flags().Changed("rate") && !cmd.Flags().Changed("concurrency") {
				cfg.Concurrency = 0
			}
			// --duration alone means "for this long", not "for this long or 100 requests".
			if cmd.Flags().Changed("duration") && !cmd.Flags().Changed("requests") {
				cfg.Requests = 0
			}
			if err := cfg.Validate(); err != nil {
				return err
			}
			level := slog.LevelWarn
			if verbose {
				level = slog.LevelDebug
			}
			cfg.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			if !quiet && isTerminal(os.Stderr) {
				bar := newBar(cfg)
				defer bar.Finish()
				cfg.Progress = func(bench.Sample) { _ = bar.Add(1) }
			}

			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
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
	f.BoolVar(&cfg.RoundRobin, "targets-round-robin", false, "one run alternating requests over all targets, as behind a round-robin balancer")
	f.StringVar(&cfg.Workload.Model, "model", "", "model name sent in every request")
	f.StringVar(&cfg.APIKey, "api-key", os.Getenv("LLMGW_API_KEY"), "router API key sent as `Authorization: Bearer KEY` (env LLMGW_API_KEY)")
	f.StringVar(&caCert, "ca-cert", "", "trust only the CA certificates in this PEM file for https targets (a router whose --https-cert the system does not trust, such as one made by llmgwctl tls init)")
	f.StringVar(&cfg.Workload.Name, "workload", cfg.Workload.Name, "workload: "+strings.Join(bench.WorkloadNames(), ", "))
	f.Uint64Var(&cfg.Workload.Seed, "seed", 1, "seed of the prompts and arrivals, for repeatable runs")
	f.IntVar(&cfg.Workload.MaxTokens, "max-tokens", 0, "max_tokens of each request (0: 128)")
	f.IntVar(&cfg.Workload.Groups, "groups", 0, "shared system prompts (shared-prefix, lora-mix; 0: 8) or shared documents (long-context; 0: 2)")
	f.IntVar(&cfg.Workload.SystemWords, "system-words", 0, "words in a shared system prompt (0: 1000; multi-turn 200)")
	f.IntVar(&cfg.Workload.PromptWords, "prompt-words", 0, "words in each request's own part (0: question 100, multi-turn message 50, long-context document 4000)")
	f.IntVar(&cfg.Workload.Sessions, "sessions", 0, "multi-turn chats open at once (0: 8)")
	f.IntVar(&cfg.Workload.Turns, "turns", 0, "turns per multi-turn chat (0: 5)")
	f.Float64Var(&cfg.Workload.SharedShare, "shared-share", 0, "long-context: share of requests reusing a shared document (0: 0.25, negative: none)")
	f.Float64Var(&cfg.Workload.HotShare, "hot-share", 0, "shared-prefix, lora-mix: share of requests using the first system prompt, the rest spread over the others (0: all alike)")
	f.StringVar(&adapters, "adapters", "", "lora-mix: comma-separated adapter names, most popular first (Zipf)")
	f.Float64Var(&cfg.Rate, "rate", 0, "open loop: Poisson arrivals per second")
	f.IntVar(&cfg.Concurrency, "concurrency", cfg.Concurrency, "closed loop: clients each sending when answered")
	f.DurationVar(&cfg.Duration, "duration", 0, "stop sending after this long")
	f.IntVar(&cfg.Requests, "requests", cfg.Requests, "stop after this many requests")
	f.DurationVar(&cfg.RequestTimeout, "request-timeout", cfg.RequestTimeout, "bound on one request, stream included")
	f.StringVar(&chart, "chart", "", "also write an SVG chart (TTFT percentiles, cache-hit share, TTFT CDF) to this file")
	f.BoolVarP(&quiet, "quiet", "q", false, "no progress bar")
	f.BoolVarP(&verbose, "verbose", "v", false, "log every failed request to stderr")
	return cmd
}

// printBench prints one run as itself and several as {"runs": [...]}, so a
// script driving one target reads the keys at the top.
func (c *cli) printBench(res bench.Result) error {
	if c.output == "json" {
		if len(res.Runs) == 1 {
			return c.printJSON(res.Runs[0])
		}
		return c.printJSON(res)
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

// newBar counts requests against --requests, or spins with a count for a
// --duration run. No spinner timer: the bar redraws on each request, so it
// starts no goroutine of its own.
func newBar(cfg bench.Config) *progressbar.ProgressBar {
	total := -1
	if cfg.Requests > 0 {
		total = cfg.Requests * len(cfg.Targets)
		if cfg.RoundRobin {
			total = cfg.Requests
		}
	}
	return progressbar.NewOptions(total,
		progressbar.OptionSetWriter(os.Stderr),
		progressbar.OptionSetDescription("bench"),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString("req"),
		progressbar.OptionSetSpinnerChangeInterval(0),
		progressbar.OptionClearOnFinish(),
	)
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
