package flowview

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// The table's defaults and bounds (package doc).
const (
	// DefaultValid is how long a report counts: twelve of the routers'
	// 250 ms intervals, so a few lost reports cost nothing.
	DefaultValid = 3 * time.Second
	// MaxDepths bounds a report's queues: a model has a handful of classes.
	MaxDepths = 4096
	// MaxNameLen bounds a router's, a model's and a class's name in bytes.
	MaxNameLen = 256
	// MaxRouters bounds the routers held, as the leased shares bound their
	// sessions (design §7.7).
	MaxRouters = 1024
	// MaxTTFTBuckets bounds a demand's TTFT histogram.
	MaxTTFTBuckets = 64
)

var (
	// ErrInvalid is a report outside the bounds; the error wrapping it
	// names the field.
	ErrInvalid = errors.New("invalid flow report")
	// ErrFull is a report from a router beyond MaxRouters; nothing of it
	// is kept.
	ErrFull = errors.New("the leader holds the flow reports of as many routers as it may")
)

// Config is a Table's timing and bounds; zero values take the defaults.
type Config struct {
	// Valid is how long a report counts from when it was received
	// (DefaultValid).
	Valid time.Duration
	// MaxRouters bounds the routers held (MaxRouters).
	MaxRouters int
	// Now is the clock (time.Now).
	Now func() time.Time
}

// Table is the leader's table of the routers' last reports. It is safe for
// concurrent use; the zero value is not usable, create it with New.
type Table struct {
	valid      time.Duration
	maxRouters int
	now        func() time.Time
	reports    *prometheus.CounterVec

	mu sync.Mutex
	// routers is each router's last report, by name.
	routers map[string]*entry
}

// entry is one router's last report, normalized.
type entry struct {
	received time.Time
	// depths are sorted (sortDepths), each (model, class) once, none
	// empty; routers is 0 in each.
	depths []*llmgwv1.FlowDepth
	// demand is the router's view of each autoscaled model (design §5.7).
	demand []*llmgwv1.ModelDemand
}

// New returns an empty table whose metrics are registered with reg (nil:
// not registered).
func New(cfg Config, reg prometheus.Registerer) *Table {
	if cfg.Valid <= 0 {
		cfg.Valid = DefaultValid
	}
	if cfg.MaxRouters <= 0 {
		cfg.MaxRouters = MaxRouters
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	t := &Table{valid: cfg.Valid, maxRouters: cfg.MaxRouters, now: cfg.Now, routers: map[string]*entry{},
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_control_flow_reports_total",
			Help: "Routers' flow-control reports this node received as leader, by result: accepted, invalid (outside the bounds), full (one router more than it may hold).",
		}, []string{"result"}),
	}
	// Every result is a series from the start, so a rate over it is never
	// absent.
	for _, r := range []string{"accepted", "invalid", "full"} {
		t.reports.WithLabelValues(r)
	}
	routers := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "llmgw_control_flow_routers",
		Help: "Routers whose flow-control report this node holds as leader and still counts (each counts for 3 s).",
	}, func() float64 { return float64(t.Live()) })
	if reg != nil {
		reg.MustRegister(t.reports, routers)
	}
	return t
}

// Valid is how long a report counts: what a FlowView's valid_ms says.
func (t *Table) Valid() time.Duration { return t.valid }

// Report replaces router r.Router's report with r and answers what every
// other router's live reports say (View). A report outside the bounds is
// refused with ErrInvalid, one from a router beyond MaxRouters with
// ErrFull; either changes nothing.
func (t *Table) Report(r *llmgwv1.FlowReport) (*llmgwv1.FlowView, error) {
	if err := Check(r); err != nil {
		t.reports.WithLabelValues("invalid").Inc()
		return nil, err
	}
	depths := normalize(r.GetDepths())
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	t.expire(now)
	if _, held := t.routers[r.GetRouter()]; !held && len(t.routers) >= t.maxRouters {
		t.reports.WithLabelValues("full").Inc()
		return nil, fmt.Errorf("flow report of router %s: %w (%d)", r.GetRouter(), ErrFull, t.maxRouters)
	}
	demand := make([]*llmgwv1.ModelDemand, len(r.GetDemand()))
	for i, d := range r.GetDemand() {
		demand[i] = proto.Clone(d).(*llmgwv1.ModelDemand)
	}
	t.routers[r.GetRouter()] = &entry{received: now, depths: depths, demand: demand}
	t.reports.WithLabelValues("accepted").Inc()
	return t.view(r.GetRouter()), nil
}

