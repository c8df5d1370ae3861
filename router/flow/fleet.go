package flow

import (
	"time"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// fleetView is what the other routers last reported of their queues
// (router/flowshare, through the leader): per model, the oldest wait of
// each class by this router's ranks. It holds a lower class here while a
// higher one has waited there (design §7.8).
type fleetView struct {
	until time.Time
	waits map[string][]time.Duration // model → rank → oldest wait reported (0: none queued)
}

// holds reports whether a class above rank of model had waited at least
// wait at another router, as it last reported.
func (f *fleetView) holds(model string, rank int, now time.Time, wait time.Duration) bool {
	if f.waits == nil || now.After(f.until) {
		return false
	}
	ws := f.waits[model]
	for hr := 0; hr < rank && hr < len(ws); hr++ {
		if ws[hr] > 0 && ws[hr] >= wait {
			return true
		}
	}
	return false
}

// SetFleet replaces the other routers' queues, valid until until. A class
// this router does not configure is placed by the rank its sender gave it.
func (c *Controller) SetFleet(depths []*llmgwv1.FlowDepth, until time.Time) {
	if !c.Enabled() {
		return
	}
	waits := map[string][]time.Duration{}
	for _, d := range depths {
		if d.GetQueued() == 0 {
			continue
		}
		rank, ok := c.byName[d.GetClass()]
		if !ok {
			rank = min(int(d.GetRank()), len(c.cfg.Classes)-1)
		}
		ws := waits[d.GetModel()]
		if ws == nil {
			ws = make([]time.Duration, len(c.cfg.Classes))
			waits[d.GetModel()] = ws
		}
		// A wait of 0 ms still means someone waits.
		ws[rank] = max(ws[rank], time.Duration(d.GetOldestWaitMs())*time.Millisecond, time.Nanosecond)
	}
	c.mu.Lock()
	c.fleet = fleetView{until: until, waits: waits}
	c.mu.Unlock()
	c.wake() // a hold may have ended
}

// Depths is this router's non-empty queues now, for the other routers.
func (c *Controller) Depths() []*llmgwv1.FlowDepth {
	if !c.Enabled() || c.queued.Load() == 0 {
		return nil
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*llmgwv1.FlowDepth
	for _, m := range c.models {
		for rank, q := range m.queues {
			if q.n == 0 {
				continue
			}
			o, _ := q.oldest()
			out = append(out, &llmgwv1.FlowDepth{Model: m.name, Class: c.cfg.Classes[rank].Name, Rank: uint32(rank),
				Queued: uint64(q.n), QueuedBytes: uint64(q.bytes), OldestWaitMs: now.Sub(o).Milliseconds()})
		}
	}
	return out
}
