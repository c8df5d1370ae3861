package console

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Tier is one tier of the router's scheduling (design §7.5) and the
// counter its decisions are counted in, labelled by decision.
type Tier struct {
	Name   string `json:"name"`
	Metric string `json:"metric"`
}

// Tiers are the router's decision counters, tier 0 first. The names are
// the router's (design §9: the seeds' names, kept for dashboards).
var Tiers = []Tier{
	{Name: "tier 0: session affinity", Metric: "llmgw_router_session_decisions_total"},
	{Name: "tier 1: prefix (rendezvous)", Metric: "llmgw_prefix_decisions_total"},
	{Name: "tier 2: KV index", Metric: "llmgw_kv_decisions_total"},
	{Name: "tier 2: cache pressure", Metric: "llmgw_router_kv_pressure_decisions_total"},
}

// MaxRouterMetricsBytes bounds one router /metrics body: a router with
// thousands of replicas renders a few MiB.
const MaxRouterMetricsBytes = 16 << 20

// SamplerConfig configures a Sampler.
type SamplerConfig struct {
	// Routers are the routers' base URLs (http://host:port), as
	// --console-router names them.
	Routers []string
	// Interval spaces the reads of each router; Window is how much history
	// is kept (the page shows the last minute and the whole window).
	Interval, Window time.Duration
	// Client reads the routers (nil: a client with Interval as timeout).
	Client *http.Client
	// Now is the clock (nil: time.Now).
	Now func() time.Time
	// Quiet is how long a router never read yet may fail before a
	// warning is logged (0: 30 s). A router started with the control
	// plane (llmgw dev starts the control node first) is not up at the
	// first reads, and that is no news; one that was read and then fails
	// is warned of at once.
	Quiet time.Duration
}

// Sampler reads each router's decision counters every Interval and keeps
// Window of them, so the console can show decisions per tier over the last
// minutes. Routers report nothing to the control plane, and a console that
// needed a Prometheus to answer "what are my routers doing" would not be
// one; the counters are the routers' own, so the figures match what a
// Prometheus beside them shows.
type Sampler struct {
	cfg SamplerConfig
	log *slog.Logger

	mu   sync.Mutex
	hist map[string]*history
}

type history struct {
	samples []sample
	lastErr string
	lastTry time.Time
	// failingSince is the first failure of the current run of them;
	// warned is whether it was logged; read is whether the router ever
	// answered.
	failingSince time.Time
	warned, read bool
}

// sample is one read of a router: counts[tier index][decision].
type sample struct {
	at     time.Time
	counts []map[string]float64
}

// CheckRouterURL is the check of one --console-router value.
func CheckRouterURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q must be a router's base URL, http://host:port or https://host:port", s)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%q: a base URL has no query or fragment", s)
	}
	return nil
}

// NewSampler returns a sampler of cfg.Routers (checked by CheckRouterURL).
func NewSampler(cfg SamplerConfig, log *slog.Logger) *Sampler {
	if cfg.Interval <= 0 {
		cfg.Interval = 5 * time.Second
	}
	if cfg.Window < cfg.Interval {
		cfg.Window = 5 * time.Minute
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: cfg.Interval}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Quiet <= 0 {
		cfg.Quiet = 30 * time.Second
	}
	s := &Sampler{cfg: cfg, log: log, hist: map[string]*history{}}
	for _, r := range cfg.Routers {
		s.hist[r] = &history{}
	}
	return s
}

// Run reads every router at once and then each Interval until ctx is done.
func (s *Sampler) Run(ctx context.Context) {
	if len(s.cfg.Routers) == 0 {
		return
	}
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		s.ReadAll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ReadAll reads every router once, concurrently, and waits for them.
func (s *Sampler) ReadAll(ctx context.Context) {
	var wg sync.WaitGroup
	for _, r := range s.cfg.Routers {
		wg.Go(func() {
			counts, err := s.read(ctx, r)
			s.record(r, counts, err)
		})
	}
	wg.Wait()
}

func (s *Sampler) read(ctx context.Context, base string) ([]map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Interval)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.cfg.Client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/metrics: %s", base, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxRouterMetricsBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s/metrics: %w", base, err)
	}
	if len(body) > MaxRouterMetricsBytes {
		return nil, fmt.Errorf("%s/metrics is larger than %d bytes", base, MaxRouterMetricsBytes)
	}
	return ParseDecisions(body)
}

// ParseDecisions reads the decision counters of Tiers from a Prometheus
// text exposition: per tier, the value of each decision label. A tier the
// body lacks is empty (a router that made no decision of it yet).
func ParseDecisions(body []byte) ([]map[string]float64, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("parse router metrics: %w", err)
	}
	out := make([]map[string]float64, len(Tiers))
	for i, t := range Tiers {
		out[i] = map[string]float64{}
		f, ok := fams[t.Metric]
		if !ok {
			continue
		}
		for _, m := range f.GetMetric() {
			if m.GetCounter() == nil {
				return nil, fmt.Errorf("%s is not a counter", t.Metric)
			}
			decision := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "decision" {
					decision = l.GetValue()
				}
			}
			out[i][decision] += m.GetCounter().GetValue()
		}
	}
	return out, nil
}

