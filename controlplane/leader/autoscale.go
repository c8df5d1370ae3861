package leader

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/controlplane/autoscale"
	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// DemandSource is the routers' demand per model, summed (package flowview's
// Table): what the autoscaler decides on (design §5.7).
type DemandSource interface {
	Demand() map[string]*llmgwv1.ModelDemand
}

// AutoscaleInterval is how often the autoscaler decides: the routers
// report every 250 ms, an engine's reading is a second old at worst.
// Between rounds it looks at the demand every ZeroCheckInterval, and a
// model at zero replicas with requests held gets its round at once: a
// request waiting for a cold start must not wait for the tick too.
const (
	AutoscaleInterval = time.Second
	ZeroCheckInterval = 100 * time.Millisecond
)

// maxScaleEvents bounds the decisions kept per model for ModelStatus.
const maxScaleEvents = 20

// scaler is the autoscaler's memory for one term: per model, the history
// Decide keeps and the decisions kept for people.
type scaler struct {
	mu     sync.Mutex
	models map[string]*scaled
}

type scaled struct {
	revision uint64 // the model revision the history is for
	hist     autoscale.History
	count    uint32                // the count the last round saw
	events   []*llmgwv1.ScaleEvent // newest first
	demand   *llmgwv1.ModelDemand
	// blocked is the reason of the last blocked round, so a decision
	// that stays blocked is recorded once, not every second.
	blocked string
}

// Autoscale runs the autoscaler for one term, until ctx is done: every
// AutoscaleInterval, a decision per autoscaled model from d's demand and
// the agents' reports; a step is proposed as SET_MODEL_SCALE, and
// placement does the rest (design §5.7).
func (l *Leader) Autoscale(ctx context.Context, d DemandSource) {
	l.scaleMu.Lock()
	l.scaler = &scaler{models: map[string]*scaled{}}
	l.scaleMu.Unlock()
	// A follower shows no autoscale gauges: another node decides.
	defer l.forgetScaleSeries("")
	t := time.NewTicker(ZeroCheckInterval)
	defer t.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		demand := d.Demand()
		if now := l.now(); now.Sub(last) >= AutoscaleInterval || l.heldAtZero(demand) {
			last = now
			l.autoscaleOnce(ctx, demand)
		}
	}
}

// heldAtZero reports whether a model the last round saw at zero replicas
// now has requests held by a router.
func (l *Leader) heldAtZero(demand map[string]*llmgwv1.ModelDemand) bool {
	l.scaleMu.Lock()
	sc := l.scaler
	l.scaleMu.Unlock()
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for name, d := range demand {
		if s := sc.models[name]; s != nil && s.count == 0 && d.GetHeld() > 0 {
			return true
		}
	}
	return false
}

// autoscaleOnce is one round over every autoscaled model.
func (l *Leader) autoscaleOnce(ctx context.Context, demand map[string]*llmgwv1.ModelDemand) {
	st := l.state.State()
	l.scaleMu.Lock()
	sc := l.scaler
	l.scaleMu.Unlock()
	if sc == nil {
		return
	}
	now := l.now()
	live := map[string]bool{}
	for _, m := range st.Models {
		if m.Autoscale == nil {
			continue
		}
		live[m.Name] = true
		o := l.observe(st, m, demand[m.Name], now)
		sc.mu.Lock()
		s := sc.models[m.Name]
		if s == nil || s.revision != m.Revision {
			// A new spec starts a new history; its decisions stay.
			var events []*llmgwv1.ScaleEvent
			if s != nil {
				events = s.events
			}
			s = &scaled{revision: m.Revision, events: events}
			sc.models[m.Name] = s
		}
		s.demand = demand[m.Name]
		s.count = o.Count
		dec := autoscale.Decide(m.Autoscale, l.cfg.Autoscale, o, &s.hist)
		if dec.Step(o.Count) {
			s.count = dec.To
		}
		sc.mu.Unlock()
		l.act(ctx, sc, s, m, o, dec)
		if l.metrics != nil {
			l.metrics.scaleCount.WithLabelValues(m.Name).Set(float64(o.Count))
			l.metrics.scaleRecommended.WithLabelValues(m.Name).Set(float64(dec.Recommended))
			l.metrics.scaleHeld.WithLabelValues(m.Name).Set(b2f(dec.Blocked))
		}
	}
	sc.mu.Lock()
	for name := range sc.models {
		if !live[name] {
			delete(sc.models, name)
			l.forgetScaleSeries(name)
		}
	}
	sc.mu.Unlock()
}

