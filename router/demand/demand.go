// Package demand is what one router tells the leader of its autoscaled
// models' load, in each flow report (design §5.7 "The inputs"): per model
// with an autoscale spec, the requests it holds (the waiting room's and
// flow control's queues), the engines' readings summed over the replicas
// it routes to, and its own answers' time to first token and requests
// sent over its last minute.
//
// The engine readings are the ones the router schedules by (design §7.2).
// A stale one — an engine that has not answered its metrics for a few
// intervals — is left out of the sums and of the replica count, not
// guessed: scheduling takes such a replica to be full, which is safe for
// routing, but read as demand it would ask for capacity the fleet may not
// need. The leader takes the largest figures of every router, so one
// router's stale view costs nothing while another's is fresh.
//
// Time to first token counts this router's streamed answers (the same
// first byte llmgw_router_ttft_seconds observes; a non-streamed answer's
// first byte is its last), from when the request left the waiting room:
// the time it was held is counted as held requests already, and would
// otherwise make the minute after a start from zero ask for more replicas
// than the load needs. Time queued by flow control is in it: that is the
// saturation the target is about.
package demand

import (
	"sync"
	"time"

	"github.com/llmgw/llmgw/internal/ttftbuckets"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/router/endpoint"
)

// MaxModels bounds the demands in a report (the leader takes at most as
// many) and the models counted.
const MaxModels = 4096

// The sliding minute: slots of slotWidth, the current one and the five
// before it, so a report covers the last 50 to 60 s.
const (
	slotWidth = 10 * time.Second
	slots     = 6
)

// Table is the routing table as the report reads it (endpoint.Registry).
// Safe for concurrent use; cheap (no I/O).
type Table interface {
	// Models returns the desired models, sorted by name.
	Models() []*llmgwv1.Model
	// Lookup returns a model's routable endpoints.
	Lookup(model string) (eps []*endpoint.Endpoint, known bool)
	// LoadOf returns an endpoint's load now, a stale reading Saturated.
	LoadOf(e *endpoint.Endpoint) endpoint.Load
}

// Holder is the waiting room (router/waitroom): how many requests of a
// model it holds now.
type Holder interface {
	Held(model string) int
}

// Demand counts the router's answers of autoscaled models and builds its
// demand report. Safe for concurrent use.
type Demand struct {
	table Table
	held  Holder
	now   func() time.Time

	mu     sync.RWMutex
	models map[string]*series
}

// series is one model's last minute.
type series struct {
	mu    sync.Mutex
	slots [slots]slot
}

type slot struct {
	epoch    int64 // which slotWidth since the epoch the counts are of
	requests uint64
	ttft     [ttftbuckets.N]uint64
}

// New returns the demand of the models in table, with held's held
// requests (nil: none), on the clock now (nil: time.Now).
func New(table Table, held Holder, now func() time.Time) *Demand {
	if now == nil {
		now = time.Now
	}
	return &Demand{table: table, held: held, now: now, models: map[string]*series{}}
}

// Sent counts a request of an autoscaled model sent to be served.
func (d *Demand) Sent(model string) {
	d.record(model, func(s *slot) { s.requests++ })
}

// FirstToken counts an answer's time to first token.
func (d *Demand) FirstToken(model string, ttft time.Duration) {
	i := ttftbuckets.Index(ttft)
	d.record(model, func(s *slot) { s.ttft[i]++ })
}

func (d *Demand) record(model string, f func(*slot)) {
	s := d.series(model)
	if s == nil {
		return
	}
	epoch := d.now().UnixNano() / int64(slotWidth)
	s.mu.Lock()
	sl := &s.slots[epoch%slots]
	if sl.epoch != epoch {
		*sl = slot{epoch: epoch}
	}
	f(sl)
	s.mu.Unlock()
}

// series returns model's, made on first use; nil past MaxModels.
func (d *Demand) series(model string) *series {
	d.mu.RLock()
	s := d.models[model]
	d.mu.RUnlock()
	if s != nil {
		return s
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if s = d.models[model]; s == nil && len(d.models) < MaxModels {
		s = &series{}
		d.models[model] = s
	}
	return s
}

// read sums the slots of the last minute at epoch.
func (s *series) read(epoch int64) (ttft []uint64, requests uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var sum [ttftbuckets.N]uint64
	counted := false
	for i := range s.slots {
		sl := &s.slots[i]
		if sl.epoch <= epoch-slots || sl.epoch > epoch {
			continue
		}
		requests += sl.requests
		for j, c := range sl.ttft {
			sum[j] += c
			counted = counted || c > 0
		}
	}
	if counted {
		ttft = sum[:]
	}
	return ttft, requests
}

// Demand is the report's demands: one per autoscaled model in the table,
// in name order, at most MaxModels. depths are this router's flow-control
// queues, counted with the waiting room's requests as held. Models no
// longer autoscaled are forgotten.
func (d *Demand) Demand(depths []*llmgwv1.FlowDepth) []*llmgwv1.ModelDemand {
	var queued map[string]uint64
	for _, dp := range depths {
		if queued == nil {
			queued = map[string]uint64{}
		}
		queued[dp.GetModel()] += dp.GetQueued()
	}
	epoch := d.now().UnixNano() / int64(slotWidth)
	var out []*llmgwv1.ModelDemand
	for _, m := range d.table.Models() {
		if m.GetAutoscale() == nil {
			continue
		}
		if len(out) == MaxModels {
			break
		}
		name := m.GetName()
		md := &llmgwv1.ModelDemand{Model: name, Held: queued[name]}
		if d.held != nil {
			md.Held += uint64(d.held.Held(name))
		}
		eps, _ := d.table.Lookup(name)
		for _, e := range eps {
			l := d.table.LoadOf(e)
			if l.Saturated { // stale: not a reading
				continue
			}
			md.Waiting += l.Waiting
			md.Running += l.Running
			md.KvUsageSum += l.KVUsage
			md.Replicas++
		}
		d.mu.RLock()
		s := d.models[name]
		d.mu.RUnlock()
		if s != nil {
			md.TtftBuckets, md.Requests = s.read(epoch)
		}
		out = append(out, md)
	}
	d.forget(out)
	return out
}

// forget drops the counts of models not in the report: no longer
// autoscaled, or gone.
func (d *Demand) forget(kept []*llmgwv1.ModelDemand) {
	d.mu.RLock()
	n := len(d.models)
	d.mu.RUnlock()
	if n == 0 {
		return
	}
	keep := make(map[string]bool, len(kept))
	for _, md := range kept {
		keep[md.GetModel()] = true
	}
	d.mu.Lock()
	for name := range d.models {
		if !keep[name] {
			delete(d.models, name)
		}
	}
	d.mu.Unlock()
}
