package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/llmgw/llmgw/scripts/internal/benchchat"
	"github.com/llmgw/llmgw/scripts/internal/benchproc"
)

// warmup is the start of a phase its throughput figures leave out (the
// queues filling, the engines' batches growing): a tenth of the phase, at
// most 10 s.
func warmup(d time.Duration) time.Duration { return min(10*time.Second, d/10) }

// bucket is the width per-minute figures are taken over: a minute, or the
// whole phase when it is shorter.
func bucket(d time.Duration) (time.Duration, int) {
	if d < time.Minute {
		return d, 1
	}
	return time.Minute, int(d / time.Minute)
}

// servedIn is the served requests and their output tokens that ended in
// [from, to), of the tenants named (all when none are).
func servedIn(recs []record, from, to time.Time, tenants ...string) (n int, tokens float64) {
	for _, r := range recs {
		if r.outcome != served || r.done.Before(from) || !r.done.Before(to) {
			continue
		}
		if len(tenants) > 0 && !slices.Contains(tenants, r.tenant) {
			continue
		}
		n++
		tokens += float64(r.out)
	}
	return n, tokens
}

// of is the records of one tenant.
func of(recs []record, tenant string) []record {
	var out []record
	for _, r := range recs {
		if r.tenant == tenant {
			out = append(out, r)
		}
	}
	return out
}

// tally sums a tenant's records by outcome, with its served TTFTs.
func tally(recs []record) tenantResult {
	var t tenantResult
	var ttfts []time.Duration
	var waits []float64
	t.Refused = map[string]int{}
	for _, r := range recs {
		t.Sent++
		switch r.outcome {
		case served:
			t.Served++
			t.OutTokens += r.out
			ttfts = append(ttfts, r.ttft)
			if r.queued {
				t.Queued++
				waits = append(waits, r.queueMS)
			}
		case refused:
			t.Refused[r.reason]++
		case lost:
			t.Lost++
		}
	}
	t.TTFTp50ms = ms(benchchat.Quantile(ttfts, 0.5))
	t.TTFTp90ms = ms(benchchat.Quantile(ttfts, 0.9))
	t.TTFTp99ms = ms(benchchat.Quantile(ttfts, 0.99))
	if len(waits) > 0 {
		slices.Sort(waits)
		t.QueueMSp99 = waits[min(len(waits)-1, int(math.Ceil(0.99*float64(len(waits))))-1)]
	}
	return t
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// finish accounts a phase's records: its lost requests, and served ones
// whose class is not their tenant's.
func (b *bench) finish(phase string, recs []record) {
	for _, r := range recs {
		if r.outcome == lost {
			b.report.Lost = append(b.report.Lost, lostRecord{Phase: phase, Tenant: r.tenant, Router: r.router + 1, Code: r.code, Why: r.why})
		}
		if r.outcome == served && b.cfg.flow && r.router < 2 && r.class != b.tenants[r.tenant].class {
			b.report.ClassMismatch[phase+" "+r.tenant+" as "+r.class]++
		}
	}
}

// withEngines runs fn while sampling the engines' running and waiting
// requests every 100 ms, and prints what it saw.
func (b *bench) withEngines(ctx context.Context, fn func()) (*engineFigures, error) {
	addrs, err := b.routable(b.c.Routers[0].Ops)
	if err != nil {
		return nil, err
	}
	e := &engineLoad{hc: b.client, addrs: addrs, interval: 100 * time.Millisecond}
	ectx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); e.Run(ectx) }()
	fn()
	stop()
	<-done
	f := e.figures()
	n := float64(max(1, f.Rounds))
	fmt.Printf("engines (sampled every 100 ms, %d rounds): running %.1f and waiting %.2f per engine on average; some engine had a request waiting in %.1f %% of rounds, one at most %.0f\n",
		f.Rounds, f.RunningSum/n/float64(len(addrs)), f.WaitingSum/n/float64(len(addrs)), 100*float64(f.QueuedRounds)/n, f.MaxWaiting)
	return &f, nil
}

