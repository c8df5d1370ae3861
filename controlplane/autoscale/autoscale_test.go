package autoscale

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

var t0 = time.Unix(1_800_000_000, 0)

func spec() *llmgwv1.Autoscale {
	return &llmgwv1.Autoscale{Min: 0, Max: 10, TargetWaiting: 2}
}

func TestDecideOnce(t *testing.T) {
	for _, tc := range []struct {
		name    string
		a       *llmgwv1.Autoscale
		o       Observation
		h       History
		to      uint32
		blocked bool
		reason  string
	}{
		{name: "from zero, in a cooldown", a: spec(), h: History{LastStep: t0.Add(-time.Second)},
			o: Observation{Count: 0, Demand: Demand{Held: 5}}, to: 1, reason: "scale from zero: 5 requests held"},
		{name: "from zero to min", a: &llmgwv1.Autoscale{Min: 2, Max: 4, TargetWaiting: 1},
			o: Observation{Count: 0, Demand: Demand{Held: 1}}, to: 2},
		{name: "a queue: up, at most doubling or 4 more", a: spec(),
			o: Observation{Count: 2, Ready: 2, Capacity: 16, Demand: Demand{Waiting: 200, Running: 32, Requests: 100}}, to: 6, reason: "up: waiting 100.0"},
		{name: "a queue: the replicas that run what is in flight, each a batch and the target", a: spec(),
			o: Observation{Count: 2, Ready: 2, Capacity: 16, Demand: Demand{Waiting: 40, Running: 32, Requests: 100}}, to: 4, reason: "→ 4"},
		{name: "a short queue: one more", a: spec(),
			o: Observation{Count: 2, Ready: 2, Capacity: 16, Demand: Demand{Waiting: 6, Running: 32, Requests: 100}}, to: 3, reason: "→ 3"},
		{name: "a queue within the tolerance: stay", a: spec(),
			o: Observation{Count: 2, Ready: 2, Capacity: 16, Demand: Demand{Waiting: 4.2, Running: 32, Requests: 100}}, to: 2},
		{name: "up waits for starting replicas", a: spec(),
			o: Observation{Count: 3, Ready: 2, Starting: 1, Capacity: 16, Demand: Demand{Waiting: 40, Running: 32, Requests: 100}}, to: 3, blocked: true, reason: "waiting for 1 starting replicas"},
		{name: "up waits for replicas no node takes", a: spec(),
			o: Observation{Count: 4, Ready: 2, Unplaced: 2, Capacity: 16, Demand: Demand{Waiting: 200, Running: 32, Requests: 100}}, to: 4, blocked: true, reason: "2 replicas of the count are not placed"},
		{name: "up waits for the cooldown", a: spec(), h: History{LastStep: t0.Add(-10 * time.Second)},
			o: Observation{Count: 2, Ready: 2, Capacity: 16, Demand: Demand{Waiting: 40, Running: 32, Requests: 100}}, to: 2, blocked: true, reason: "cooling down"},
		{name: "up to max only", a: &llmgwv1.Autoscale{Min: 1, Max: 3, TargetWaiting: 1},
			o: Observation{Count: 2, Ready: 2, Capacity: 16, Demand: Demand{Waiting: 100, Running: 32, Requests: 100}}, to: 3},
		{name: "down needs a whole window of history", a: spec(),
			o: Observation{Count: 4, Ready: 4, Capacity: 16, Demand: Demand{Running: 8, Requests: 10}}, to: 4, blocked: true, reason: "a step down waits for 5m0s"},
		{name: "KV past its target: up", a: &llmgwv1.Autoscale{Min: 1, Max: 10, TargetKvUsage: 0.5},
			o: Observation{Count: 2, Ready: 2, Demand: Demand{KVUsageSum: 1.8, Running: 10, Requests: 10}}, to: 4, reason: "KV use 0.90"},
		{name: "TTFT past its SLO: up", a: &llmgwv1.Autoscale{Min: 1, Max: 10, TtftP90SloMs: 500},
			o: Observation{Count: 2, Ready: 2, Demand: Demand{TTFTP90: 900 * time.Millisecond, TTFTCount: 50, Running: 10, Requests: 50}}, to: 4, reason: "TTFT p90 900ms (SLO 500ms) → 4"},
		{name: "TTFT within its SLO: stay", a: &llmgwv1.Autoscale{Min: 1, Max: 10, TtftP90SloMs: 500},
			o: Observation{Count: 2, Ready: 2, Demand: Demand{TTFTP90: 450 * time.Millisecond, TTFTCount: 50, Running: 10, Requests: 50}}, to: 2},
		{name: "TTFT well under its SLO asks for what carries the load", a: &llmgwv1.Autoscale{Min: 1, Max: 10, TtftP90SloMs: 2000},
			o:  Observation{Count: 8, Ready: 8, Capacity: 16, Demand: Demand{TTFTP90: 150 * time.Millisecond, TTFTCount: 50, Running: 4, Requests: 50}},
			to: 8, blocked: true, reason: "TTFT p90 150ms (SLO 2s) → 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.Now = t0
			h := tc.h
			def := DefaultDefaults
			def.UpAfter = 0 // one round decides; TestUpWaitsForATrend has the window
			d := Decide(tc.a, def, tc.o, &h)
			if d.To != tc.to || d.Blocked != tc.blocked || !strings.Contains(d.Reason, tc.reason) {
				t.Fatalf("decision %+v, want to %d, blocked %v, a reason with %q", d, tc.to, tc.blocked, tc.reason)
			}
			if d.Step(tc.o.Count) != h.LastStep.Equal(t0) {
				t.Fatalf("step %v but LastStep %v", d.Step(tc.o.Count), h.LastStep)
			}
		})
	}
}

