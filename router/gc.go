package router

import (
	"context"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"time"
)

// gcTuner keeps the garbage collector from running many times a second
// on the router's small heap (--gc-min-heap). Go collects when the heap
// has grown by GOGC percent over what the last collection left live, and
// never below 4 MiB × GOGC/100: a router whose live heap is a few MiB,
// allocating some KiB per request, collects dozens of times a second under
// load, each time stopping the world twice. A floor makes that a few times
// a second; too high a floor costs the latency tail instead (64 MiB added
// 0.6–1.5 ms to a closed loop's p99 against 16 MiB, the default, at the
// same throughput: docs/benchmarks.md, issue 15, "The GC floor against
// the tail"). The tuner raises GOGC while the live heap is small, so the
// next collection comes at about minHeap, and gives GOGC back as the live
// heap grows (a large KV index): the heap stays within
// max(minHeap, live × (1 + GOGC/100)), a floor under the heap, never a
// multiplier on a large one.
//
// GOGC is the process's own setting, read from the environment as Go
// reads it (not from the runtime, which another tuner in the same process,
// a test's, may have moved), the floor of what the tuner sets and what it
// puts back when it stops (GOGC=off leaves the collector alone);
// GOMEMLIMIT, when set, still bounds the heap as Go does.
type gcTuner struct {
	minHeap uint64
	every   time.Duration
	// base is the process's GOGC (-1: off); live reads the heap the last
	// collection left live; set sets GOGC (debug.SetGCPercent).
	base int
	live func() uint64
	set  func(int) int
}

func newGCTuner(minHeap int64) *gcTuner {
	return &gcTuner{minHeap: uint64(minHeap), every: time.Second, base: envGOGC(os.Getenv("GOGC")),
		live: liveHeap, set: debug.SetGCPercent}
}

// envGOGC is the GOGC that the environment's value v gives the process:
// 100 unset or unreadable, -1 for off.
func envGOGC(v string) int {
	if v == "off" {
		return -1
	}
	if p, err := strconv.Atoi(v); err == nil && p >= 0 {
		return p
	}
	return 100
}

// goHeapMinimum is Go's smallest heap goal at GOGC=100; it scales with
// GOGC.
const goHeapMinimum = 4 << 20

// percent is the GOGC that puts the next collection at about minHeap over
// a live heap of live bytes, never below base: the smaller of what the
// live heap needs to grow to minHeap and what moves Go's own minimum
// there.
func (t *gcTuner) percent(base int, live uint64) int {
	p := int(t.minHeap * 100 / goHeapMinimum)
	if live > 0 {
		p = min(p, int(t.minHeap*100/live)-100)
	}
	return max(p, base)
}

// run tunes GOGC every t.every until ctx is done, then puts the
// process's own value back.
func (t *gcTuner) run(ctx context.Context) {
	base := t.base
	if base < 0 || t.minHeap == 0 {
		return // GOGC=off, or the tuner is off: Go's own pacing
	}
	cur := base
	tick := time.NewTicker(t.every)
	defer tick.Stop()
	defer t.set(base)
	for {
		// Only a move of more than a quarter is made: each call recomputes
		// the pacer's goal, and small moves buy nothing.
		if p := t.percent(base, t.live()); p*4 > cur*5 || p*5 < cur*4 {
			t.set(p)
			cur = p
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// liveHeap is the heap the last collection left live, in bytes.
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