// capacity is phase 0: a closed loop at 1.5 × the fleet's slots through
// routers 1 and 2.
func (b *bench) capacity(ctx context.Context) (*capacityResult, error) {
	d := b.cfg.capacityTime
	n := b.cfg.replicas * b.cfg.maxNumSeqs * 3 / 2
	fmt.Printf("phase 0, capacity: a closed loop of %d through routers 1 and 2 for %v\n", n, d)
	start := time.Now()
	eng, err := b.withEngines(ctx, func() { b.load.closedLoop(ctx, d, b.tenants["cap"], n) })
	if err != nil {
		return nil, err
	}
	recs := b.load.take()
	b.finish("capacity", recs)
	from, to := start.Add(warmup(d)), start.Add(d)
	served, tokens := servedIn(recs, from, to)
	secs := to.Sub(from).Seconds()
	c := &capacityResult{RPS: float64(served) / secs, OutTokensPerSec: tokens / secs, Concurrency: n, Cap: tally(recs), Engines: eng}
	if c.RPS == 0 {
		return nil, fmt.Errorf("capacity: nothing served (%d lost)", c.Cap.Lost)
	}
	b.report.Capacity = c
	fmt.Println("| concurrency | served req/s | output tok/s | TTFT p50 | TTFT p99 | lost |")
	fmt.Println("|---|---|---|---|---|---|")
	fmt.Printf("| %d | %.1f | %.0f | %.0f ms | %.0f ms | %d |\n\n", n, c.RPS, c.OutTokensPerSec, c.Cap.TTFTp50ms, c.Cap.TTFTp99ms, c.Cap.Lost)
	return c, nil
}

// alone is phase 1: B at 0.3 × capacity through routers 1 and 2.
func (b *bench) alone(ctx context.Context, capRPS float64) error {
	d, rate := b.cfg.alone, 0.3*capRPS
	fmt.Printf("phase 1, B alone: %.1f req/s through routers 1 and 2 for %v\n", rate, d)
	eng, err := b.withEngines(ctx, func() { b.load.openLoop(ctx, b.cfg.seed, d, []*tenant{b.tenants["b"]}, []float64{rate}) })
	if err != nil {
		return err
	}
	recs := b.load.take()
	b.finish("alone", recs)
	r := &aloneResult{RateRPS: rate, B: tally(recs), Engines: eng}
	b.report.Alone = r
	fmt.Println("| B | sent | served | refused | lost | TTFT p50 | TTFT p99 |")
	fmt.Println("|---|---|---|---|---|---|---|")
	fmt.Printf("| alone | %d | %d | %d | %d | %.0f ms | %.0f ms |\n\n", r.B.Sent, r.B.Served, r.B.refusedTotal(), r.B.Lost, r.B.TTFTp50ms, r.B.TTFTp99ms)
	return nil
}

