package bench

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Target is one router to drive, with the label it goes by in the output.
type Target struct {
	Label string
	URL   string
	// Metrics is the router's operations port's base URL
	// (http://host:port, its --ops-addr), where its decision counters are
	// read; empty, the report has none (the API port serves no /metrics).
	Metrics string
}

// ParseTarget reads `URL` or `label=URL`. The URL is the router's base
// (http://host:port); the label defaults to the URL's host.
func ParseTarget(s string) (Target, error) {
	var t Target
	if i := strings.Index(s, "="); i >= 0 && !strings.Contains(s[:i], "://") {
		t.Label, s = s[:i], s[i+1:]
		if t.Label == "" {
			return Target{}, fmt.Errorf("--target %q: empty label before '='", s)
		}
	}
	u, err := url.Parse(s)
	if err != nil {
		return Target{}, fmt.Errorf("--target %q: %w", s, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return Target{}, fmt.Errorf("--target %q: want http://host:port or https://host:port", s)
	}
	t.URL = strings.TrimRight(s, "/")
	if t.Label == "" {
		t.Label = u.Host
	}
	return t, nil
}

// ParseMetricsURL reads a router's operations port's base URL
// (--target-metrics): http://host:port or https://host:port.
func ParseMetricsURL(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("--target-metrics %q: want a router's operations port, http://host:port", s)
	}
	return strings.TrimRight(s, "/"), nil
}

// Config is one benchmark: the workload, the load, when to stop, and the
// targets. DefaultConfig fills what a bare `llmgwctl bench` uses.
type Config struct {
	// Targets are benchmarked one after another with the same workload and
	// seed, each a column of the output; with RoundRobin they are one run
	// whose requests alternate over them, as behind a round-robin balancer.
	Targets    []Target
	RoundRobin bool

	Workload WorkloadConfig
	// API is the wire format of every request: APIChat (empty is chat),
	// APIMessages or APIResponses.
	API string

	// Rate > 0 is an open loop: Poisson arrivals at Rate per second, however
	// slow the answers. Otherwise a closed loop of Concurrency clients, each
	// sending its next request when its last is answered. A multi-turn
	// session's turns are sequential either way, so an open loop arrival
	// waits for an idle session.
	Rate        float64
	Concurrency int

	// The run stops sending at Duration or after Requests requests, whichever
	// comes first (zero is no limit; at least one must be set), and ends when
	// the requests in flight finish.
	Duration time.Duration
	Requests int

	// RequestTimeout bounds one request, stream included.
	RequestTimeout time.Duration

	// APIKey, when set, is sent as `Authorization: Bearer APIKey` on every
	// request: the routers of a cluster with API keys (design §11) answer
	// 401 without one.
	APIKey string

	// RootCAs, when set, are the only CAs an https target's certificate
	// may chain to (--ca-cert): a router serving HTTPS with a certificate
	// of the cluster's own CA, as a test bench does, rather than a web
	// certificate the system trusts. nil trusts the system's roots.
	RootCAs *x509.CertPool

	// Client makes the requests; nil uses a transport of the run's own,
	// closed when the run ends. The run's own transport speaks HTTP/1.1
	// over TLS as over plain text, so an http and an https run compare
	// one protocol, not HTTP/1.1 with HTTP/2.
	Client *http.Client
	Logger *slog.Logger
	// Progress is called after every request, from several goroutines at
	// once; it must be quick and safe for concurrent use. May be nil.
	Progress func(Sample)
	// Now is the clock latencies are measured with; nil is time.Now.
	Now func() time.Time
	// ArrivalSource draws the open loop's gaps; nil seeds one from
	// Workload.Seed so a run is repeatable.
	ArrivalSource rand.Source

	// Seeds, when set, repeat the whole comparison once per seed (each
	// replacing Workload.Seed), the targets' order rotated from one seed to
	// the next so none is always first; the result then carries a summary
	// over the seeds. Empty is Workload.Seed alone.
	Seeds []uint64

	// Engines lists the engines behind the targets, as base URLs
	// (http://host:port); it is asked before every run, since a fleet may
	// change between runs. nil is none known. They serve ResetCaches and
	// the ceiling's tokenization.
	Engines func(context.Context) ([]string, error)
	// ResetCaches empties every engine's prefix cache (vLLM's POST
	// /reset_prefix_cache) before every run, then waits ResetSettle for the
	// routers' indexes to hear of it, so no run inherits the warm cache of
	// the one before: without it the second of two identical targets wins.
	ResetCaches bool
	ResetSettle time.Duration
	// RequireReset makes an engine without POST /reset_prefix_cache an
	// error (llmgwctl: --reset-caches given explicitly). Without it such
	// an engine is warned of and the run goes on, marked
	// Report.CacheNotReset: vLLM serves the reset only in its development
	// mode, so a stock engine would otherwise fail every default bench.
	RequireReset bool
	// TokenizeURL is the engine whose POST /tokenize gives the ceiling's
	// tokens; empty is the first of Engines, else the first target (a vLLM
	// server serves /tokenize; a router does not).
	TokenizeURL string
	// BlockSize is the engines' KV block size in tokens; 0 reads it from
	// the tokenizing engine's vllm:cache_config_info, else 16 (vLLM's).
	BlockSize int
	// AllowWarm lets Run compare a run that started on warm caches with
	// others; by default that is an error wrapping ErrWarm.
	AllowWarm bool
}

