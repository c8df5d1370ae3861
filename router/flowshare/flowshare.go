package flowshare

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// The loop's defaults.
const (
	// DefaultInterval is how often the router reports: a twelfth of how
	// long the leader counts a report, so a few lost ones cost nothing.
	DefaultInterval = 250 * time.Millisecond
	// DefaultTimeout bounds each report: a slow control plane must not
	// stall the loop beyond a few intervals.
	DefaultTimeout = time.Second
	// DefaultValid is how long a view holds when the answer does not say
	// (the leader's default).
	DefaultValid = 3 * time.Second
)

// Reporter sends one report to the control plane (FlowService.Report on
// any server; followers forward it to the leader).
type Reporter interface {
	ReportFlow(ctx context.Context, r *llmgwv1.FlowReport) (*llmgwv1.FlowView, error)
}

// Queues is the router's flow control as the loop sees it.
type Queues interface {
	Depths() []*llmgwv1.FlowDepth                          // this router's non-empty queues now
	SetFleet(depths []*llmgwv1.FlowDepth, until time.Time) // the other routers' queues, valid until
}

// Demand is the router's demand per autoscaled model (router/demand,
// design §5.7): what the leader's autoscaler decides on, carried by the
// same report.
type Demand interface {
	// Demand returns one demand per autoscaled model, at most
	// MaxDemands; depths are this router's queues now, which count as
	// held.
	Demand(depths []*llmgwv1.FlowDepth) []*llmgwv1.ModelDemand
}

// MaxDemands bounds a report's demands, as the leader bounds them.
const MaxDemands = 4096

// Config is the loop's identity and timing; zero durations take the
// defaults.
type Config struct {
	// Router is the router's --id, the name the leader keys it by.
	Router string
	// Session is this run's; 0 picks a random one at New.
	Session uint64
	// Interval is how often to report (DefaultInterval).
	Interval time.Duration
	// Timeout bounds each report (DefaultTimeout).
	Timeout time.Duration
	// Now is the clock of the views' validity (time.Now).
	Now func() time.Time
	// Flow says this router's flow control is on: it reports every
	// interval even with nothing to say, since the leader's view of its
	// queues and its own of the fleet's depend on it. Off, it reports only
	// while there is demand of an autoscaled model to carry.
	Flow bool
}

// Share is the loop. Create it with New, run it with Run.
type Share struct {
	cfg      Config
	queues   Queues
	demand   Demand // nil: none
	reporter Reporter
	log      *slog.Logger
	m        metrics
}

type metrics struct {
	failed  prometheus.Counter
	seconds prometheus.Histogram
}

// New returns the loop reporting q's queues and d's demand (nil: none)
// through r; its metrics are registered with reg (nil: not registered).
func New(cfg Config, q Queues, d Demand, r Reporter, reg prometheus.Registerer, log *slog.Logger) *Share {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Session == 0 {
		cfg.Session = newSession()
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := metrics{
		failed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgw_router_flow_reports_failed_total",
			Help: "Flow-control reports to the control plane that failed or timed out; the fleet's queues this router holds expire on their own.",
		}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "llmgw_router_flow_report_seconds",
			Help:    "Time a flow-control report took to be answered, failed ones included.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 12),
		}),
	}
	if reg != nil {
		reg.MustRegister(m.failed, m.seconds)
	}
	return &Share{cfg: cfg, queues: q, demand: d, reporter: r, log: log, m: m}
}

// Session is this run's session, as the reports carry it.
func (s *Share) Session() uint64 { return s.cfg.Session }

// idleEvery is how many ticks apart an idle router reports: nothing
// queued or held here, nothing queued elsewhere at the last answer. Its
// report only keeps it known, its view fresh (a view lives 3 s) and its
// demand current, so once a second is enough, and four calls a second
// cost an idle router more CPU than anything else it does (issue 29's
// bench: 24 vs 7 ms/s at rest).
const idleEvery = 4

// Run reports at once, then every Interval — every idleEvery-th while
// nothing is queued or held here or was queued elsewhere — until ctx
// ends; a report in flight is cut short then. With flow control off, a
// tick with no autoscaled model sends nothing. It returns nil.
func (s *Share) Run(ctx context.Context) error {
	tick := time.NewTicker(s.cfg.Interval)
	defer tick.Stop()
	quiet, skipped := false, 0
	for ctx.Err() == nil {
		depths := s.queues.Depths()
		var demand []*llmgwv1.ModelDemand
		if s.demand != nil {
			demand = s.demand.Demand(depths)
			if len(demand) > MaxDemands {
				demand = demand[:MaxDemands]
			}
		}
		busy := len(depths) > 0 || held(demand)
		switch {
		case !s.cfg.Flow && len(demand) == 0:
			quiet, skipped = false, 0 // nothing to say; the next demand goes at once
		case busy || !quiet || skipped >= idleEvery-1:
			quiet = s.report(ctx, depths, demand) && !busy
			skipped = 0
		default:
			skipped++
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
	return nil
}

// held reports whether any demand has requests held: a router holding
// requests reports every tick, so the leader hears of them at once.
func held(demand []*llmgwv1.ModelDemand) bool {
	for _, d := range demand {
		if d.GetHeld() > 0 {
			return true
		}
	}
	return false
}

// report sends this router's queues and demand and hands the answer to
// the flow control, valid from when the report was sent for the answer's
// valid_ms. It reports whether the answer said nothing waits elsewhere
// (or, flow control off, that it need not be heard again before the idle
// cadence).
func (s *Share) report(ctx context.Context, depths []*llmgwv1.FlowDepth, demand []*llmgwv1.ModelDemand) bool {
	req := &llmgwv1.FlowReport{Router: s.cfg.Router, Session: s.cfg.Session, Depths: depths, Demand: demand}
	sent := s.cfg.Now()
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	view, err := s.reporter.ReportFlow(cctx, req)
	cancel()
	s.m.seconds.Observe(time.Since(start).Seconds())
	if err != nil {
		if ctx.Err() != nil {
			return false // stopping: not a failure
		}
		s.m.failed.Inc()
		s.log.Debug("flow report failed; the fleet's queues held expire on their own", "err", err)
		return false
	}
	valid := time.Duration(view.GetValidMs()) * time.Millisecond
	if valid <= 0 {
		valid = DefaultValid
	}
	s.queues.SetFleet(view.GetDepths(), sent.Add(valid))
	return !s.cfg.Flow || len(view.GetDepths()) == 0
}

// newSession is a random non-zero session: a restarted router's reports
// are told from its last run's.
func newSession() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:]) | 1
}