// mixed is phase 2: B as alone, A batch at 3 × capacity through router
// 1 only, both flow routers' /metrics scraped for inversions.
func (b *bench) mixed(ctx context.Context, capRPS float64) error {
	d := b.cfg.mixed
	rb, ra := 0.3*capRPS, b.cfg.aLoad*capRPS
	fmt.Printf("phase 2, noisy neighbour: B %.1f req/s through routers 1 and 2, A (batch) %.1f req/s through router 1, for %v\n", rb, ra, d)
	a := *b.tenants["a"]
	a.routers = []int{0}
	var before [2][]sample
	sc := &scraper{hc: b.client, addrs: []string{b.c.Routers[0].Ops, b.c.Routers[1].Ops}, model: model, interval: b.cfg.scrapeEvery}
	if b.cfg.flow {
		for i := range before {
			var err error
			if before[i], err = scrape(ctx, b.client, b.c.Routers[i].Ops, "llmgw_router_flow_"); err != nil {
				return err
			}
		}
	}
	sctx, stopScrape := context.WithCancel(ctx)
	var scraping chan struct{}
	if b.cfg.flow {
		scraping = make(chan struct{})
		go func() { defer close(scraping); sc.Run(sctx) }()
	}
	start := time.Now()
	eng, err := b.withEngines(ctx, func() { b.load.openLoop(ctx, b.cfg.seed+1, d, []*tenant{b.tenants["b"], &a}, []float64{rb, ra}) })
	stopScrape()
	if scraping != nil {
		<-scraping
	}
	if err != nil {
		return err
	}
	recs := b.load.take()
	b.finish("mixed", recs)
	m := &mixedResult{BRateRPS: rb, ARateRPS: ra, B: tally(of(recs, "b")), A: tally(of(recs, "a")), Engines: eng}
	from, to := start.Add(warmup(d)), start.Add(d)
	_, tokens := servedIn(recs, from, to)
	m.FleetOutTokensPerSec = tokens / to.Sub(from).Seconds()
	m.FleetShare = share(m.FleetOutTokensPerSec, b.report.Capacity.OutTokensPerSec)
	if al := b.report.Alone; al != nil && al.B.TTFTp99ms > 0 {
		m.BTTFTRatio = m.B.TTFTp99ms / al.B.TTFTp99ms
	}
	w, n := bucket(d)
	var evs []event
	for _, r := range recs {
		if r.outcome == served {
			evs = append(evs, event{tenant: r.tenant, at: r.done, value: float64(r.out)})
		}
	}
	for _, mm := range perBucket(evs, []string{"a", "b"}, start, w, n) {
		m.AShareByMinute = append(m.AShareByMinute, share(mm["a"], mm["a"]+mm["b"]))
	}
	if b.cfg.flow {
		rounds, failed := sc.take()
		inv := countInversions(rounds, 0.1)
		m.Inversions = &inversionResult{Rounds: len(rounds), FailedRounds: failed, MaxGapMS: ms(inv.maxGap),
			BatchDispatched: inv.total, Strict: inv.strict, Conservative: inv.conservative}
		for i := range before {
			after, err := scrape(ctx, b.client, b.c.Routers[i].Ops, "llmgw_router_flow_")
			if err != nil {
				return err
			}
			delta := func(name string, match map[string]string) float64 {
				return sum(after, name, match) - sum(before[i], name, match)
			}
			m.Inversions.RoutersOwn += delta("llmgw_router_flow_inversions_total", map[string]string{"model": model})
			m.Inversions.RoutersBatchDispatched += delta("llmgw_router_flow_dispatched_total", map[string]string{"model": model, "class": "batch"})
			m.Inversions.RoutersDropped += delta("llmgw_router_flow_dropped_total", map[string]string{"model": model})
		}
	}
	b.report.Mixed = m
	fmt.Println("| tenant | sent | served | queued | refused | lost | TTFT p50 | TTFT p90 | TTFT p99 | queue p99 |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	for _, row := range []struct {
		name string
		t    tenantResult
	}{{"B alone", b.report.aloneB()}, {"B mixed", m.B}, {"A mixed", m.A}} {
		t := row.t
		fmt.Printf("| %s | %d | %d | %d | %d %v | %d | %.0f ms | %.0f ms | %.0f ms | %.0f ms |\n", row.name, t.Sent, t.Served, t.Queued,
			t.refusedTotal(), t.Refused, t.Lost, t.TTFTp50ms, t.TTFTp90ms, t.TTFTp99ms, t.QueueMSp99)
	}
	fmt.Printf("\nB TTFT p99 × %.2f of alone; fleet output %.0f tok/s = %.1f %% of capacity (%.0f); A's share of served tokens by minute:",
		m.BTTFTRatio, m.FleetOutTokensPerSec, 100*m.FleetShare, b.report.Capacity.OutTokensPerSec)
	for _, s := range m.AShareByMinute {
		fmt.Printf(" %.1f %%", 100*s)
	}
	fmt.Println()
	if inv := m.Inversions; inv != nil {
		fmt.Printf("inversions (scraped every %v, %d rounds, %d failed, longest gap %.0f ms): batch dispatched %.0f, while interactive waited > 100 ms %.0f at the interval's end (%.3f %%), %.0f at either end (%.3f %%); routers' own inversions_total %.0f of %.0f batch dispatches (%.3f %%); dropped %.0f\n",
			b.cfg.scrapeEvery, inv.Rounds, inv.FailedRounds, inv.MaxGapMS, inv.BatchDispatched, inv.Strict, 100*share(inv.Strict, inv.BatchDispatched),
			inv.Conservative, 100*share(inv.Conservative, inv.BatchDispatched), inv.RoutersOwn, inv.RoutersBatchDispatched,
			100*share(inv.RoutersOwn, inv.RoutersBatchDispatched), inv.RoutersDropped)
	}
	fmt.Println()
	return nil
}

// fairTenants is f0…f9.
func fairTenants() []string {
	out := make([]string, 10)
	for i := range out {
		out[i] = fmt.Sprintf("f%d", i)
	}
	return out
}