// DefaultConfig is a closed loop of 8 clients for 100 requests.
func DefaultConfig() Config {
	return Config{
		Concurrency:    8,
		Requests:       100,
		RequestTimeout: 5 * time.Minute,
		ResetSettle:    time.Second,
		Workload:       WorkloadConfig{Name: SharedPrefix},
	}
}

// Validate reports the first field at fault, named as its flag.
func (c Config) Validate() error {
	if len(c.Targets) == 0 {
		return errors.New("--target: at least one is required")
	}
	for _, t := range c.Targets {
		if t.URL == "" {
			return fmt.Errorf("--target %q: empty URL", t.Label)
		}
	}
	if c.RoundRobin && len(c.Targets) < 2 {
		return errors.New("--targets-round-robin: needs at least two --target")
	}
	switch {
	case c.Rate < 0:
		return fmt.Errorf("--rate: must not be negative, got %g", c.Rate)
	case c.Concurrency < 0:
		return fmt.Errorf("--concurrency: must not be negative, got %d", c.Concurrency)
	case c.Workload.Name == Replay && (c.Rate > 0 || c.Concurrency > 0):
		return errors.New("--rate, --concurrency: a replay sends each request at its captured time (--replay-speed scales them)")
	case c.Rate > 0 && c.Concurrency > 0:
		return errors.New("--rate, --concurrency: choose one, open loop or closed")
	case c.Rate == 0 && c.Concurrency == 0 && c.Workload.Name != Replay:
		return errors.New("--concurrency: must be at least 1 (or set --rate)")
	case c.Duration < 0:
		return fmt.Errorf("--duration: must not be negative, got %s", c.Duration)
	case c.Requests < 0:
		return fmt.Errorf("--requests: must not be negative, got %d", c.Requests)
	case c.Duration == 0 && c.Requests == 0:
		return errors.New("--duration, --requests: set at least one, or the run never ends")
	case c.RequestTimeout <= 0:
		return fmt.Errorf("--request-timeout: must be positive, got %s", c.RequestTimeout)
	case c.ResetSettle < 0:
		return fmt.Errorf("--reset-settle: must not be negative, got %s", c.ResetSettle)
	case c.BlockSize < 0:
		return fmt.Errorf("--block-size: must not be negative, got %d", c.BlockSize)
	}
	if c.API != "" && !slices.Contains(apiNames, c.API) {
		return fmt.Errorf("--api: %q is not one of %s", c.API, strings.Join(apiNames, ", "))
	}
	for i, s := range c.Seeds {
		if slices.Contains(c.Seeds[:i], s) {
			return fmt.Errorf("--seeds: seed %d appears twice", s)
		}
	}
	return c.Workload.Validate()
}