// fleet runs Decide once a second for dur on a model whose new replicas
// are ready after ready, under the demand load gives for the second and
// the count; it returns the steps taken and the counts.
func fleet(a *llmgwv1.Autoscale, start uint32, dur, ready time.Duration, load func(s int, ready uint32) Demand) (steps []Decision, counts []uint32) {
	var h History
	count := start
	readyAt := map[uint32]time.Time{} // replica index → when it is ready
	for i := range count {
		readyAt[i] = t0
	}
	for s := 0; s < int(dur/time.Second); s++ {
		now := t0.Add(time.Duration(s) * time.Second)
		var r, st uint32
		for i := range count {
			if !now.Before(readyAt[i]) {
				r++
			} else {
				st++
			}
		}
		o := Observation{Now: now, Count: count, Ready: r, Starting: st, Capacity: 16, Demand: load(s, r)}
		d := Decide(a, DefaultDefaults, o, &h)
		if d.Step(count) {
			steps = append(steps, d)
			for i := count; i < d.To; i++ {
				readyAt[i] = now.Add(ready)
			}
			count = d.To
		}
		counts = append(counts, count)
	}
	return steps, counts
}

// offered is a closed model of replicas of capacity 16 under rps requests
// of 2 s each: what runs, and the queue of what does not fit.
func offered(rps float64, ready uint32) Demand {
	inflight := rps * 2
	running := min(inflight, 16*float64(ready))
	return Demand{Running: running, Waiting: inflight - running, Requests: uint64(rps * 60)}
}

func TestLoadStepUpAndBack(t *testing.T) {
	a := &llmgwv1.Autoscale{Min: 1, Max: 10, TargetWaiting: 2, ScaleDownAfterS: 120}
	testLoadStep(t, a)
	// With a TTFT SLO too (the fleet's p90 well under it once the queue
	// is gone): the way back to min is still one step, not one a window.
	a = &llmgwv1.Autoscale{Min: 1, Max: 10, TargetWaiting: 2, TtftP90SloMs: 2000, ScaleDownAfterS: 120}
	testLoadStep(t, a)
}

func testLoadStep(t *testing.T, a *llmgwv1.Autoscale) {
	t.Helper()
	// One replica's capacity is 8 requests per second (16 running, 2 s
	// each): 1 × for 2 minutes, 6 × for 5, then half of 1 × for 5 (at
	// 1 × a step down stops at 2: Fill keeps a fifth of a batch spare).
	rps := func(s int) float64 {
		switch {
		case s >= 120 && s < 420:
			return 48
		case s >= 420:
			return 4
		}
		return 8
	}
	steps, counts := fleet(a, 1, 12*time.Minute, 20*time.Second, func(s int, ready uint32) Demand {
		d := offered(rps(s), ready)
		// TTFT: under a tenth of the SLO without a queue, past it with one.
		d.TTFTCount, d.TTFTP90 = 100, 150*time.Millisecond
		if d.Waiting > 0 {
			d.TTFTP90 = 5 * time.Second
		}
		return d
	})
	if got := counts[419]; got < 6 {
		t.Errorf("%d replicas at the end of the 6 × load, want at least 6 (steps %v)", got, steps)
	}
	for s := 120; s < 420; s++ {
		if counts[s] >= 6 {
			t.Logf("reached %d replicas %v after the step", counts[s], time.Duration(s-120)*time.Second)
			break
		}
	}
	if got := counts[len(counts)-1]; got != 1 {
		t.Errorf("%d replicas 5 minutes after the load dropped, want min 1 (steps %v)", got, steps)
	}
	for _, d := range steps {
		if d.To > a.Max || d.To < a.Min {
			t.Errorf("step to %d outside [%d, %d]", d.To, a.Min, a.Max)
		}
	}
}