// View is every live report but router's, summed per model and class:
// queued and queued_bytes added, the longest oldest_wait_ms, the highest
// rank (the least number) where reports differ, and routers the number of
// routers that reported the queue. Sorted by model, rank, class.
func (t *Table) View(router string) *llmgwv1.FlowView {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expire(t.now())
	return t.view(router)
}

// Status is every live report, by router name, and their sum (as View
// sums, over every router).
func (t *Table) Status() *llmgwv1.FlowStatusResponse {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expire(t.now())
	out := &llmgwv1.FlowStatusResponse{Routers: make([]*llmgwv1.FlowRouterDepths, 0, len(t.routers))}
	for name, e := range t.routers {
		rd := &llmgwv1.FlowRouterDepths{Router: name, ReportedUnixMs: e.received.UnixMilli(), Depths: make([]*llmgwv1.FlowDepth, len(e.depths))}
		for i, d := range e.depths {
			rd.Depths[i] = cloneDepth(d)
		}
		out.Routers = append(out.Routers, rd)
	}
	slices.SortFunc(out.Routers, func(a, b *llmgwv1.FlowRouterDepths) int { return cmp.Compare(a.Router, b.Router) })
	out.Total = t.sum("")
	return out
}

// Demand is every live report's demand summed per model (design §5.7):
// the requests held, the requests sent and the TTFT counts added (each is
// the router's own); the engines' readings and the replica count the
// largest any router gave (every router reads the same engines, one whose
// registry lags sees fewer).
func (t *Table) Demand() map[string]*llmgwv1.ModelDemand {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expire(t.now())
	out := map[string]*llmgwv1.ModelDemand{}
	for _, e := range t.routers {
		for _, d := range e.demand {
			s := out[d.GetModel()]
			if s == nil {
				s = &llmgwv1.ModelDemand{Model: d.GetModel()}
				out[d.GetModel()] = s
			}
			s.Held = addSat(s.Held, d.GetHeld())
			s.Requests = addSat(s.Requests, d.GetRequests())
			s.Waiting = max(s.Waiting, d.GetWaiting())
			s.Running = max(s.Running, d.GetRunning())
			s.KvUsageSum = max(s.KvUsageSum, d.GetKvUsageSum())
			s.Replicas = max(s.Replicas, d.GetReplicas())
			for len(s.TtftBuckets) < len(d.GetTtftBuckets()) {
				s.TtftBuckets = append(s.TtftBuckets, 0)
			}
			for i, n := range d.GetTtftBuckets() {
				s.TtftBuckets[i] = addSat(s.TtftBuckets[i], n)
			}
		}
	}
	return out
}

// Live is how many routers' reports count now.
func (t *Table) Live() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expire(t.now())
	return len(t.routers)
}

// Reset forgets every report: the node calls it when its term as leader
// starts and ends, so a leader never answers from reports an earlier term
// received (routers report again within one interval).
func (t *Table) Reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	clear(t.routers)
}

// expire removes the reports received Valid or more before now.
func (t *Table) expire(now time.Time) {
	for name, e := range t.routers {
		if now.Sub(e.received) >= t.valid {
			delete(t.routers, name)
		}
	}
}

// view is View under t.mu.
func (t *Table) view(router string) *llmgwv1.FlowView {
	return &llmgwv1.FlowView{Depths: t.sum(router), ValidMs: t.valid.Milliseconds()}
}

// sum adds up the reports of every router but except ("" excepts none:
// a router has a name); t.mu is held.
func (t *Table) sum(except string) []*llmgwv1.FlowDepth {
	type key struct{ model, class string }
	byKey := map[key]*llmgwv1.FlowDepth{}
	for name, e := range t.routers {
		if name == except {
			continue
		}
		for _, d := range e.depths {
			k := key{d.GetModel(), d.GetClass()}
			s := byKey[k]
			if s == nil {
				s = &llmgwv1.FlowDepth{Model: d.GetModel(), Class: d.GetClass(), Rank: d.GetRank()}
				byKey[k] = s
			}
			add(s, d)
			s.Routers++ // each (model, class) once per report (normalize)
		}
	}
	out := make([]*llmgwv1.FlowDepth, 0, len(byKey))
	for _, s := range byKey {
		out = append(out, s)
	}
	sortDepths(out)
	return out
}