// Result holds one report per run, in the order they ran; with several
// seeds, the summary over them.
type Result struct {
	Runs    []Report     `json:"runs"`
	Summary *SeedSummary `json:"summary,omitempty"`
}

// Run benchmarks every target in turn (or all together with RoundRobin) and
// returns a report per run. It returns only after every request it started
// has finished. Cancelling ctx stops the run; requests in flight are
// cancelled, counted as "canceled", and the partial reports are returned
// with ctx's error.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Client == nil {
		tr := &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			MaxIdleConnsPerHost: 1024,
			IdleConnTimeout:     30 * time.Second,
			// A TLSClientConfig of its own: net/http then never upgrades
			// to HTTP/2 (ForceAttemptHTTP2 is false).
			TLSClientConfig: &tls.Config{RootCAs: cfg.RootCAs, MinVersion: tls.VersionTLS12},
		}
		defer tr.CloseIdleConnections()
		cfg.Client = &http.Client{Transport: tr}
	}
	groups := [][]Target{cfg.Targets}
	if !cfg.RoundRobin {
		groups = groups[:0]
		for _, t := range cfg.Targets {
			groups = append(groups, []Target{t})
		}
	}
	seeds := cfg.Seeds
	if len(seeds) == 0 {
		seeds = []uint64{cfg.Workload.Seed}
	}
	var res Result
	for si, seed := range seeds {
		c := cfg
		c.Workload.Seed = seed
		if len(cfg.Seeds) > 0 {
			c.ArrivalSource = nil // each seed its own arrivals
		}
		for gi := range groups {
			// Rotated per seed: over the seeds every target runs first as
			// often, so a drift in the machine's load favours none.
			targets := groups[(gi+si)%len(groups)]
			rep, err := runOne(ctx, c, targets)
			res.Runs = append(res.Runs, rep)
			if err != nil {
				return res, err
			}
		}
	}
	if len(cfg.Seeds) > 1 {
		res.Summary = SummarizeSeeds(res.Runs)
	}
	if err := warmError(res.Runs); err != nil && !cfg.AllowWarm {
		return res, err
	}
	return res, nil
}