// TestNoFlapping is the issue's "a stationary load near a threshold for 10
// minutes causes at most 1 scale action": a load that keeps 3 replicas
// just at their queue target, with noise, once a second.
func TestNoFlapping(t *testing.T) {
	for seed := range uint64(10) {
		rng := rand.New(rand.NewPCG(seed, 1))
		a := &llmgwv1.Autoscale{Min: 1, Max: 10, TargetWaiting: 2}
		steps, _ := fleet(a, 3, 10*time.Minute, 20*time.Second, func(_ int, ready uint32) Demand {
			// 3 full replicas and a queue of 6 (2 each): the target, ±8 %.
			return Demand{Running: 48, Waiting: 6 * (1 + 0.16*(rng.Float64()-0.5)), Requests: 1000}
		})
		if len(steps) > 1 {
			t.Errorf("seed %d: %d scale actions in 10 minutes: %+v", seed, len(steps), steps)
		}
	}
}

// TestNoFlappingNearCapacity is the bench's case: two replicas at 95 % of
// their capacity, the requests in flight wandering around that (Poisson
// arrivals, a slowly moving queue: AR(1) noise, sd 5 requests, 10 s
// memory). Spikes past the batch make a queue now and then; the count may
// take one step up, and then neither flaps up nor steps back down.
func TestNoFlappingNearCapacity(t *testing.T) {
	for seed := range uint64(10) {
		rng := rand.New(rand.NewPCG(seed, 2))
		a := &llmgwv1.Autoscale{Min: 1, Max: 8, TargetWaiting: 2, ScaleDownAfterS: 120}
		noise := 0.0
		steps, _ := fleet(a, 2, 10*time.Minute, 20*time.Second, func(_ int, ready uint32) Demand {
			noise = 0.9*noise + math.Sqrt(1-0.81)*5*rng.NormFloat64()
			inflight := max(0, 0.95*32+noise)
			running := min(inflight, 16*float64(ready))
			return Demand{Running: running, Waiting: inflight - running, Requests: 1000}
		})
		if len(steps) > 1 {
			t.Errorf("seed %d: %d scale actions in 10 minutes: %+v", seed, len(steps), steps)
		}
	}
}

// engines is a fleet whose requests take longer in a fuller batch, as an
// engine's do: a request's time is base × (1 + b/batch) at b running on
// its replica, so a full batch of 16 takes 4 s and a replica serves at
// most 4 requests a second. Arrivals are Poisson at rps (normal noise);
// what does not fit a batch waits. Requests is the arrivals of the last
// 55 s, as the routers count what they send.
type engines struct {
	rng      *rand.Rand
	rps      func(s int) float64
	inflight float64
	sent     []float64 // arrivals per second, newest last
}

func (e *engines) demand(s int, ready uint32) Demand {
	const batch, base = 16.0, 2.0
	arrived := max(0, e.rps(s)+math.Sqrt(e.rps(s))*e.rng.NormFloat64())
	e.sent = append(e.sent, arrived)
	if len(e.sent) > 55 {
		e.sent = e.sent[1:]
	}
	n := float64(max(ready, 1))
	running := min(e.inflight, batch*n)
	done := running / (base * (1 + running/n/batch))
	e.inflight = max(0, e.inflight+arrived-done)
	running = min(e.inflight, batch*n)
	var requests float64
	for _, a := range e.sent {
		requests += a
	}
	return Demand{Running: running, Waiting: e.inflight - running, Requests: uint64(requests)}
}