// act proposes a step and keeps the decision for people.
func (l *Leader) act(ctx context.Context, sc *scaler, s *scaled, m *llmgwv1.Model, o autoscale.Observation, dec autoscale.Decision) {
	ev := &llmgwv1.ScaleEvent{UnixMs: o.Now.UnixMilli(), From: o.Count, To: dec.To, Reason: dec.Reason, Blocked: dec.Blocked}
	switch {
	case dec.Step(o.Count):
		_, _, err := l.propose.Propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_SET_MODEL_SCALE,
			&llmgwv1.SetModelScaleCommand{Model: m.Name, Replicas: dec.To, Reason: dec.Reason, ModelRevision: m.Revision})
		if err != nil {
			if ctx.Err() == nil {
				l.log.Warn("autoscale: the step was not committed; the next round decides again", "model", m.Name, "from", o.Count, "to", dec.To, "err", err)
			}
			// Decided again next round, on what the state says then.
			sc.mu.Lock()
			s.hist.LastStep = time.Time{}
			sc.mu.Unlock()
			return
		}
		l.log.Info("autoscale: step", "model", m.Name, "from", o.Count, "to", dec.To, "reason", dec.Reason)
		if l.metrics != nil {
			dir := "up"
			if dec.To < o.Count {
				dir = "down"
			}
			l.metrics.scaleSteps.WithLabelValues(m.Name, dir).Inc()
		}
		sc.mu.Lock()
		s.blocked = ""
		s.push(ev)
		sc.mu.Unlock()
	case dec.Blocked:
		// The same rule blocking again is one event, not one a second:
		// the reason's rule is what follows its figures.
		rule := dec.Reason[strings.LastIndex(dec.Reason, ";")+1:]
		sc.mu.Lock()
		if s.blocked != rule {
			s.blocked = rule
			ev.To = dec.Recommended
			s.push(ev)
			sc.mu.Unlock()
			l.log.Info("autoscale: step held", "model", m.Name, "count", o.Count, "recommended", dec.Recommended, "reason", dec.Reason)
			return
		}
		sc.mu.Unlock()
	default:
		sc.mu.Lock()
		s.blocked = ""
		sc.mu.Unlock()
	}
}

// forgetScaleSeries drops a model's autoscale gauges (it was deleted, or
// lost its autoscale); "" drops every model's (the term ended).
func (l *Leader) forgetScaleSeries(model string) {
	if l.metrics == nil {
		return
	}
	for _, g := range []*prometheus.GaugeVec{l.metrics.scaleCount, l.metrics.scaleRecommended, l.metrics.scaleHeld} {
		if model == "" {
			g.Reset()
		} else {
			g.DeleteLabelValues(model)
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func (s *scaled) push(ev *llmgwv1.ScaleEvent) {
	s.events = slices.Insert(s.events, 0, ev)
	if len(s.events) > maxScaleEvents {
		s.events = s.events[:maxScaleEvents]
	}
}

// observe is model m as the autoscaler sees it: the count placement works
// to, its replicas ready and starting by the agents' reports, and the
// routers' demand.
func (l *Leader) observe(st *llmgwv1.State, m *llmgwv1.Model, d *llmgwv1.ModelDemand, now time.Time) autoscale.Observation {
	o := autoscale.Observation{Now: now, Count: fsm.EffectiveReplicas(st, m), Capacity: float64(BatchCapacity(m))}
	for _, r := range st.Replicas {
		if r.Model != m.Name || r.Draining || r.Sleeping {
			continue
		}
		if l.reports.StatusOf(r).GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY {
			o.Ready++
		} else {
			o.Starting++
		}
	}
	if placed := o.Ready + o.Starting; placed < o.Count {
		o.Unplaced = o.Count - placed
	}
	if d != nil {
		o.Demand = autoscale.Demand{Held: d.Held, Waiting: d.Waiting, Running: d.Running, KVUsageSum: d.KvUsageSum,
			Requests: d.Requests}
		for _, n := range d.TtftBuckets {
			o.Demand.TTFTCount += n
		}
		if l.ttftP90 != nil && o.Demand.TTFTCount > 0 {
			o.Demand.TTFTP90 = l.ttftP90(d.TtftBuckets)
		}
	}
	return o
}

// ScaleStatus is the autoscaler's decisions for model, newest first, and
// the demand the last one saw; empty when this server does not lead.
func (l *Leader) ScaleStatus(model string) ([]*llmgwv1.ScaleEvent, *llmgwv1.ModelDemand) {
	l.scaleMu.Lock()
	sc := l.scaler
	l.scaleMu.Unlock()
	if sc == nil {
		return nil, nil
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	s := sc.models[model]
	if s == nil {
		return nil, nil
	}
	return slices.Clone(s.events), s.demand
}

// BatchCapacity is how many requests one of m's replicas runs at once:
// autoscale.warm_concurrency, else its engine's --max-num-seqs, else
// vLLM's default of 256.
func BatchCapacity(m *llmgwv1.Model) uint32 {
	if n := m.GetAutoscale().GetWarmConcurrency(); n > 0 {
		return n
	}
	if n, ok := fsm.MaxNumSeqs(m); ok {
		return n
	}
	return 256
}