// fairRun drives f0…f9 at rates for the fairness phases and returns the
// records, the start, and each bucket's served tokens per tenant.
func (b *bench) fairRun(ctx context.Context, phase string, seed uint64, rates []float64) ([]record, time.Time, []map[string]float64) {
	names := fairTenants()
	ts := make([]*tenant, len(names))
	for i, n := range names {
		ts[i] = b.tenants[n]
	}
	start := time.Now()
	b.load.openLoop(ctx, seed, b.cfg.fair, ts, rates)
	recs := b.load.take()
	b.finish(phase, recs)
	var evs []event
	for _, r := range recs {
		if r.outcome == served {
			evs = append(evs, event{tenant: r.tenant, at: r.done, value: float64(r.out)})
		}
	}
	w, n := bucket(b.cfg.fair)
	return recs, start, perBucket(evs, names, start, w, n)
}

// fairEqual is phase 3: 10 equal tenants of one class at 2 × capacity.
func (b *bench) fairEqual(ctx context.Context, capRPS float64) error {
	rate := 2 * capRPS / 10
	fmt.Printf("phase 3, fairness: 10 standard tenants at %.1f req/s each (2 × capacity) through routers 1 and 2 for %v\n", rate, b.cfg.fair)
	rates := make([]float64, 10)
	for i := range rates {
		rates[i] = rate
	}
	recs, _, buckets := b.fairRun(ctx, "fair", b.cfg.seed+2, rates)
	f := &fairResult{RateRPS: rate}
	for _, m := range buckets {
		f.JainByMinute = append(f.JainByMinute, jain(values(m, fairTenants())))
	}
	f.Tenants = map[string]tenantResult{}
	for _, n := range fairTenants() {
		f.Tenants[n] = tally(of(recs, n))
	}
	b.report.Fair = f
	b.printFair(f.Tenants, buckets)
	fmt.Printf("Jain's index on served output tokens by minute:")
	for _, j := range f.JainByMinute {
		fmt.Printf(" %.4f", j)
	}
	fmt.Print("\n\n")
	return nil
}

// fairHeavy is phase 4: f0 at 10 × the others' rate, 2 × capacity in all.
func (b *bench) fairHeavy(ctx context.Context, capRPS float64) error {
	r := 2 * capRPS / 19
	fmt.Printf("phase 4, a heavy tenant: f0 at %.1f req/s, f1…f9 at %.1f each (2 × capacity), for %v\n", 10*r, r, b.cfg.fair)
	rates := make([]float64, 10)
	demand := map[string]float64{}
	for i, n := range fairTenants() {
		rates[i] = r
		if i == 0 {
			rates[i] = 10 * r
		}
		demand[n] = rates[i] * float64(b.cfg.maxTokens) // output tokens per second offered
	}
	recs, start, buckets := b.fairRun(ctx, "heavy", b.cfg.seed+3, rates)
	h := &heavyResult{HeavyRateRPS: 10 * r, OtherRateRPS: r, Tenants: map[string]tenantResult{}}
	for _, n := range fairTenants() {
		h.Tenants[n] = tally(of(recs, n))
	}
	// Over the phase less its warm-up: the served share against the
	// max-min fair share of what was served, demands as offered.
	from, to := start.Add(warmup(b.cfg.fair)), start.Add(b.cfg.fair)
	_, total := servedIn(recs, from, to)
	_, heavy := servedIn(recs, from, to, "f0")
	fair := fairShares(demand, total/to.Sub(from).Seconds())
	h.HeavyShare, h.HeavyFairShare = share(heavy, total), share(fair["f0"], total/to.Sub(from).Seconds())
	for _, m := range buckets {
		var all float64
		for _, v := range m {
			all += v
		}
		h.HeavyShareByMinute = append(h.HeavyShareByMinute, share(m["f0"], all))
	}
	b.report.Heavy = h
	b.printFair(h.Tenants, buckets)
	fmt.Printf("f0's share of served tokens %.1f %% (by minute:", 100*h.HeavyShare)
	for _, s := range h.HeavyShareByMinute {
		fmt.Printf(" %.1f %%", 100*s)
	}
	fmt.Printf("), its max-min fair share %.1f %%: × %.2f\n\n", 100*h.HeavyFairShare, share(h.HeavyShare, h.HeavyFairShare))
	return nil
}

func (b *bench) printFair(ts map[string]tenantResult, buckets []map[string]float64) {
	fmt.Print("| tenant | sent | served | refused | lost | TTFT p99 |")
	for m := range buckets {
		fmt.Printf(" tokens min %d |", m+1)
	}
	fmt.Print("\n|---|---|---|---|---|---|")
	for range buckets {
		fmt.Print("---|")
	}
	fmt.Println()
	for _, n := range fairTenants() {
		t := ts[n]
		fmt.Printf("| %s | %d | %d | %d %v | %d | %.0f ms |", n, t.Sent, t.Served, t.refusedTotal(), t.Refused, t.Lost, t.TTFTp99ms)
		for _, m := range buckets {
			fmt.Printf(" %.0f |", m[n])
		}
		fmt.Println()
	}
}