// TestNoFlappingLittlesLaw is the bench's failure of the first build: 1.9 ×
// one replica's capacity on 2. A queue forms; a step up by the queue over
// the target went to 5; there, each request takes less time, so fewer are
// in flight, and a step down sized from them went back towards 2 — where
// the queue was. Now the step up asks for what is in flight (3), and the
// floor keeps the count off 2 while the load is what queued there.
func TestNoFlappingLittlesLaw(t *testing.T) {
	for seed := range uint64(10) {
		e := &engines{rng: rand.New(rand.NewPCG(seed, 3)), rps: func(int) float64 { return 1.9 * 4 }}
		a := &llmgwv1.Autoscale{Min: 1, Max: 8, TargetWaiting: 2, ScaleDownAfterS: 120, CooldownS: 30}
		steps, counts := fleet(a, 2, 10*time.Minute, 27*time.Second, e.demand)
		t.Logf("seed %d: %d actions, end %d", seed, len(steps), counts[len(counts)-1])
		if len(steps) > 1 {
			t.Errorf("seed %d: %d scale actions in 10 minutes: %+v", seed, len(steps), steps)
		}
		if last := counts[len(counts)-1]; last < 2 || last > 3 {
			t.Errorf("seed %d: %d replicas at the end, want 2 or 3 for 1.9 × one replica's load", seed, last)
		}
	}
}

// TestFloorHoldsAStepDown: a count a queue formed at is not stepped down
// to while the rate sent is what it was then, however few requests are in
// flight; once the rate falls under FloorMargin of it, the step is taken.
func TestFloorHoldsAStepDown(t *testing.T) {
	a := &llmgwv1.Autoscale{Min: 1, Max: 8, TargetWaiting: 2, ScaleDownAfterS: 60, CooldownS: 30}
	var h History
	s := 0
	round := func(count uint32, dm Demand) Decision {
		s++
		return Decide(a, DefaultDefaults, Observation{Now: t0.Add(time.Duration(s) * time.Second), Count: count, Ready: count, Capacity: 16, Demand: dm}, &h)
	}
	const sent = 418 // 7.6 requests a second over the routers' 55 s
	var d Decision
	for range 80 { // a minute busy, then a queue for 15 s
		w := 0.0
		if s >= 55 {
			w = 10
		}
		if d = round(2, Demand{Running: 32, Waiting: w, Requests: sent}); d.Step(2) {
			break
		}
	}
	if d.To != 3 {
		t.Fatalf("under a queue: %+v, want a step to 3", d)
	}
	// At 3, few in flight (each request is quicker): the targets ask for 2.
	for range 180 {
		if d = round(3, Demand{Running: 12, Requests: sent}); d.Step(3) {
			t.Fatalf("stepped to %d at the rate that queued at 2: %+v", d.To, d)
		}
	}
	if !d.Blocked || d.Recommended != 2 || !strings.Contains(d.Reason, "a queue formed at 2 replicas") || !strings.Contains(d.Reason, "now 7.60/s, not under 6.08") {
		t.Fatalf("held step: %+v, want blocked with the floor's figures", d)
	}
	if f := h.Floors(); len(f) != 1 || f[0].Count != 2 || math.Abs(f[0].Rate-7.6) > 0.01 {
		t.Fatalf("floors %+v, want one at 2 with 7.6 requests/s", f)
	}
	// The load falls to 3.6/s: the step is taken, and the floor forgotten.
	for range 60 {
		if d = round(3, Demand{Running: 6, Requests: 200}); d.Step(3) {
			break
		}
	}
	if d.To != 2 || len(h.Floors()) != 0 {
		t.Fatalf("after the load fell: %+v, floors %+v; want a step to 2 and none left", d, h.Floors())
	}
}

// TestFloorGivesWayToALowerLoad: the floor holds a step down only while
// the load is what queued there; the same fleet, the load at a quarter, goes
// back to min.
func TestFloorGivesWayToALowerLoad(t *testing.T) {
	e := &engines{rng: rand.New(rand.NewPCG(7, 3)), rps: func(s int) float64 {
		if s < 300 {
			return 2.2 * 4 // past 2 replicas' capacity: a queue that grows
		}
		return 0.5 * 4
	}}
	a := &llmgwv1.Autoscale{Min: 1, Max: 8, TargetWaiting: 2, ScaleDownAfterS: 120, CooldownS: 30}
	steps, counts := fleet(a, 2, 10*time.Minute, 27*time.Second, e.demand)
	if counts[299] < 3 {
		t.Fatalf("%d replicas under 1.9 × one replica's load (steps %+v), want the step up this test is about", counts[299], steps)
	}
	if counts[299] > 4 {
		t.Fatalf("%d replicas for 2.2 × one replica's load (steps %+v), want 3 or 4", counts[299], steps)
	}
	if last := counts[len(counts)-1]; last != 1 {
		t.Fatalf("%d replicas 5 minutes after the load fell to 0.5 ×, want min 1 (steps %+v)", last, steps)
	}
}