// runOne prepares the engines, drives one run, and measures it.
func runOne(ctx context.Context, cfg Config, targets []Target) (Report, error) {
	var labels []string
	urls := make([]string, len(targets))
	for i, t := range targets {
		// Targets labelled alike (two routers of one configuration) are
		// one label, not "a+a".
		if !slices.Contains(labels, t.Label) {
			labels = append(labels, t.Label)
		}
		urls[i] = t.URL
	}
	label := strings.Join(labels, "+")
	// A fresh workload per run: every target sees the same prompts, under
	// session ids of the run's own. With the seed's ids alone, a second run
	// would find the routers' session table holding the first run's
	// affinities, pointing at replicas whose caches were reset since, and
	// the two runs would differ by their order rather than their targets.
	if cfg.Workload.SessionTag == "" {
		cfg.Workload.SessionTag = strconv.FormatInt(cfg.Now().UnixNano(), 36)
	}
	wl, err := NewWorkload(cfg.Workload)
	if err != nil {
		return Report{Label: label}, err
	}
	var engines []string
	if cfg.Engines != nil {
		if engines, err = cfg.Engines(ctx); err != nil && cfg.ResetCaches {
			return Report{Label: label, Seed: cfg.Workload.Seed}, fmt.Errorf("--reset-caches: listing the engines: %w", err)
		} else if err != nil {
			cfg.Logger.Warn("no engines listed: no ceiling from them", "err", err)
		}
	}
	reset := false
	var notReset []string
	if cfg.ResetCaches {
		noReset, err := resetCaches(ctx, cfg.Client, engines, cfg.ResetSettle)
		if err != nil {
			return Report{Label: label, Seed: cfg.Workload.Seed}, fmt.Errorf("--reset-caches: %w", err)
		}
		switch {
		case len(noReset) > 0 && cfg.RequireReset:
			return Report{Label: label, Seed: cfg.Workload.Seed}, fmt.Errorf("--reset-caches: %s: no POST /reset_prefix_cache (%s); start the engines with it, or --reset-caches=false to run on whatever the caches hold",
				strings.Join(noReset, ", "), noResetHint)
		case len(noReset) > 0:
			cfg.Logger.Warn("engine has no POST /reset_prefix_cache ("+noResetHint+"): running without emptying its cache; the run is marked \"cache not reset\"",
				"target", label, "seed", cfg.Workload.Seed, "engines", strings.Join(noReset, ","))
			notReset = noReset
		default:
			reset = true
		}
	}
	if rp, ok := wl.(*replay); ok {
		alignReplay(ctx, cfg, rp, tokenizers(ctx, cfg, engines, targets))
	}
	src := cfg.ArrivalSource
	if src == nil {
		src = rand.NewPCG(cfg.Workload.Seed, 0xa77)
	}
	r := &runner{cfg: cfg, wl: wl, targets: targets, arrivals: NewArrivals(src, max(cfg.Rate, 1e-9))}
	before, scrapeErr := scrapeAllBounded(ctx, cfg.Client, targets)
	samples := r.run(ctx)
	rep := Summarize(label, strings.Join(urls, ","), wl.Name(), samples)
	rep.Seed, rep.CachesReset, rep.CacheNotReset, rep.Settings = cfg.Workload.Seed, reset, notReset, cfg.settings()
	if scrapeErr == nil && ctx.Err() == nil {
		var after Decisions
		if after, scrapeErr = scrapeAllBounded(ctx, cfg.Client, targets); scrapeErr == nil {
			rep.Decisions = after.since(before)
		}
	}
	if scrapeErr != nil {
		cfg.Logger.Debug("no router decisions for this run", "target", rep.Label, "err", scrapeErr)
	}
	if ctx.Err() == nil {
		if err := ceilingFrom(ctx, cfg, tokenizers(ctx, cfg, engines, targets), samples, &rep); err != nil {
			cfg.Logger.Warn("no cache_hit_ceiling for this run (give --tokenize-url an engine's URL)", "target", rep.Label, "err", err)
		}
	}
	cfg.Logger.Info("bench run finished", "target", rep.Label, "seed", rep.Seed, "requests", rep.Requests, "errors", rep.Errors)
	if err := ctx.Err(); err != nil {
		return rep, fmt.Errorf("bench %s: %w", rep.Label, err)
	}
	return rep, nil
}