// cost is phase 5: 0.5 × capacity through router 1 (flow on) and router
// 3 (flow off) in turn, each slice drained before the CPU is read, so a
// router's CPU covers its own requests whole.
func (b *bench) cost(ctx context.Context, capRPS float64) error {
	rate := 0.5 * capRPS
	fmt.Printf("phase 5, cost: %.1f req/s through router 1 (flow on) and router 3 (flow off) in turn, %d slices of %v each\n",
		rate, b.cfg.costSlices, b.cfg.costSlice)
	c := &costResult{RateRPS: rate}
	rows := []*costRow{{Router: "r1", Flow: b.cfg.flow}, {Router: "r3", Flow: false}}
	// Each router's CPU at rest first: what it spends without requests
	// (its control streams, engine scrapes, flow control's own loops),
	// so a difference can be told per request or in the background.
	idle := []*benchproc.Proc{b.c.Routers[0], b.c.Routers[2]}
	var c0 [2]time.Duration
	for k, p := range idle {
		c0[k] = p.CPU()
	}
	t0 := time.Now()
	if !benchchat.SleepUntil(ctx, t0.Add(b.cfg.costIdle)) {
		return ctx.Err()
	}
	for k, p := range idle {
		rows[k].IdleCPUmsPerSec = 1e3 * (p.CPU() - c0[k]).Seconds() / time.Since(t0).Seconds()
	}
	for i := range 2 * b.cfg.costSlices {
		k := i % 2
		ri := []int{0, 2}[k]
		t := *b.tenants["cost"]
		t.routers = []int{ri}
		p := b.c.Routers[ri]
		c0, t0 := p.CPU(), time.Now()
		b.load.openLoop(ctx, b.cfg.seed+10+uint64(i), b.cfg.costSlice, []*tenant{&t}, []float64{rate})
		cpu, wall := p.CPU()-c0, time.Since(t0)
		recs := b.load.take()
		b.finish("cost", recs)
		tr := tally(recs)
		row := rows[k]
		row.Requests += tr.Served
		row.CPUSeconds += cpu.Seconds()
		row.WallSeconds += wall.Seconds()
		row.Lost += tr.Lost
		row.SliceCPUmsPer1000 = append(row.SliceCPUmsPer1000, 1e6*cpu.Seconds()/float64(max(1, tr.Served)))
		row.SliceNetCPUmsPer1000 = append(row.SliceNetCPUmsPer1000, 1e3*(1e3*cpu.Seconds()-row.IdleCPUmsPerSec*wall.Seconds())/float64(max(1, tr.Served)))
		row.TTFTp50ms = append(row.TTFTp50ms, tr.TTFTp50ms)
	}
	fmt.Println("| router | flow | requests | CPU s | CPU ms per 1000 requests (mean ± sd of slices) | slices | at rest, CPU ms/s | less the rest's | TTFT p50 by slice |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		r.MeanCPUmsPer1000, r.SDCPUmsPer1000 = meanSD(r.SliceCPUmsPer1000)
		r.MeanNetCPUmsPer1000, _ = meanSD(r.SliceNetCPUmsPer1000)
		fmt.Printf("| %s | %v | %d | %.2f | %.0f ± %.0f | %.0f | %.1f | %.0f | %.0f |\n", r.Router, r.Flow, r.Requests, r.CPUSeconds,
			r.MeanCPUmsPer1000, r.SDCPUmsPer1000, r.SliceCPUmsPer1000, r.IdleCPUmsPerSec, r.MeanNetCPUmsPer1000, r.TTFTp50ms)
	}
	c.Rows = []costRow{*rows[0], *rows[1]}
	b.report.Cost = c
	fmt.Println()
	return nil
}

// meanSD is the mean and the sample standard deviation of xs.
func meanSD(xs []float64) (float64, float64) {
	if len(xs) == 0 {
		return 0, 0
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	mean := s / float64(len(xs))
	if len(xs) < 2 {
		return mean, 0
	}
	var v float64
	for _, x := range xs {
		v += (x - mean) * (x - mean)
	}
	return mean, math.Sqrt(v / float64(len(xs)-1))
}