func TestIdleToMinAfterTheWindow(t *testing.T) {
	a := &llmgwv1.Autoscale{Min: 0, Max: 4, TargetWaiting: 2, ScaleDownAfterS: 60}
	steps, counts := fleet(a, 2, 3*time.Minute, 0, func(int, uint32) Demand { return Demand{} })
	if len(steps) != 1 || steps[0].To != 0 {
		t.Fatalf("steps %+v, want one to 0", steps)
	}
	if counts[58] != 2 {
		t.Fatalf("count %d before the window passed, want 2", counts[58])
	}
}

// TestUpWaitsForATrend: a step up needs every recommendation of UpAfter
// above the count, and goes to the lowest of them; a one-round spike moves
// nothing.
func TestUpWaitsForATrend(t *testing.T) {
	a := spec()
	var h History
	round := func(s int, waiting float64) Decision {
		return Decide(a, DefaultDefaults, Observation{Now: t0.Add(time.Duration(s) * time.Second), Count: 2, Ready: 2, Capacity: 16,
			Demand: Demand{Waiting: waiting, Running: 32, Requests: 100}}, &h)
	}
	for s := range 30 {
		w := 0.0
		if s == 10 {
			w = 80 // a spike
		}
		if d := round(s, w); d.Step(2) {
			t.Fatalf("second %d: stepped to %d on a spike", s, d.To)
		}
	}
	var d Decision
	for s := 30; s <= 45; s++ {
		w := 40.0 // a queue for 15 s: recommend 4 (72 in flight, 18 a replica)
		if s == 40 {
			w = 12 // once recommend 3
		}
		d = round(s, w)
		if s < 45 && d.Step(2) {
			t.Fatalf("second %d: stepped before the queue lasted %v", s, DefaultDefaults.UpAfter)
		}
	}
	if d.To != 3 || !strings.Contains(d.Reason, "for the last 15s") {
		t.Fatalf("after 15 s of a queue: %+v, want a step to the lowest recommendation, 3", d)
	}
}

// TestUpWindowStartsWhenSettled: the queue that built while a step's
// replicas loaded does not buy the next step the moment they are ready:
// the window counts from then.
func TestUpWindowStartsWhenSettled(t *testing.T) {
	a := spec()
	var h History
	round := func(s int, starting uint32) Decision {
		return Decide(a, DefaultDefaults, Observation{Now: t0.Add(time.Duration(s) * time.Second), Count: 3, Ready: 3 - starting, Starting: starting,
			Capacity: 16, Demand: Demand{Waiting: 30, Running: 32, Requests: 100}}, &h)
	}
	for s := range 30 {
		round(s, 1) // a replica loads for 30 s under a queue
	}
	// The last round that saw it loading was second 29.
	for s := 30; s < 44; s++ {
		if d := round(s, 0); d.Step(3) {
			t.Fatalf("second %d: stepped %v after the replica was ready, want to wait %v", s-30, d.To, DefaultDefaults.UpAfter)
		}
	}
	if d := round(44, 0); !d.Step(3) {
		t.Fatalf("15 s of a queue after the replica was ready: %+v, want a step", d)
	}
}

// TestDrainingQueueBuysNothing: the backlog a cold start left, draining
// once the replica is up, asks for more replicas all the while (it is a
// queue), but a queue that falls over the up window is being served: no
// step. One that stops falling is a trend again.
func TestDrainingQueueBuysNothing(t *testing.T) {
	a := spec()
	var h History
	round := func(s int, waiting float64) Decision {
		return Decide(a, DefaultDefaults, Observation{Now: t0.Add(time.Duration(s) * time.Second), Count: 3, Ready: 3,
			Capacity: 16, Demand: Demand{Waiting: waiting, Running: 27, Requests: 400}}, &h)
	}
	for s := range 40 { // 48 waiting, half a request fewer a second
		w := 48 - 0.5*float64(s)
		if d := round(s, w); d.Step(3) {
			t.Fatalf("second %d: stepped to %d on a draining queue (%.1f waiting): %+v", s, d.To, w, d)
		} else if s == 39 && !strings.Contains(d.Reason, "the replicas drain it") {
			t.Fatalf("held for another reason: %+v", d)
		}
	}
	var d Decision
	for s := 40; s < 60; s++ { // it stops falling at 30
		if d = round(s, 30); d.Step(3) {
			break
		}
	}
	if d.To != 6 {
		t.Fatalf("a queue of 30 that stopped falling: %+v, want a step to 6 (57 in flight, 11 a replica)", d)
	}
}