func (s *Sampler) record(router string, counts []map[string]float64, err error) {
	now := s.cfg.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.hist[router]
	h.lastTry = now
	if err != nil {
		if h.lastErr == "" {
			h.failingSince = now
		}
		h.lastErr = err.Error()
		if !h.warned && (h.read || now.Sub(h.failingSince) >= s.cfg.Quiet) {
			s.log.Warn("console: cannot read a router's decisions", "router", router, "err", err,
				"failing_for", now.Sub(h.failingSince).Round(time.Second))
			h.warned = true
		}
		return
	}
	if h.warned {
		s.log.Info("console: router's decisions readable again", "router", router)
	}
	h.lastErr, h.warned, h.read = "", false, true
	h.samples = append(h.samples, sample{at: now, counts: counts})
	// Keep one sample at or before the window's start, so the window's
	// increase is measured over the whole window.
	edge := now.Add(-s.cfg.Window)
	keep := 0
	for keep+1 < len(h.samples) && !h.samples[keep+1].at.After(edge) {
		keep++
	}
	h.samples = slices.Delete(h.samples, 0, keep)
}

// RoutersView is the routers page's data.
type RoutersView struct {
	IntervalSeconds float64      `json:"interval_seconds"`
	WindowSeconds   float64      `json:"window_seconds"`
	Tiers           []Tier       `json:"tiers"`
	Routers         []RouterView `json:"routers"`
}

// RouterView is one router: its decisions per tier over the last minute
// and the window, or why it could not be read.
type RouterView struct {
	URL string `json:"url"`
	// Error is the last read's error; the figures are then the last good
	// ones.
	Error string `json:"error,omitempty"`
	// ReadUnixMs is when it was last read successfully (0: never).
	ReadUnixMs int64 `json:"read_unix_ms"`
	// SpanSeconds is how much history the figures cover: less than the
	// window while the console is young.
	SpanSeconds float64    `json:"span_seconds"`
	Tiers       []TierView `json:"tiers"`
}

// TierView is one tier's decisions, most frequent first in the window.
type TierView struct {
	Tier      string         `json:"tier"`
	Decisions []DecisionView `json:"decisions"`
	// PerInterval is the tier's decisions in each sampling interval of the
	// window, oldest first: the page's sparkline.
	PerInterval []float64 `json:"per_interval"`
}

// DecisionView is one decision's count: in the last minute, the window,
// and since the router started.
type DecisionView struct {
	Decision   string  `json:"decision"`
	LastMinute float64 `json:"last_minute"`
	Window     float64 `json:"window"`
	Total      float64 `json:"total"`
}

// View is what the sampler holds now.
func (s *Sampler) View() RoutersView {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := RoutersView{IntervalSeconds: s.cfg.Interval.Seconds(), WindowSeconds: s.cfg.Window.Seconds(), Tiers: Tiers, Routers: []RouterView{}}
	for _, r := range s.cfg.Routers {
		v.Routers = append(v.Routers, s.hist[r].view(r, s.cfg.Window))
	}
	return v
}

func (h *history) view(url string, window time.Duration) RouterView {
	rv := RouterView{URL: url, Error: h.lastErr, Tiers: []TierView{}}
	if len(h.samples) == 0 {
		if rv.Error == "" {
			rv.Error = "not read yet"
		}
		return rv
	}
	last := h.samples[len(h.samples)-1]
	rv.ReadUnixMs = last.at.UnixMilli()
	rv.SpanSeconds = last.at.Sub(h.samples[0].at).Seconds()
	minute, win := h.base(last.at.Add(-time.Minute)), h.base(last.at.Add(-window))
	for i, t := range Tiers {
		tv := TierView{Tier: t.Name, Decisions: []DecisionView{}}
		for d, total := range last.counts[i] {
			tv.Decisions = append(tv.Decisions, DecisionView{
				Decision: d, Total: total,
				LastMinute: increase(minute.counts[i][d], total),
				Window:     increase(win.counts[i][d], total),
			})
		}
		slices.SortFunc(tv.Decisions, func(a, b DecisionView) int {
			if a.Window != b.Window {
				if a.Window > b.Window {
					return -1
				}
				return 1
			}
			if a.Decision < b.Decision {
				return -1
			}
			return 1
		})
		for j := 1; j < len(h.samples); j++ {
			n := 0.0
			for d, v := range h.samples[j].counts[i] {
				n += increase(h.samples[j-1].counts[i][d], v)
			}
			tv.PerInterval = append(tv.PerInterval, n)
		}
		rv.Tiers = append(rv.Tiers, tv)
	}
	return rv
}

// base is the newest sample at or before t, or the oldest when the history
// is shorter.
func (h *history) base(t time.Time) sample {
	b := h.samples[0]
	for _, s := range h.samples {
		if s.at.After(t) {
			break
		}
		b = s
	}
	return b
}

// increase is a counter's growth from was to now; a counter that went down
// was reset (the router restarted) and counts from zero.
func increase(was, now float64) float64 {
	if now < was {
		return now
	}
	return now - was
}

// noRoutersHint is what the routers page says with no --console-router.
const noRoutersHint = "No router is named: routers report nothing to the control plane, so give this control node --console-router http://ROUTER:PORT (repeatable; console_router in its config file) to see their decisions here."
