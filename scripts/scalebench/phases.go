package main

import (
	"context"
	"fmt"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
	"github.com/llmgw/llmgw/scripts/internal/benchchat"
	"github.com/llmgw/llmgw/sim"
)

// zero is the scale-from-zero phase: a model brought to 0 replicas takes
// a burst of concurrent requests.
func (b *bench) zero(ctx context.Context) error {
	const model = "zero"
	spec := b.spec(model, 1, fmt.Sprintf("{min: 0, max: 2, target_waiting: 2, scale_down_after: %s, cooldown: 5s, hold_timeout: 5m, max_held: %d}",
		b.cfg.zeroDownFor, max(1000, 2*b.cfg.zeroBurst)))
	if err := b.c.ApplyModel(model, spec); err != nil {
		return err
	}
	fmt.Printf("\nphase zero: model %s starts at 1 replica and goes to 0 after %v idle\n", model, b.cfg.zeroDownFor)
	// Its first replica loads, then, idle, the count goes to 0 and the
	// replica drains away.
	if err := waitFor(ctx, 5*time.Minute, "the model at 0 replicas", func() bool {
		st, err := b.status(model)
		return err == nil && st.GetScale() != nil && st.GetDesired() == 0 && st.GetPlaced() == 0
	}); err != nil {
		return err
	}
	l := b.loader(model)
	start := time.Now()
	var wg sync.WaitGroup
	for range b.cfg.zeroBurst {
		wg.Go(func() { l.send(ctx) })
	}
	// The cold start, as the control plane sees it: from the burst to the
	// first replica READY; then the engine's queue for 10 s.
	var ready time.Time
	var addr string
	if err := waitFor(ctx, 10*time.Minute, "a ready replica", func() bool {
		addrs, err := b.replicaAddrs(model)
		for _, a := range addrs {
			addr, ready = a, time.Now()
		}
		return err == nil && addr != ""
	}); err != nil {
		return err
	}
	var peak float64
	samples := 0
	for time.Since(ready) < 10*time.Second && ctx.Err() == nil {
		if q, ok := engineQueue(addr); ok {
			peak, samples = max(peak, q), samples+1
		}
		time.Sleep(50 * time.Millisecond)
	}
	wg.Wait()
	recs := l.take()
	res := zeroResult{Burst: b.cfg.zeroBurst, ColdStartMS: ms(ready.Sub(start)), PeakQueue: peak, Samples: samples, MaxNumSeqs: b.cfg.maxNumSeqs}
	var ttfts, holds []time.Duration
	for _, r := range recs {
		if !r.ok {
			res.Lost++
			res.Why = append(res.Why, r.why)
			continue
		}
		ttfts = append(ttfts, r.ttft)
		holds = append(holds, r.held)
	}
	if len(ttfts) > 0 {
		res.FirstTokenMS = ms(benchchat.Quantile(ttfts, 0))
		res.TTFTP50MS, res.TTFTP99MS = ms(benchchat.Quantile(ttfts, 0.5)), ms(benchchat.Quantile(ttfts, 0.99))
		res.HoldP50MS = ms(benchchat.Quantile(holds, 0.5))
	}
	if st, err := b.status(model); err == nil {
		for _, e := range st.GetEvents() {
			res.Decisions = append(res.Decisions, fmt.Sprintf("%d→%d %s", e.GetFrom(), e.GetTo(), e.GetReason()))
		}
	}
	b.report.Zero = &res
	fmt.Printf("| burst | lost | cold start (burst → READY) | first token | TTFT p50 | TTFT p99 | engine queue peak, first 10 s (max-num-seqs) |\n|---|---|---|---|---|---|---|\n")
	fmt.Printf("| %d | %d | %.0f ms | %.0f ms | %.0f ms | %.0f ms | %.0f (%d), %d samples |\n", res.Burst, res.Lost, res.ColdStartMS,
		res.FirstTokenMS, res.TTFTP50MS, res.TTFTP99MS, res.PeakQueue, res.MaxNumSeqs, res.Samples)
	return b.c.DeleteModel(model)
}

