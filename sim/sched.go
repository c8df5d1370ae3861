package sim

import (
	"context"
	"slices"
	"time"

	"github.com/llmgw/llmgw/vllm"
)

// The stepped engine (--sim-timing gpu, design §8): one goroutine takes
// engine steps as vLLM's V1 scheduler does. Each step serves every running
// sequence's next token — the rest of its prefill, in chunks, or one decode
// token — then admits waiting sequences in arrival order while the token
// budget (max_num_batched_tokens) and max_num_seqs allow; a sequence that
// cannot get the blocks for its next tokens preempts the most recently
// admitted running one, whose blocks are freed and whose tokens are
// recomputed when it runs again. The step costs what the roofline
// (gpu.go) says, and the tokens it made leave at its end.

// seqState is where a stepped sequence is.
type seqState int

const (
	seqWaiting seqState = iota
	seqRunning
	seqFinished
	seqAborted
)

// gseq is one request in the stepped engine. Fields are guarded by the
// engine's mutex.
type gseq struct {
	// hashes are the prompt's full-block hashes; allHashes and all those of
	// prompt and completion (the completion is known up front: the
	// simulator's text is deterministic), cached when the sequence ends.
	hashes    []vllm.BlockHash
	allHashes []vllm.BlockHash
	all       []int
	promptLen int
	maxTokens int
	loraName  string
	loraID    int

	state seqState
	alloc *allocation
	// blocks is how many physical blocks the sequence holds.
	blocks int
	// computed is how many tokens have their KV computed; generated how
	// many output tokens have been sampled.
	computed  int
	generated int
	// cached is the prompt tokens the cache supplied at the first
	// scheduling, as vLLM reports num_cached_tokens; -1 until then.
	cached      int
	scheduledAt time.Time
	// notify is signalled (without blocking) at the end of every step that
	// produced a token for the sequence, or when it ends.
	notify chan struct{}
	// held is set for a request that arrived while the engine was paused
	// (sleep.go): it is not admitted until the engine resumes. onAbort
	// tells its handler the engine aborted it.
	held    bool
	onAbort func()
	// priority is the request's (lower first, under the priority policy)
	// and arrival its place in arrival order: the queue's order.
	priority int
	arrival  uint64
}

// before reports whether s goes ahead of o in the priority policy's queue
// (vLLM's PriorityRequestQueue: priority, then arrival).
func (s *gseq) before(o *gseq) bool {
	return s.priority < o.priority || (s.priority == o.priority && s.arrival < o.arrival)
}

// numTokens is what the sequence knows: prompt and sampled tokens.
func (s *gseq) numTokens() int { return s.promptLen + s.generated }

// stepItem is one sequence's share of a step.
type stepItem struct {
	seq       *gseq
	newTokens int
	// loaded is how many tokens' KV the step copies in from the CPU tier
	// before its forward pass (a prefix the GPU cache lost).
	loaded int
}

// submit queues a request in the stepped engine and wakes the step loop.
// onAbort, if set, is called (under the engine's lock: it must not call
// back) when the engine aborts the request.
func (e *engine) submit(onAbort func(), hashes, allHashes []vllm.BlockHash, all []int, promptLen, maxTokens int, loraName string, loraID, priority int) *gseq {
	s := &gseq{hashes: hashes, allHashes: allHashes, all: all, promptLen: promptLen, maxTokens: maxTokens,
		loraName: loraName, loraID: loraID, cached: -1, notify: make(chan struct{}, 1), onAbort: onAbort, priority: priority}
	e.mu.Lock()
	s.held = e.pause != unpaused
	e.arrivals++
	s.arrival = e.arrivals
	e.enqueueLocked(s)
	e.mu.Unlock()
	e.kick()
	return s
}

// enqueueLocked puts s in the waiting queue: last under FCFS, in
// (priority, arrival) order under the priority policy.
func (e *engine) enqueueLocked(s *gseq) {
	if !e.byPriority {
		e.wait = append(e.wait, s)
		return
	}
	i, _ := slices.BinarySearchFunc(e.wait, s, func(x, t *gseq) int {
		if x.before(t) {
			return -1
		}
		return 1
	})
	e.wait = slices.Insert(e.wait, i, s)
}