// Check refuses a report outside the bounds, naming the field; the error
// wraps ErrInvalid.
func Check(r *llmgwv1.FlowReport) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
	}
	switch {
	case r.GetRouter() == "" || len(r.GetRouter()) > MaxNameLen:
		return bad("router: 1 to %d bytes, got %d", MaxNameLen, len(r.GetRouter()))
	case r.GetSession() == 0:
		return bad("session: required")
	case len(r.GetDepths()) > MaxDepths:
		return bad("depths: at most %d, got %d", MaxDepths, len(r.GetDepths()))
	case len(r.GetDemand()) > MaxDepths:
		return bad("demand: at most %d, got %d", MaxDepths, len(r.GetDemand()))
	}
	for i, d := range r.GetDemand() {
		finite := func(x float64) bool { return x >= 0 && !math.IsInf(x, 0) } // NaN fails >= 0
		switch {
		case d == nil:
			return bad("demand[%d]: required", i)
		case d.GetModel() == "" || len(d.GetModel()) > MaxNameLen:
			return bad("demand[%d].model: 1 to %d bytes, got %d", i, MaxNameLen, len(d.GetModel()))
		case len(d.GetTtftBuckets()) > MaxTTFTBuckets:
			return bad("demand[%d].ttft_buckets: at most %d, got %d", i, MaxTTFTBuckets, len(d.GetTtftBuckets()))
		case !finite(d.GetWaiting()) || !finite(d.GetRunning()) || !finite(d.GetKvUsageSum()):
			return bad("demand[%d]: waiting, running and kv_usage_sum must be finite and not negative", i)
		}
	}
	for i, d := range r.GetDepths() {
		switch {
		case d == nil:
			return bad("depths[%d]: required", i)
		case len(d.GetModel()) > MaxNameLen:
			return bad("depths[%d].model: at most %d bytes, got %d", i, MaxNameLen, len(d.GetModel()))
		case len(d.GetClass()) > MaxNameLen:
			return bad("depths[%d].class: at most %d bytes, got %d", i, MaxNameLen, len(d.GetClass()))
		}
	}
	return nil
}

// normalize is a report's queues as the table keeps them: copies, the
// empty ones dropped, each (model, class) once (merged as sum merges
// routers' queues), sorted, routers 0.
func normalize(in []*llmgwv1.FlowDepth) []*llmgwv1.FlowDepth {
	type key struct{ model, class string }
	byKey := make(map[key]*llmgwv1.FlowDepth, len(in))
	out := make([]*llmgwv1.FlowDepth, 0, len(in))
	for _, d := range in {
		if d.GetQueued() == 0 {
			continue
		}
		k := key{d.GetModel(), d.GetClass()}
		if s := byKey[k]; s != nil {
			add(s, d)
			continue
		}
		s := &llmgwv1.FlowDepth{Model: d.GetModel(), Class: d.GetClass(), Rank: d.GetRank()}
		add(s, d)
		byKey[k] = s
		out = append(out, s)
	}
	sortDepths(out)
	return out
}

// add adds queue d into the sum s: queued and bytes saturating, the
// longest wait (a negative one read as 0), the highest rank.
func add(s, d *llmgwv1.FlowDepth) {
	s.Queued = addSat(s.Queued, d.GetQueued())
	s.QueuedBytes = addSat(s.QueuedBytes, d.GetQueuedBytes())
	s.OldestWaitMs = max(s.OldestWaitMs, d.GetOldestWaitMs(), 0)
	s.Rank = min(s.Rank, d.GetRank())
}

func addSat(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}

// sortDepths orders queues by model, then rank (the highest class first),
// then class name.
func sortDepths(ds []*llmgwv1.FlowDepth) {
	slices.SortFunc(ds, func(a, b *llmgwv1.FlowDepth) int {
		return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.Rank, b.Rank), cmp.Compare(a.Class, b.Class))
	})
}

func cloneDepth(d *llmgwv1.FlowDepth) *llmgwv1.FlowDepth {
	return &llmgwv1.FlowDepth{Model: d.Model, Class: d.Class, Rank: d.Rank, Queued: d.Queued, QueuedBytes: d.QueuedBytes,
		OldestWaitMs: d.OldestWaitMs, Routers: d.Routers}
}