// capacity is one replica's throughput in requests per second: a closed
// loop of twice its batch on a model held at one replica.
func (b *bench) capacity(ctx context.Context) (float64, error) {
	if b.cfg.capacityRPS > 0 {
		return b.cfg.capacityRPS, nil
	}
	const model = "cap"
	if err := b.c.ApplyModel(model, b.spec(model, 1, "{min: 1, max: 1, target_waiting: 2}")); err != nil {
		return 0, err
	}
	if err := b.waitReady(ctx, model, 1); err != nil {
		return 0, err
	}
	l := b.loader(model)
	l.closedLoop(ctx, 2*b.cfg.maxNumSeqs, b.cfg.capacityTime)
	warm := time.Now().Add(-b.cfg.capacityTime * 9 / 10)
	n := 0
	for _, r := range l.take() {
		if r.ok && r.done.After(warm) {
			n++
		}
	}
	rps := float64(n) / (b.cfg.capacityTime.Seconds() * 0.9)
	fmt.Printf("\none replica's capacity: %.2f requests per second (closed loop of %d for %v)\n", rps, 2*b.cfg.maxNumSeqs, b.cfg.capacityTime)
	b.report.CapacityRPS = rps
	return rps, b.c.DeleteModel(model)
}

func (b *bench) waitReady(ctx context.Context, model string, n uint32) error {
	return waitFor(ctx, 10*time.Minute, fmt.Sprintf("%d ready replicas of %s", n, model), func() bool {
		st, err := b.status(model)
		return err == nil && st.GetReady() >= n
	})
}

// tracker samples a model's count and ready replicas every second.
type tracker struct {
	mu      sync.Mutex
	samples []countSample
}

type countSample struct {
	At      time.Time `json:"at"`
	Desired uint32    `json:"desired"`
	Ready   uint32    `json:"ready"`
}

