// Package autoscale decides an autoscaled model's replica count (design
// §5.7): a pure function of the model's spec, its replicas, the demand the
// routers report and what this leader decided before, so every rule is a
// table test and the leader's loop only gathers and proposes.
//
// The recommendation is Kubernetes HPA's: per target, the count at which
// the observed figure would meet it, the largest of them, within [min,
// max]. What keeps it from flapping is HPA's too: a tolerance around each
// target, a cooldown after a step, a step up only once the replicas of the
// last one are ready (they are what the next measurement must see), and a
// step down only to the largest recommendation of a whole window.
//
// Two rules are an LLM engine's, not HPA's. A queue asks for the replicas
// that would run what is in flight plus the target waiting each, not for
// waiting over target: a replica absorbs a whole batch before anything
// waits. And a step down never returns to a count at which a queue formed
// while the load is still what it was then (Floor): requests in flight
// shrink as a fleet grows (each takes less time in a smaller batch), so a
// count sized from them in calm reads too low, and the one measure that
// does not shrink — the requests a second that count was sent while it
// queued — is what a step down must get under.
package autoscale

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Defaults are the timings a spec leaves at 0 (the server's config).
type Defaults struct {
	// ScaleDownAfter is how long every recommendation must stay below the
	// count before a step down: five minutes, as HPA's stabilization window.
	ScaleDownAfter time.Duration
	// Cooldown is the least time between two steps.
	Cooldown time.Duration
	// UpAfter is how long every recommendation must stay above the count
	// before a step up (to the lowest of them): a queue's one-second
	// spike — Poisson arrivals at a fleet near its capacity make them all
	// the time — is not a trend. Scaling from zero does not wait.
	UpAfter time.Duration
}

// DefaultDefaults are Defaults' own defaults.
var DefaultDefaults = Defaults{ScaleDownAfter: 5 * time.Minute, Cooldown: 30 * time.Second, UpAfter: 15 * time.Second}

// Tolerance is how far from 1 an observed/target ratio must be to move the
// count: HPA's 10 %.
const Tolerance = 0.1

// Demand is what the routers saw of a model, summed (controlplane/flowview).
type Demand struct {
	// Held is requests the routers hold for it (no ready replica, or queued
	// by flow control).
	Held uint64
	// Waiting, Running and KVUsageSum are the engines' readings summed over
	// its replicas.
	Waiting, Running, KVUsageSum float64
	// TTFTP90 is the routers' time to first token, p90 over their last
	// minute, of TTFTCount answers.
	TTFTP90   time.Duration
	TTFTCount uint64
	// Requests is what the routers sent it over their last minute.
	Requests uint64
}

// Idle reports whether nothing asks for the model and nothing runs on it.
func (d Demand) Idle() bool {
	return d.Held == 0 && d.Requests == 0 && d.Waiting == 0 && d.Running == 0
}

// Observation is the model as the leader sees it now.
type Observation struct {
	Now time.Time
	// Count is the count placement works to now.
	Count uint32
	// Ready is its replicas serving; Starting those placed for it and not
	// ready yet (a step's replicas on their way); Unplaced those of the
	// count no node has taken (no GPU fits them).
	Ready, Starting, Unplaced uint32
	// Capacity is how many requests one replica runs at once (its
	// engine's --max-num-seqs): what a step down may load the rest to.
	Capacity float64
	Demand   Demand
}

// Fill is the share of Capacity a step down loads the replicas it keeps
// to, at most: the rest is headroom for the next burst, and it is well
// below the load at which a queue forms and the count steps up again —
// requests take longer in a fuller batch, so a fleet made smaller holds
// more of them than its load now shows (Little's law), and a Fill near 1
// steps down to a count that queues.
const Fill = 0.6

// FloorMargin is how far under the rate a count queued at the load must
// be before a step down may return to that count: the tolerance on either
// side of it, so a load that wanders within it moves nothing.
const FloorMargin = 1 - 2*Tolerance

// rateWindow is the routers' minute (router/demand: the current 10 s slot
// and the five before it, 50 to 60 s).
const rateWindow = 55 * time.Second

// History is what the leader remembers of one model between decisions:
// its last step, the recommendations of the last window and the counts
// at which a queue formed. The zero value is a model seen for the first
// time (a new leader remembers nothing, so its first step down waits a
// whole window).
type History struct {
	LastStep time.Time
	recs     []rec
	since    time.Time // first recommendation kept
	// settled is when the model last had no replica starting or
	// unplaced: a step up counts only recommendations made since, so the
	// queue that built while the last step's replicas loaded does not buy
	// the next step the moment they are ready.
	settled time.Time
	// active is when the model's demand last went from idle to busy: until
	// a minute has passed, the routers' count of requests sent covers less
	// than their minute, and the rate is over the time since.
	active time.Time
	// floors are the counts a step up left because a queue formed there,
	// with the rate they were sent then, by count (at most one each).
	floors []Floor
}

// Floor is a count at which a queue formed and the requests a second the
// model was sent then: that count carries at most that rate (a saturated
// fleet is sent what it serves), so a step down to it or below waits for
// the rate to fall under FloorMargin of it.
type Floor struct {
	Count uint32
	Rate  float64
	At    time.Time
}

type rec struct {
	at    time.Time
	n     uint32
	queue float64 // waiting and held
}

// Decision is one round's outcome for a model.
type Decision struct {
	// To is the count to set; equal to Observation.Count when nothing
	// changes.
	To uint32
	// Recommended is the count the targets asked for this round.
	Recommended uint32
	// Reason says why, with the figures.
	Reason string
	// Blocked is set when the targets ask for another count but a rule
	// keeps this one (cooldown, replicas still starting, the window).
	Blocked bool
}

// Step reports whether d changes the count.
func (d Decision) Step(from uint32) bool { return d.To != from }

// Decide is one round for a model with spec a: the recommendation from the
// targets, then the rules that let it through. h is updated in place.
func Decide(a *llmgwv1.Autoscale, def Defaults, o Observation, h *History) Decision {
	downAfter := secondsOr(a.GetScaleDownAfterS(), def.ScaleDownAfter)
	cooldown := secondsOr(a.GetCooldownS(), def.Cooldown)
	n, why := Recommend(a, o)
	h.remember(rec{o.Now, n, o.Demand.Waiting + float64(o.Demand.Held)}, max(downAfter, def.UpAfter))
	rate := h.rate(o)
	if o.Starting > 0 || o.Unplaced > 0 {
		h.settled = o.Now
	}
	d := Decision{To: o.Count, Recommended: n}
	switch {
	case o.Count == 0 && o.Demand.Held > 0:
		// From zero: a request is waiting; no cooldown stands in its way.
		d.To, d.Reason = max(1, a.GetMin()), fmt.Sprintf("scale from zero: %d requests held", o.Demand.Held)
	case n > o.Count && o.Unplaced > 0:
		d.Blocked, d.Reason = true, fmt.Sprintf("%s; %d replicas of the count are not placed: no node has the GPUs for them", why, o.Unplaced)
	case n > o.Count && o.Starting > 0:
		d.Blocked, d.Reason = true, fmt.Sprintf("%s; waiting for %d starting replicas before another step", why, o.Starting)
	case n > o.Count && !h.LastStep.IsZero() && o.Now.Sub(h.LastStep) < cooldown:
		d.Blocked, d.Reason = true, fmt.Sprintf("%s; cooling down until %s", why, h.LastStep.Add(cooldown).UTC().Format(time.TimeOnly))
	case n > o.Count:
		low, whole, from, to := h.lowest(o.Now, def.UpAfter)
		switch {
		case !whole || low <= o.Count:
			d.Blocked, d.Reason = true, fmt.Sprintf("%s; a step up waits for %v of recommendations above %d", why, def.UpAfter, o.Count)
		case to < (1-Tolerance)*from:
			// The replicas serve more than arrives: what queued while the
			// last step's replicas loaded, or a burst that has passed.
			// Another step would buy what the queue's fall shows is not
			// needed (the count it left would then be a floor).
			d.Blocked, d.Reason = true, fmt.Sprintf("%s; the queue fell from %.1f to %.1f over the last %v: the replicas drain it", why, from, to, def.UpAfter)
		default:
			// At most doubling (or 4 more) a step, as HPA's default policy.
			d.To = min(low, max(2*o.Count, o.Count+4))
			d.Reason = fmt.Sprintf("up: %s, for the last %v", why, def.UpAfter)
			h.floor(Floor{Count: o.Count, Rate: rate, At: o.Now})
		}
	case n < o.Count:
		top, whole := h.highest(o.Now, downAfter)
		switch {
		case !whole:
			d.Blocked, d.Reason = true, fmt.Sprintf("%s; a step down waits for %v of recommendations", why, downAfter)
		case top >= o.Count:
			d.Blocked, d.Reason = true, fmt.Sprintf("%s; %d was recommended within the last %v", why, top, downAfter)
		case !h.LastStep.IsZero() && o.Now.Sub(h.LastStep) < cooldown:
			d.Blocked, d.Reason = true, fmt.Sprintf("%s; cooling down until %s", why, h.LastStep.Add(cooldown).UTC().Format(time.TimeOnly))
		default:
			to, f, held := h.above(top, rate)
			if to >= o.Count {
				d.Blocked, d.Reason = true, fmt.Sprintf("%s; a queue formed at %d replicas %v ago, sent %.2f requests/s; now %.2f/s, not under %.2f",
					why, f.Count, o.Now.Sub(f.At).Round(time.Second), f.Rate, rate, FloorMargin*f.Rate)
				break
			}
			d.To = to
			d.Reason = fmt.Sprintf("down: %s, for the last %v", why, downAfter)
			if held {
				d.Reason += fmt.Sprintf("; not to %d: a queue formed at %d replicas %v ago, sent %.2f requests/s, now %.2f/s",
					top, f.Count, o.Now.Sub(f.At).Round(time.Second), f.Rate, rate)
			}
			h.forgetFloors(to)
		}
	default:
		d.Reason = why
	}
	if d.To != o.Count {
		h.LastStep = o.Now
	}
	return d
}

// Recommend is the count the targets ask for and why, within [min, max].
func Recommend(a *llmgwv1.Autoscale, o Observation) (uint32, string) {
	dm := o.Demand
	if dm.Idle() {
		return a.GetMin(), fmt.Sprintf("idle: recommend min %d", a.GetMin())
	}
	var n uint32
	var parts []string
	consider := func(want uint32, why string) {
		parts = append(parts, why)
		n = max(n, want)
	}
	ready := float64(o.Ready)
	if t := a.GetTargetWaiting(); t > 0 {
		load := dm.Waiting + float64(dm.Held)
		var want uint32
		if load > ready*t*(1+Tolerance) {
			// A queue: the replicas that would run everything in flight,
			// each as many as the ready ones run now plus the target
			// waiting, one more at least. HPA's ceil(load/target) asks for
			// a replica per target's worth of waiting, as if a replica ran
			// nothing: a near-saturated fleet's passing queue of 10 at
			// target 2 asked for 5 where 3 carry it.
			per := dm.Running/max(ready, 1) + t
			want = max(o.Ready+1, uint32(math.Ceil((dm.Running+load)/per)))
		} else {
			// None: the replicas that carry what runs at Fill of their
			// batch, never more than now (no queue asks for none) — HPA's
			// formula alone would recommend 0 at any load short of a queue.
			want = min(o.Ready, uint32(math.Ceil((dm.Running+load)/(Fill*max(o.Capacity, 1)))))
		}
		consider(want, fmt.Sprintf("waiting %.1f and running %.1f per ready replica (target waiting %g, batch %g) → %d",
			load/max(ready, 1), dm.Running/max(ready, 1), t, o.Capacity, want))
	}
	if t := a.GetTargetKvUsage(); t > 0 && o.Ready > 0 {
		want := ratioCount(o.Ready, dm.KVUsageSum, ready*t)
		consider(want, fmt.Sprintf("KV use %.2f (target %g) → %d", dm.KVUsageSum/ready, t, want))
	}
	if slo := time.Duration(a.GetTtftP90SloMs()) * time.Millisecond; slo > 0 && dm.TTFTCount > 0 && o.Ready > 0 {
		r := float64(dm.TTFTP90) / float64(slo)
		want := o.Ready
		switch {
		case r > 1+Tolerance:
			want = uint32(math.Ceil(ready * min(r, 2)))
		case r < 0.8:
			// Well under the SLO, TTFT asks for no more than carries the
			// load at Fill of a batch: how far under says nothing of how
			// few replicas would still meet it, and one replica less per
			// window would take a burst's fleet back one by one.
			want = min(o.Ready, uint32(math.Ceil((dm.Running+dm.Waiting+float64(dm.Held))/(Fill*max(o.Capacity, 1)))))
		}
		consider(want, fmt.Sprintf("TTFT p90 %v (SLO %v) → %d", dm.TTFTP90.Round(time.Millisecond), slo, want))
	}
	if dm.Held > 0 || dm.Running > 0 || dm.Waiting > 0 {
		n = max(n, 1)
	}
	n = min(max(n, a.GetMin()), a.GetMax())
	return n, strings.Join(parts, ", ") + fmt.Sprintf(": recommend %d", n)
}

// ratioCount is HPA's desired count: ceil(ready × observed / target),
// ready itself within the tolerance.
func ratioCount(ready uint32, observed, target float64) uint32 {
	if target <= 0 {
		return ready
	}
	r := observed / target
	if math.Abs(r-1) <= Tolerance && ready > 0 {
		return ready
	}
	return uint32(math.Ceil(float64(max(ready, 1)) * r))
}

func secondsOr(s uint32, def time.Duration) time.Duration {
	if s == 0 {
		return def
	}
	return time.Duration(s) * time.Second
}

// rate is the requests a second the routers sent the model over their
// last minute, or over the time since it went busy if that is shorter.
// It keeps track of when that was.
func (h *History) rate(o Observation) float64 {
	if o.Demand.Idle() {
		h.active = time.Time{}
		return 0
	}
	if h.active.IsZero() {
		h.active = o.Now
	}
	over := min(rateWindow, max(o.Now.Sub(h.active), slot))
	return float64(o.Demand.Requests) / over.Seconds()
}

// slot is the shortest span a rate is taken over: the routers' slot.
const slot = 10 * time.Second

// floor records f, replacing an older floor of its count.
func (h *History) floor(f Floor) {
	for i := range h.floors {
		if h.floors[i].Count == f.Count {
			h.floors[i] = f
			return
		}
	}
	h.floors = append(h.floors, f)
}

// above is the count a step down to `to` may take at the rate: to, or one
// above the highest floor at or above it whose rate the load has not
// fallen under — with that floor, and whether it held the step.
func (h *History) above(to uint32, rate float64) (uint32, Floor, bool) {
	var hit Floor
	held := false
	for _, f := range h.floors {
		if f.Count >= to && rate > FloorMargin*f.Rate {
			if !held || f.Count > hit.Count {
				hit, held = f, true
			}
		}
	}
	if held {
		return hit.Count + 1, hit, true
	}
	return to, hit, false
}

// forgetFloors drops the floors a step down to `to` went under: the load
// that queued there is gone.
func (h *History) forgetFloors(to uint32) {
	h.floors = slices.DeleteFunc(h.floors, func(f Floor) bool { return f.Count >= to })
}

// Floors is a copy of the counts at which a queue formed, for status.
func (h *History) Floors() []Floor { return slices.Clone(h.floors) }

// remember keeps r and forgets the recommendations older than the window.
func (h *History) remember(r rec, window time.Duration) {
	now := r.at
	if h.since.IsZero() {
		h.since = now
	}
	h.recs = append(h.recs, r)
	i := 0
	for i < len(h.recs) && now.Sub(h.recs[i].at) > window {
		i++
	}
	if i > 0 {
		h.recs = append(h.recs[:0], h.recs[i:]...)
	}
}

// lowest is the least recommendation of the last d and whether the
// history covers it, with the queue at the oldest and the newest of the
// recommendations it looked at. With d 0 it is the newest.
func (h *History) lowest(now time.Time, d time.Duration) (low uint32, whole bool, from, to float64) {
	low = math.MaxUint32
	if len(h.recs) > 0 {
		to = h.recs[len(h.recs)-1].queue
	}
	for i := len(h.recs) - 1; i >= 0 && !h.recs[i].at.Before(h.settled); i-- {
		r := h.recs[i]
		low, from = min(low, r.n), r.queue
		if now.Sub(r.at) >= d {
			return low, true, from, to
		}
	}
	return low, d == 0 || (now.Sub(h.since) >= d && now.Sub(h.settled) >= d), from, to
}

// highest is the largest recommendation of the window ending at now, and
// whether the history covers the whole window.
func (h *History) highest(now time.Time, window time.Duration) (uint32, bool) {
	var top uint32
	for _, r := range h.recs {
		top = max(top, r.n)
	}
	return top, now.Sub(h.since) >= window
}
