package sim

import (
	"container/list"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/llmgw/llmgw/vllm"
)

// Clock is the engine's time: Now for latencies reported in metrics,
// Sleep for simulated work. Tests inject one to hold a request at a chosen
// step; Sleep must return early with ctx's error when ctx ends.
type Clock interface {
	Now() time.Time
	Sleep(ctx context.Context, d time.Duration) error
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// errNoRoom is returned by tryReset while sequences hold cached blocks.
var errNoRoom = errors.New("Failed to reset prefix cache because some blocks are not freed yet") //nolint:staticcheck // ST1005: vLLM's wording, verbatim

// engine is the scheduler: at most maxSeqs sequences run, each holding its
// KV blocks in the cache; the rest wait in arrival order. A request is
// admitted when it is at the head of the queue, a slot is free and its
// blocks fit — so, as in vLLM's FCFS scheduler, a large request at the
// head holds back smaller ones behind it.
//
// The engine runs no goroutine of its own: each request's handler drives
// its own sequence, and admission happens under the mutex whenever a
// request arrives or a sequence finishes.
//
// With GPU timing (gpu set) the engine is stepped instead (sched.go): one
// goroutine, runSteps, takes every step for the whole batch, and run and
// wait hold the sequences.
type engine struct {
	mu        sync.Mutex
	maxSeqs   int
	blockSize int
	cache     *prefixCache
	running   int
	waiting   list.List // of *waiter, arrival order

	gpu         *gpuModel  // nil: simple timing
	api         *apiServer // with gpu: the front end's per-request time
	maxBatched  int
	longPrefill int
	chunked     bool
	run         []*gseq // admission order
	wait        []*gseq // head first
	// byPriority is vLLM's priority policy: wait is kept in (priority,
	// arrival) order and the lowest priority is preempted first.
	byPriority  bool
	arrivals    uint64
	wake        chan struct{}
	preemptions int
	// deadline is when the last step's time is up, on the engine's clock.
	deadline time.Time
	// onStep, when set (tests), is told of every step before it is slept.
	onStep func(items []stepItem, d time.Duration)

	// Sleep mode (sleep.go). pause is whether the scheduler runs; a
	// request that arrives while it does not is held — queued, marked
	// held, not admitted — until it resumes. live are the simple engine's
	// admitted sequences, which an abort releases. drained, when set, is
	// closed once nothing but held requests is left (a sleep in mode
	// wait waits for it).
	pause   pauseState
	live    map[*sequence]struct{}
	drained chan struct{}
}

type waiter struct {
	hashes    []vllm.BlockHash
	promptLen int
	total     int // blocks needed for prompt and completion
	admitted  chan struct{}
	seq       *sequence // set, under mu, when admitted
	// held is set for a request that arrived while the engine was paused:
	// it is not scheduled until the engine resumes. onAbort tells its
	// handler the engine aborted it.
	held    bool
	onAbort func()
}

// sequence is an admitted request's hold on the engine: a running slot and
// its blocks. It is released exactly once.
type sequence struct {
	e *engine
	a *allocation
	// CachedTokens is how many prompt tokens the cache supplied.
	CachedTokens int
	released     bool
	onAbort      func()
}

func newEngine(cfg *Config, obs CacheObserver) *engine {
	e := &engine{
		maxSeqs:     cfg.MaxNumSeqs,
		blockSize:   cfg.BlockSize,
		cache:       newPrefixCache(cfg.NumGPUBlocks, cfg.EnablePrefixCaching, obs).withCPUTier(cfg.numCPUBlocks()),
		maxBatched:  cfg.MaxNumBatchedTokens,
		longPrefill: cfg.LongPrefillTokenThreshold,
		chunked:     cfg.EnableChunkedPrefill,
		byPriority:  cfg.SchedulingPolicy == "priority",
		wake:        make(chan struct{}, 1),
		live:        make(map[*sequence]struct{}),
	}
	if cfg.TimingMode() == TimingGPU {
		e.gpu, _ = cfg.gpuModel() // valid: checked by Validate
		e.api = newAPIServer(e.gpu.cal, uint64(cfg.Seed))
	}
	return e
}

func (e *engine) stepped(items []stepItem, d time.Duration) {
	if e.onStep != nil {
		e.onStep(items, d)
	}
}

// admit waits until the request runs, or ctx ends (a client that goes
// away leaves the queue). hashes are the prompt's full-block hashes and
// maxTokens its completion budget. onAbort, if set, is called (under the
// engine's lock: it must not call back) when the engine aborts the request,
// waiting or admitted; the caller's ctx should then end.
func (e *engine) admit(ctx context.Context, onAbort func(), hashes []vllm.BlockHash, promptLen, maxTokens int) (*sequence, error) {
	w := &waiter{
		hashes:    hashes,
		promptLen: promptLen,
		total:     (promptLen + maxTokens + e.blockSize - 1) / e.blockSize,
		admitted:  make(chan struct{}),
		onAbort:   onAbort,
	}
	e.mu.Lock()
	w.held = e.pause != unpaused
	elem := e.waiting.PushBack(w)
	e.schedule()
	e.mu.Unlock()
	select {
	case <-w.admitted:
		return w.seq, nil
	case <-ctx.Done():
		e.mu.Lock()
		defer e.mu.Unlock()
		if w.seq != nil {
			// Admitted as the client left: hand the slot back.
			e.releaseLocked(w.seq)
			return nil, ctx.Err()
		}
		e.waiting.Remove(elem) // a no-op if an abort took it out already
		e.schedule()           // the head may have changed
		e.signalDrainedLocked()
		return nil, ctx.Err()
	}
}

// schedule admits waiters from the head while they fit; nothing while the
// engine is paused, and no held request. Callers hold mu.
func (e *engine) schedule() {
	if e.pause == pausedAll {
		return
	}
	for e.running < e.maxSeqs && e.waiting.Len() > 0 {
		w := e.waiting.Front().Value.(*waiter)
		if w.held {
			return // held ones queue behind every other
		}
		hits := e.cache.hits(w.hashes, w.promptLen, e.blockSize)
		a, ok := e.cache.allocate(w.hashes, hits, w.total)
		if !ok {
			return
		}
		// Blocks the CPU tier holds are loaded (at no cost in simple
		// timing) rather than recomputed.
		loaded := e.cache.offloadHits(w.hashes, hits, w.promptLen, e.blockSize)
		e.waiting.Remove(e.waiting.Front())
		e.running++
		w.seq = &sequence{e: e, a: a, CachedTokens: (hits + loaded) * e.blockSize, onAbort: w.onAbort}
		e.live[w.seq] = struct{}{}
		close(w.admitted)
	}
}

// commit caches the sequence's full blocks given the hashes of all its
// tokens so far.
func (s *sequence) commit(hashes []vllm.BlockHash, tokens []int) {
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	if !s.released {
		s.e.cache.commit(s.a, hashes, tokens, s.e.blockSize)
	}
}

// release frees the slot and blocks and admits whoever now fits.
func (s *sequence) release() {
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	s.e.releaseLocked(s)
}

func (e *engine) releaseLocked(s *sequence) {
	if s.released {
		return
	}
	s.released = true
	e.cache.release(s.a)
	e.running--
	delete(e.live, s)
	e.schedule()
	e.signalDrainedLocked()
}

// engineStats is a consistent reading for metrics.
type engineStats struct {
	Running, Waiting int
	KVUsage          float64
	Preemptions      int
}

func (e *engine) stats() engineStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return engineStats{Running: e.running + len(e.run), Waiting: e.waiting.Len() + len(e.wait),
		KVUsage: e.cache.usage(), Preemptions: e.preemptions}
}

// resetPrefixCache clears the cache unless sequences are using it; with
// external, the CPU tier as well (prefixCache.reset).
func (e *engine) resetPrefixCache(external bool) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.cache.reset(external) {
		return errNoRoom
	}
	return nil
}