// tokenizers are the engines to ask for the ceiling's tokens, in turn
// until one answers: --tokenize-url alone when given; else the engines as
// listed now (the run may have restarted one, as the disrupted bench
// does), those listed before it, and last the first target, which is an
// engine when the bench drives vLLM directly.
func tokenizers(ctx context.Context, cfg Config, before []string, targets []Target) []string {
	if cfg.TokenizeURL != "" {
		return []string{cfg.TokenizeURL}
	}
	var out []string
	if cfg.Engines != nil {
		if now, err := cfg.Engines(ctx); err == nil {
			out = append(out, now...)
		}
	}
	for _, e := range append(before, targets[0].URL) {
		if !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	return out
}

// alignReplay measures the engines' chat template for a replay's prompts
// (measureTemplate) through the first of a few tokenizers that answers.
// None answering is a warning: the replay goes on, its prompts each a
// template's worth of tokens longer than captured and their blocks
// shifted.
func alignReplay(ctx context.Context, cfg Config, rp *replay, urls []string) {
	err := firstAnswering(urls, func(u string) error {
		mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		t, err := measureTemplate(mctx, HTTPTokenizer{URL: u, Client: cfg.Client, APIKey: cfg.APIKey}, rp.cfg.Model)
		if err == nil {
			rp.tmpl = t
			cfg.Logger.Debug("replay: prompts aligned to the engine's chat template", "head_tokens", t.head, "tail_tokens", t.tail)
		}
		return err
	})
	if err != nil {
		cfg.Logger.Warn("replay: the engines' chat template not measured (give --tokenize-url an engine's URL): prompts are sent a template longer than captured, their blocks shifted",
			"err", err)
	}
}

// ceilingFrom is addCeiling through the first engine that answers, of at
// most a few: an engine that fails mid-way is as good as down.
func ceilingFrom(ctx context.Context, cfg Config, urls []string, samples []Sample, rep *Report) error {
	return firstAnswering(urls, func(u string) error { return addCeiling(ctx, cfg, u, samples, rep) })
}

// firstAnswering calls try with each of the first few engine URLs until one
// succeeds, and returns every error when none does: an engine that fails
// is as good as down, and more than three tries only delay the report.
func firstAnswering(urls []string, try func(url string) error) error {
	var errs []error
	for _, u := range urls[:min(len(urls), 3)] {
		err := try(u)
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// settings describes the run's workload and load in the words of its
// flags, for the chart's caption and the JSON.
func (c Config) settings() string {
	w := c.Workload.withDefaults()
	parts := []string{"--workload " + w.Name}
	add := func(flag string, v any, show bool) {
		switch {
		case !show:
		case v == "": // a switch
			parts = append(parts, "--"+flag)
		default:
			parts = append(parts, fmt.Sprintf("--%s %v", flag, v))
		}
	}
	prefix := w.Name == SharedPrefix || w.Name == LoRAMix
	add("groups", w.Groups, prefix || w.Name == LongContext)
	add("hot-share", w.HotShare, w.HotShare > 0)
	add("active-groups", w.ActiveGroups, w.ActiveGroups > 0)
	add("rotate-every", w.RotateEvery, w.ActiveGroups > 0)
	add("system-words", w.SystemWords, w.SystemWords > 0)
	add("prompt-words", w.PromptWords, true)
	add("sessions", w.Sessions, w.Name == MultiTurn || w.Name == AgentSession)
	add("turns", w.Turns, w.Name == MultiTurn || w.Name == AgentSession)
	add("max-tokens", w.MaxTokens, true)
	add("api", c.API, c.API != "" && c.API != APIChat)
	add("rate", c.Rate, c.Rate > 0)
	add("concurrency", c.Concurrency, c.Rate == 0)
	add("requests", c.Requests, c.Requests > 0)
	add("duration", c.Duration, c.Duration > 0)
	add("targets-round-robin", "", c.RoundRobin)
	return strings.Join(parts, " ")
}

// scrapeAllBounded is scrapeAll within a few seconds: the counters are a
// report's extra, never a reason for the run to hang.
func scrapeAllBounded(ctx context.Context, client *http.Client, targets []Target) (Decisions, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return scrapeAll(ctx, client, targets)
}

// scheduled is a workload that says when each of its requests is sent
// (Replay); the runner then follows it instead of Rate or Concurrency.
type scheduled interface {
	Len() int
	At(n int) time.Duration
}

// runner is one run: it hands out turns of the workload's conversations to
// the load generator and collects samples.
type runner struct {
	cfg      Config
	wl       Workload
	targets  []Target
	arrivals *Arrivals

	start  time.Time
	issued atomic.Int64  // requests claimed against cfg.Requests
	rr     atomic.Uint64 // requests sent: picks the round-robin target and numbers X-Request-ID

	mu      sync.Mutex
	next    int               // next conversation number
	ready   chan Conversation // idle live conversations, when wl.Live() > 0
	samples []Sample
}

// run drives load until the budget or the duration is spent, then waits for
// the requests in flight. Shutdown order: stop dispatching (the duration's
// context), then wait for every request goroutine.
func (r *runner) run(ctx context.Context) []Sample {
	r.start = r.cfg.Now()
	if n := r.wl.Live(); n > 0 {
		r.ready = make(chan Conversation, n)
		for range n {
			r.ready <- r.fresh()
		}
	}
	dispatch := ctx
	if r.cfg.Duration > 0 {
		var cancel context.CancelFunc
		dispatch, cancel = context.WithTimeout(ctx, r.cfg.Duration)
		defer cancel()
	}
	var wg sync.WaitGroup
	if sch, ok := r.wl.(scheduled); ok {
		// A replay: each request at its captured time, however slow the
		// answers, as an open loop.
		for n := range sch.Len() {
			if !sleepUntil(dispatch, r.start.Add(sch.At(n))) {
				break
			}
			conv, req, ok := r.take(dispatch)
			if !ok {
				break
			}
			wg.Go(func() { r.do(ctx, conv, req) })
		}
	} else if r.cfg.Rate > 0 {
		// Arrivals keep their schedule even when answers are slow: that is
		// what makes it an open loop. Only a multi-turn run with every
		// session busy holds an arrival back.
		next := time.Now()
		for {
			conv, req, ok := r.take(dispatch)
			if !ok {
				break
			}
			wg.Go(func() { r.do(ctx, conv, req) })
			next = next.Add(r.arrivals.Next())
			if !sleepUntil(dispatch, next) {
				break
			}
		}
	} else {
		for range r.cfg.Concurrency {
			wg.Go(func() {
				for {
					conv, req, ok := r.take(dispatch)
					if !ok {
						return
					}
					r.do(ctx, conv, req)
				}
			})
		}
	}
	wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.samples
}

// fresh starts the next conversation.
func (r *runner) fresh() Conversation {
	r.mu.Lock()
	n := r.next
	r.next++
	r.mu.Unlock()
	return r.wl.Conversation(n)
}

// take returns the next request to send and its conversation, or false when
// the run should send no more.
func (r *runner) take(ctx context.Context) (Conversation, Request, bool) {
	for range 1000 { // a conversation with no turns at all is a workload bug; don't spin on it
		if ctx.Err() != nil {
			return nil, Request{}, false
		}
		var conv Conversation
		if r.ready == nil {
			conv = r.fresh()
		} else {
			select {
			case conv = <-r.ready:
			case <-ctx.Done():
				return nil, Request{}, false
			}
		}
		req, ok := conv.Next()
		if !ok {
			if r.ready != nil {
				r.ready <- r.fresh()
			}
			continue
		}
		if r.cfg.Requests > 0 && r.issued.Add(1) > int64(r.cfg.Requests) {
			// Hand the session back so a client still waiting for one
			// wakes, finds the budget spent too, and stops.
			if r.ready != nil {
				r.ready <- conv
			}
			return nil, Request{}, false
		}
		return conv, req, true
	}
	return nil, Request{}, false
}

// do sends one request, records it, and gives the conversation back.
func (r *runner) do(ctx context.Context, conv Conversation, req Request) {
	n := r.rr.Add(1) - 1
	t := r.targets[int(n%uint64(len(r.targets)))]
	id := fmt.Sprintf("bench-%d-%d-%d", r.cfg.Workload.Seed, r.start.Unix(), n)
	rctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	s, answer := send(rctx, r.cfg.Client, t.URL, t.Label, id, r.cfg.APIKey, r.cfg.API, req, r.start, r.cfg.Now)
	cancel()
	if !s.OK() {
		r.cfg.Logger.Debug("request failed", "request_id", id, "replica", s.Replica, "model", s.Model, "kind", s.ErrKind, "err", s.Err)
	}
	s.messages, s.answer = req.Messages, answer
	conv.Reply(answer, s.OK())
	if r.ready != nil {
		r.ready <- conv
	}
	r.mu.Lock()
	r.samples = append(r.samples, s)
	r.mu.Unlock()
	if r.cfg.Progress != nil {
		r.cfg.Progress(s)
	}
}

// sleepUntil waits until t and reports whether ctx is still live.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}