// kick wakes the step loop if it is idle.
func (e *engine) kick() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// progress is how many tokens s has produced and where it is: finished,
// aborted (by the engine, as a handler that still asks sees it: its own
// abort comes only once it has stopped asking), or neither.
func (e *engine) progress(s *gseq) (produced, cached int, scheduledAt time.Time, state seqState) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return s.generated, max(s.cached, 0), s.scheduledAt, s.state
}

// abort takes s out of the engine (a client that went away); a finished
// sequence is left alone.
func (e *engine) abort(s *gseq) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch s.state {
	case seqWaiting:
		e.wait = slices.DeleteFunc(e.wait, func(x *gseq) bool { return x == s })
	case seqRunning:
		e.run = slices.DeleteFunc(e.run, func(x *gseq) bool { return x == s })
		e.freeLocked(s)
	default:
		return
	}
	s.state = seqAborted
	e.signalDrainedLocked()
	e.kick()
}

func (e *engine) freeLocked(s *gseq) {
	if s.alloc != nil {
		e.cache.release(s.alloc)
		s.alloc = nil
	}
	s.blocks = 0
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// scheduleStep plans one step under e.mu: running sequences first, in order,
// then waiting ones, as vllm/v1/core/sched/scheduler.py's schedule().
// Nothing while the engine is paused; no held request.
func (e *engine) scheduleStep(now time.Time) []stepItem {
	if e.pause == pausedAll {
		return nil
	}
	budget := e.maxBatched
	var items []stepItem
	preempted := false
	for i := 0; i < len(e.run) && budget > 0; i++ {
		s := e.run[i]
		n := min(s.numTokens()-s.computed, budget)
		if e.longPrefill > 0 {
			n = min(n, e.longPrefill)
		}
		if n <= 0 {
			continue
		}
		for !e.cache.grow(s.alloc, ceilDiv(s.computed+n, e.blockSize)-s.blocks) {
			// Preempt the lowest-priority running sequence: under FCFS
			// the last admitted, under the priority policy the one last
			// in (priority, arrival) order; either may be s itself, or
			// one this step already scheduled, whose tokens go back.
			v := len(e.run) - 1
			if e.byPriority {
				for j, x := range e.run {
					if e.run[v].before(x) {
						v = j
					}
				}
			}
			victim := e.run[v]
			e.run = slices.Delete(e.run, v, v+1)
			if v < i {
				for k, it := range items {
					if it.seq == victim {
						budget += it.newTokens
						items = slices.Delete(items, k, k+1)
						break
					}
				}
				i--
			}
			e.preemptLocked(victim)
			preempted = true
			if victim == s {
				s = nil
				break
			}
		}
		if s == nil {
			break
		}
		s.blocks = ceilDiv(s.computed+n, e.blockSize)
		items = append(items, stepItem{seq: s, newTokens: n})
		budget -= n
	}
	// vLLM admits nothing in a step that had to preempt.
	for !preempted && len(e.wait) > 0 && len(e.run) < e.maxSeqs && budget > 0 {
		s := e.wait[0]
		if s.held {
			break // held ones queue behind every other
		}
		hits := e.cache.hits(s.hashes, s.promptLen, e.blockSize)
		// What the CPU tier holds past the GPU's hits is loaded, not
		// recomputed: vLLM's offloading connector reports it as external
		// tokens and copies it in before the request runs.
		loaded := e.cache.offloadHits(s.hashes, hits, s.promptLen, e.blockSize) * e.blockSize
		computed := hits*e.blockSize + loaded
		n := s.numTokens() - computed
		if !e.chunked && n > budget {
			break
		}
		n = min(n, budget)
		if e.longPrefill > 0 {
			n = min(n, e.longPrefill)
		}
		blocks := ceilDiv(computed+n, e.blockSize)
		a, ok := e.cache.allocate(s.hashes, hits, blocks)
		if !ok {
			break
		}
		a.loraName, a.loraID = s.loraName, s.loraID
		e.wait = e.wait[1:]
		s.alloc, s.blocks, s.computed, s.state = a, blocks, computed, seqRunning
		if s.cached < 0 {
			s.cached, s.scheduledAt = computed, now
		}
		e.run = append(e.run, s)
		items = append(items, stepItem{s, n, loaded})
		budget -= n
	}
	return items
}

// preemptLocked frees a running sequence's blocks and puts it at the head
// of the queue; it recomputes its tokens when admitted again (vLLM's
// preemption by recompute). Its cached blocks stay in the prefix cache, so
// the recompute may hit them.
func (e *engine) preemptLocked(s *gseq) {
	e.freeLocked(s)
	s.computed, s.state = 0, seqWaiting
	if e.byPriority {
		e.enqueueLocked(s)
	} else {
		e.wait = slices.Insert(e.wait, 0, s)
	}
	e.preemptions++
}

// work is the plan in the cost model's terms.
func work(items []stepItem) stepWork {
	w := stepWork{seqs: make([]seqWork, len(items))}
	for i, it := range items {
		s := it.seq
		w.seqs[i] = seqWork{newTokens: it.newTokens, context: s.computed, loaded: it.loaded,
			samples: s.computed+it.newTokens == s.numTokens()}
	}
	return w
}

// finish applies a step that has run: KV computed, tokens sampled, full
// prompt blocks cached, finished sequences freed. Sequences aborted during
// the step are skipped.
func (e *engine) finish(items []stepItem) {
	for _, it := range items {
		s := it.seq
		if s.state != seqRunning {
			continue
		}
		sampled := s.computed+it.newTokens == s.numTokens()
		s.computed += it.newTokens
		if full := min(s.computed, s.promptLen) / e.blockSize; full > 0 {
			e.cache.commit(s.alloc, s.hashes[:min(full, len(s.hashes))], s.all, e.blockSize)
		}
		if !sampled {
			continue
		}
		s.generated++
		if s.generated >= s.maxTokens {
			e.cache.commit(s.alloc, s.allHashes, s.all, e.blockSize)
			e.run = slices.DeleteFunc(e.run, func(x *gseq) bool { return x == s })
			e.freeLocked(s)
			s.state = seqFinished
		}
		select {
		case s.notify <- struct{}{}:
		default:
		}
	}
	e.signalDrainedLocked()
}

// step takes one engine step: plan, wait the step's time on the clock,
// apply. ran is false when nothing could be scheduled.
func (e *engine) step(ctx context.Context, clock Clock, slowdown func() float64) (ran bool, err error) {
	e.mu.Lock()
	items := e.scheduleStep(clock.Now())
	w := work(items)
	e.mu.Unlock()
	if len(items) == 0 {
		return false, nil
	}
	d := e.gpu.stepTime(w)
	if f := slowdown(); f > 0 {
		d = time.Duration(float64(d) * f)
	}
	e.stepped(items, d)
	// Back-to-back steps are timed from the previous step's deadline, not
	// from when the loop got round to it, so a timer's lateness on a busy
	// machine does not add up over a generation.
	now := clock.Now()
	start := now
	if lag := now.Sub(e.deadline); !e.deadline.IsZero() && lag > 0 && lag < maxCatchUp {
		start = e.deadline
	}
	e.deadline = start.Add(d)
	if err := clock.Sleep(ctx, e.deadline.Sub(now)); err != nil {
		return true, err
	}
	e.mu.Lock()
	e.finish(items)
	e.mu.Unlock()
	return true, nil
}

// maxCatchUp bounds how late a step may start and still be timed from the
// previous one's deadline.
const maxCatchUp = 100 * time.Millisecond

// runSteps is the step loop: it steps while there is work and waits for a
// request (or an abort) when there is none. It returns when ctx ends.
func (e *engine) runSteps(ctx context.Context, clock Clock, slowdown func() float64) {
	for {
		ran, err := e.step(ctx, clock, slowdown)
		if err != nil {
			return
		}
		if ran {
			continue
		}
		e.deadline = time.Time{} // idle: the next step starts when it is asked for
		select {
		case <-e.wake:
		case <-ctx.Done():
			return
		}
	}
}