func (b *bench) track(ctx context.Context, model string) (*tracker, func()) {
	t := &tracker{}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			if st, err := b.status(model); err == nil {
				t.mu.Lock()
				t.samples = append(t.samples, countSample{At: time.Now(), Desired: st.GetDesired(), Ready: st.GetReady()})
				t.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	return t, func() { cancel(); wg.Wait() }
}

// step is the load step: 1 × one replica's capacity, 6 ×, then 0.3 ×.
func (b *bench) step(ctx context.Context) error {
	capRPS, err := b.capacity(ctx)
	if err != nil {
		return err
	}
	const model = "step"
	spec := b.spec(model, 1, fmt.Sprintf("{min: 1, max: %d, target_waiting: 2, ttft_p90_slo: %s, scale_down_after: %s, cooldown: 15s}",
		b.cfg.gpus, b.cfg.ttftSLO, b.cfg.stepDownFor))
	if err := b.c.ApplyModel(model, spec); err != nil {
		return err
	}
	if err := b.waitReady(ctx, model, 1); err != nil {
		return err
	}
	fmt.Printf("\nphase step: %.2f req/s (1 ×) for %v, %.2f (6 ×) for %v, %.2f (0.3 ×) for %v\n", capRPS, b.cfg.stepLow,
		6*capRPS, b.cfg.stepHigh, 0.3*capRPS, b.cfg.stepDownFor+b.cfg.stepTail)
	l := b.loader(model)
	tr, stop := b.track(ctx, model)
	start := time.Now()
	stepAt, dropAt := start.Add(b.cfg.stepLow), start.Add(b.cfg.stepLow+b.cfg.stepHigh)
	l.openLoop(ctx, b.cfg.seed, []segment{{capRPS, b.cfg.stepLow}, {6 * capRPS, b.cfg.stepHigh}, {0.3 * capRPS, b.cfg.stepDownFor + b.cfg.stepTail}})
	stop()
	recs := l.take()
	res := stepResult{CapacityRPS: capRPS, SLOMS: ms(b.cfg.ttftSLO), Samples: tr.samples}
	// TTFT p90 by 10 s window of sending; back under the SLO is the first
	// window after the step from which every later window of the high
	// load is under it.
	const w = 10 * time.Second
	n := int(math.Ceil(time.Since(start).Seconds() / w.Seconds()))
	windows := make([][]time.Duration, n)
	for _, r := range recs {
		if !r.ok {
			res.Failed++
			if r.sent.After(dropAt) {
				res.FailedAfterDrop++
			}
			res.Why = append(res.Why, r.why)
			continue
		}
		if i := int(r.sent.Sub(start) / w); i >= 0 && i < n {
			windows[i] = append(windows[i], r.ttft)
		}
	}
	res.Requests = len(recs)
	for _, ws := range windows {
		res.TTFTP90ByWindowMS = append(res.TTFTP90ByWindowMS, ms(benchchat.Quantile(ws, 0.9)))
	}
	first, last := int(stepAt.Sub(start)/w), int(dropAt.Sub(start)/w)
	res.BackUnderSLOAfterS = -1
	for i := last - 1; i >= first; i-- {
		if res.TTFTP90ByWindowMS[i] > res.SLOMS {
			if i+1 < last {
				res.BackUnderSLOAfterS = float64(i+1-first) * w.Seconds()
			}
			break
		}
		if i == first {
			res.BackUnderSLOAfterS = 0
		}
	}
	for _, s := range tr.samples {
		res.PeakReplicas = max(res.PeakReplicas, s.Desired)
		if s.At.After(dropAt) && s.Desired == 1 && res.BackToMinAfterS == 0 {
			res.BackToMinAfterS = s.At.Sub(dropAt).Seconds()
		}
	}
	res.Steps = b.leaderMetric("llmgw_control_autoscale_steps_total", testkit.Labels{"model": model, "direction": "up"}) +
		b.leaderMetric("llmgw_control_autoscale_steps_total", testkit.Labels{"model": model, "direction": "down"})
	b.report.Step = &res
	fmt.Printf("| requests | failed | failed after the drop | peak replicas | TTFT p90 back under %v after the step | back to min after the drop (scale_down_after %v) | steps |\n|---|---|---|---|---|---|---|\n",
		b.cfg.ttftSLO, b.cfg.stepDownFor)
	fmt.Printf("| %d | %d | %d | %d | %.0f s | %.0f s | %.0f |\n", res.Requests, res.Failed, res.FailedAfterDrop, res.PeakReplicas,
		res.BackUnderSLOAfterS, res.BackToMinAfterS, res.Steps)
	fmt.Printf("TTFT p90 per 10 s (ms): %v\n", res.TTFTP90ByWindowMS)
	return b.c.DeleteModel(model)
}

// flapPhase is a stationary load near a threshold: the count must not
// move more than once.
func (b *bench) flapPhase(ctx context.Context) error {
	capRPS, err := b.capacity(ctx)
	if err != nil {
		return err
	}
	const model = "flap"
	// It starts at the count the load needs (ceil of it): the one step
	// allowed is the one a near-threshold queue may take.
	start := int(math.Ceil(b.cfg.flapLoad))
	spec := b.spec(model, start, fmt.Sprintf("{min: 1, max: %d, target_waiting: 2, scale_down_after: 2m, cooldown: 30s}", b.cfg.gpus))
	if err := b.c.ApplyModel(model, spec); err != nil {
		return err
	}
	if err := b.waitReady(ctx, model, uint32(start)); err != nil {
		return err
	}
	rate := b.cfg.flapLoad * capRPS
	fmt.Printf("\nphase flap: %.2f req/s (%.1f × one replica) for %v\n", rate, b.cfg.flapLoad, b.cfg.flap)
	l := b.loader(model)
	tr, stop := b.track(ctx, model)
	before := b.leaderMetric("llmgw_control_autoscale_steps_total", testkit.Labels{"model": model, "direction": "up"}) +
		b.leaderMetric("llmgw_control_autoscale_steps_total", testkit.Labels{"model": model, "direction": "down"})
	l.openLoop(ctx, b.cfg.seed+1, []segment{{rate, b.cfg.flap}})
	stop()
	after := b.leaderMetric("llmgw_control_autoscale_steps_total", testkit.Labels{"model": model, "direction": "up"}) +
		b.leaderMetric("llmgw_control_autoscale_steps_total", testkit.Labels{"model": model, "direction": "down"})
	res := flapResult{RPS: rate, Load: b.cfg.flapLoad, Minutes: b.cfg.flap.Minutes(), Actions: after - before}
	counts := map[uint32]int{}
	for _, s := range tr.samples {
		counts[s.Desired]++
	}
	for c := range counts {
		res.Counts = append(res.Counts, c)
	}
	sort.Slice(res.Counts, func(i, j int) bool { return res.Counts[i] < res.Counts[j] })
	for _, r := range l.take() {
		if !r.ok {
			res.Failed++
		}
	}
	b.report.Flap = &res
	fmt.Printf("| load | minutes | scale actions | counts seen | failed |\n|---|---|---|---|---|\n| %.2f req/s | %.0f | %.0f | %v | %d |\n",
		res.RPS, res.Minutes, res.Actions, res.Counts, res.Failed)
	return b.c.DeleteModel(model)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// share is the sharing phase: models A (sleeps, priority 0, idle) and B
// (priority 1) with a GPU each and one spare, the rest of the GPUs held by
// a pinned idle model. A burst on B takes the spare, then A's GPU (A goes
// to sleep), never the pinned model's; once the burst is over and B is
// back to one replica, A's next request wakes it.
func (b *bench) share(ctx context.Context) error {
	if b.cfg.gpus < 4 {
		return fmt.Errorf("--gpus %d: the sharing phase needs at least 4 (a pinned model holds all but 3)", b.cfg.gpus)
	}
	pinnedN := b.cfg.gpus - 3
	specs := map[string]string{
		"pin": b.spec("pin", pinnedN, fmt.Sprintf("{min: %d, max: %d, target_waiting: 2}", pinnedN, pinnedN)) + "pinned: true\n",
		"a":   b.spec("a", 1, "{min: 0, max: 1, target_waiting: 2, sleep: true, scale_down_after: 30s, cooldown: 5s}"),
		"b":   b.spec("b", 1, "{min: 1, max: 3, target_waiting: 2, scale_down_after: 30s, cooldown: 10s}") + "priority: 1\n",
	}
	for _, name := range []string{"pin", "a", "b"} {
		if err := b.c.ApplyModel(name, specs[name]); err != nil {
			return err
		}
	}
	for name, n := range map[string]uint32{"pin": uint32(pinnedN), "a": 1, "b": 1} {
		if err := b.waitReady(ctx, name, n); err != nil {
			return err
		}
	}
	capRPS, err := b.capacity(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("\nphase share: %d GPUs; pin holds %d (pinned), a 1 (sleeps), b 1 (priority 1); a burst on b of %.2f req/s (%.1f ×) for %v\n",
		b.cfg.gpus, pinnedN, b.cfg.shareLoad*capRPS, b.cfg.shareLoad, b.cfg.shareBurst)
	res := shareResult{}
	trB, stopB := b.track(ctx, "b")
	trPin, stopPin := b.track(ctx, "pin")
	var aSlept bool
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	var wg sync.WaitGroup
	wg.Go(func() {
		for watchCtx.Err() == nil {
			if st, err := b.status("a"); err == nil && st.GetSleeping() > 0 {
				aSlept = true
			}
			time.Sleep(500 * time.Millisecond)
		}
	})
	l := b.loader("b")
	l.openLoop(ctx, b.cfg.seed+2, []segment{{b.cfg.shareLoad * capRPS, b.cfg.shareBurst}})
	for _, r := range l.take() {
		res.BRequests++
		if !r.ok {
			res.BFailed++
		}
	}
	// B back to one replica, and A's GPU free again: the replicas B gave
	// up drained and gone (status counts a draining replica as not placed,
	// while it still holds its GPU).
	if err := waitFor(ctx, 5*time.Minute, "b back to 1 replica, the others drained", func() bool {
		st, err := b.status("b")
		if err != nil || st.GetDesired() != 1 || st.GetPlaced() != 1 {
			return false
		}
		n, err := b.replicaCount("b")
		return err == nil && n == 1
	}); err != nil {
		return err
	}
	stopWatch()
	wg.Wait()
	stopB()
	stopPin()
	for _, s := range trB.samples {
		res.BPeak = max(res.BPeak, s.Ready)
	}
	res.PinMin = math.MaxUint32
	for _, s := range trPin.samples {
		res.PinMin = min(res.PinMin, s.Ready)
	}
	res.PinCount, res.ASlept = uint32(pinnedN), aSlept
	if err := waitFor(ctx, 3*time.Minute, "a at 0, asleep", func() bool {
		st, err := b.status("a")
		return err == nil && st.GetDesired() == 0 && st.GetSleeping() == 1
	}); err != nil {
		return err
	}
	// A's next request wakes it.
	la := b.loader("a")
	r := la.send(ctx)
	res.AWakeOK, res.AFirstTokenMS = r.ok, ms(r.ttft)
	res.AWakeMS = ms(b.loadTimes().Wake)
	b.report.Share = &res
	fmt.Printf("| b requests | b failed | b peak ready | a put to sleep | pinned ready (min of %d) | a's first token after the burst | a's simulated wake |\n|---|---|---|---|---|---|---|\n", res.PinCount)
	fmt.Printf("| %d | %d | %d | %v | %d | %.0f ms (ok %v) | %.0f ms |\n", res.BRequests, res.BFailed, res.BPeak, res.ASlept, res.PinMin,
		res.AFirstTokenMS, res.AWakeOK, res.AWakeMS)
	for _, m := range []string{"a", "b", "pin"} {
		if err := b.c.DeleteModel(m); err != nil {
			return err
		}
	}
	return nil
}

// loadTimes is what the simulator prices a start, a sleep and a wake of
// the bench's model at on its GPU profile (sim.Config.LoadTimes).
func (b *bench) loadTimes() sim.LoadTimes {
	cfg := sim.DefaultConfig()
	cfg.Model, cfg.GPU = b.cfg.modelID, b.cfg.gpu
	cfg.Derive()
	return cfg.LoadTimes()
}
