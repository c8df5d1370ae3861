package sim

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/vllm"
)

// Sleep mode, as vLLM's (design §8 "Loading and sleeping"): POST
// /sleep?level=N&mode=M pauses the scheduler and, from level 1, drops the
// prefix cache and puts the executor to sleep — level 1 copies the weights
// to host memory, level 2 discards them; POST /wake_up[?tags=T] wakes the
// executor (all of it, or the tags named) and resumes the scheduler once
// nothing is left asleep; GET /is_sleeping says whether the engine sleeps at
// any level. Served only with VLLM_SERVER_DEV_MODE, as vLLM's dev routes
// (vllm/entrypoints/serve/dev/sleep/api_router.py); the engine core's side
// is vllm/v1/engine/core.py (pause_scheduler, sleep, wake_up, is_sleeping).
//
// The pause modes are the engine core's: abort aborts every request in the
// engine, which its client sees end with finish_reason "abort"; wait lets
// them finish first; keep (GPU timing only here) preempts the running ones,
// which recompute when the engine resumes. In every mode a request that
// arrives while the scheduler is paused is queued, not refused, and runs
// once the engine wakes. /health answers 200 throughout: vLLM's health
// check does not ask the engine core whether it sleeps.

// vllm:engine_sleep_state (vllm/v1/metrics/loggers.py), registered by every
// vLLM engine whether or not it has sleep mode: 1 under sleep_state
// "awake", "weights_offloaded" (level 1) or "discard_all" (level 2).
const (
	metricEngineSleepState = "vllm:engine_sleep_state"
	labelSleepState        = "sleep_state"
)

// errEngineAborted is the cause a request's context is cancelled with when
// the engine aborts it (a sleep in mode abort: vLLM's finish_requests with
// FINISHED_ABORTED). Its handler answers with what it has, finish_reason
// "abort".
var errEngineAborted = errors.New("sim: request aborted by the engine")

// pauseState is the scheduler's pause (vLLM's PauseState).
type pauseState int

const (
	unpaused pauseState = iota
	// pausedNew: requests in the engine run on; new ones are held.
	pausedNew
	// pausedAll: nothing is scheduled.
	pausedAll
)

// Pause modes of POST /sleep (vLLM's PauseMode).
const (
	pauseAbort = "abort"
	pauseWait  = "wait"
	pauseKeep  = "keep"
)

// pauseLocked pauses the scheduler in a mode: abort aborts every request
// not held, keep preempts the running ones (stepped engine only), wait
// leaves them to finish (waitDrained). Callers hold mu.
func (e *engine) pauseLocked(mode string) {
	switch mode {
	case pauseAbort:
		e.pause = pausedAll
		e.abortInFlightLocked()
	case pauseKeep:
		e.pause = pausedAll
		// The last admitted first, so that each goes back to the head in
		// admission order.
		for i := len(e.run) - 1; i >= 0; i-- {
			e.preemptLocked(e.run[i])
		}
		e.run = e.run[:0]
	default:
		if e.pause == unpaused {
			e.pause = pausedNew
		}
	}
	e.signalDrainedLocked()
}

// abortInFlightLocked aborts every request in the engine but the held ones:
// their blocks are freed at once and their handlers told.
func (e *engine) abortInFlightLocked() {
	for _, s := range e.run {
		e.freeLocked(s)
		e.abortedLocked(s)
	}
	e.run = e.run[:0]
	e.wait = slices.DeleteFunc(e.wait, func(s *gseq) bool {
		if s.held {
			return false
		}
		e.abortedLocked(s)
		return true
	})
	for seq := range e.live {
		e.releaseLocked(seq)
		if seq.onAbort != nil {
			seq.onAbort()
		}
	}
	for el := e.waiting.Front(); el != nil; {
		next := el.Next()
		if w := el.Value.(*waiter); !w.held {
			e.waiting.Remove(el)
			if w.onAbort != nil {
				w.onAbort()
			}
		}
		el = next
	}
	e.kick()
}

func (e *engine) abortedLocked(s *gseq) {
	s.state = seqAborted
	if s.onAbort != nil {
		s.onAbort()
	}
}

// drainedLocked is whether nothing but held requests is in the engine.
func (e *engine) drainedLocked() bool {
	if len(e.run) > 0 || e.running > 0 {
		return false
	}
	for _, s := range e.wait {
		if !s.held {
			return false
		}
	}
	for el := e.waiting.Front(); el != nil; el = el.Next() {
		if !el.Value.(*waiter).held {
			return false
		}
	}
	return true
}

// signalDrainedLocked wakes a waitDrained once the engine has drained.
func (e *engine) signalDrainedLocked() {
	if e.drained != nil && e.drainedLocked() {
		close(e.drained)
		e.drained = nil
	}
}

// waitDrained returns once nothing but held requests is in the engine, or
// with ctx's error.
func (e *engine) waitDrained(ctx context.Context) error {
	for {
		e.mu.Lock()
		if e.drainedLocked() {
			e.mu.Unlock()
			return nil
		}
		if e.drained == nil {
			e.drained = make(chan struct{})
		}
		ch := e.drained
		e.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// resume unpauses the scheduler: the held requests are queued as any other,
// in arrival order, behind those the pause kept.
func (e *engine) resume() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pause = unpaused
	for _, s := range e.wait {
		s.held = false
	}
	for el := e.waiting.Front(); el != nil; el = el.Next() {
		el.Value.(*waiter).held = false
	}
	e.schedule()
	e.kick()
}

// paused is vLLM's is_scheduler_paused.
func (e *engine) paused() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.pause != unpaused
}

// Executor tags vLLM's sleep mode allocates under (CuMemAllocator): a
// wake may name some; "scheduling" is the engine core's own tag for the
// scheduler, woken once no other is asleep.
const (
	tagWeights    = "weights"
	tagKVCache    = "kv_cache"
	tagScheduling = "scheduling"
)

// sleeper is the executor's side of sleep mode: what sleeps, at which
// level. Sleeps and wakes take turns (op), as the engine core runs one
// utility call at a time.
type sleeper struct {
	op sync.Mutex
	mu sync.Mutex // guards the fields below
	// tags are the executor's sleeping tags; none when it is awake.
	tags  map[string]bool
	level int
	// state is vllm:engine_sleep_state, by sleep_state.
	state *prometheus.GaugeVec
}

func newSleeper(labels prometheus.Labels) *sleeper {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: metricEngineSleepState,
		Help: "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; " +
			"weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
		ConstLabels: labels}, []string{labelSleepState})
	sl := &sleeper{tags: map[string]bool{}, state: g}
	sl.record(false, 0)
	return sl
}

// record sets vllm:engine_sleep_state as vLLM's record_sleep_state does.
func (sl *sleeper) record(asleep bool, level int) {
	awake, offloaded, discarded := 1.0, 0.0, 0.0
	if asleep {
		awake = 0
		if level == 1 {
			offloaded = 1
		} else if level == 2 {
			discarded = 1
		}
	}
	sl.state.WithLabelValues("awake").Set(awake)
	sl.state.WithLabelValues("weights_offloaded").Set(offloaded)
	sl.state.WithLabelValues("discard_all").Set(discarded)
}

func (sl *sleeper) asleep() bool {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	return len(sl.tags) > 0
}

// validationError answers as FastAPI does for a bad query parameter.
func validationError(w http.ResponseWriter, param, msg string) {
	writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"detail": []map[string]any{{
		"type": "value_error", "loc": []string{"query", param}, "msg": msg}}})
}

func (s *Server) handleSleep(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	level := 1
	if v := q.Get("level"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 2 {
			validationError(w, "level", "Input should be 0, 1 or 2")
			return
		}
		level = n
	}
	mode := pauseAbort
	if v := q.Get("mode"); v != "" {
		mode = v
	}
	switch mode {
	case pauseAbort, pauseWait:
	case pauseKeep:
		if s.eng.gpu == nil {
			badRequest(w, "sleep mode keep is simulated with GPU timing only (--sim-gpu)")
			return
		}
	default:
		validationError(w, "mode", "Input should be 'abort', 'wait' or 'keep'")
		return
	}
	sl := s.sleep
	sl.op.Lock()
	defer sl.op.Unlock()
	began := s.clock.Now()
	s.eng.mu.Lock()
	s.eng.pauseLocked(mode)
	s.eng.mu.Unlock()
	if mode == pauseWait {
		if err := s.eng.waitDrained(r.Context()); err != nil {
			// The client left: the engine stays paused, as vLLM's does
			// (its future runs on); a wake resumes it.
			return
		}
		s.eng.mu.Lock()
		s.eng.pause = pausedAll
		s.eng.mu.Unlock()
	}
	if level >= 1 {
		if err := s.eng.resetPrefixCache(false); err != nil {
			writeError(w, vllm.NewError(http.StatusInternalServerError, vllm.ErrTypeInternalServer, err.Error()))
			return
		}
		if sl.asleep() {
			s.log.Warn("Executor is already sleeping.")
		} else {
			var d = s.cfg.LoadTimes().Sleep
			if level != 1 || !s.cfg.EnableSleepMode {
				// Level 2 discards the weights; without sleep mode nothing
				// is freed at all (vLLM's allocator holds no pool to free).
				d = 0
			}
			// A client that leaves does not stop the engine core's copy: the
			// state below is the copy's end either way.
			_ = s.clock.Sleep(r.Context(), d)
			sl.mu.Lock()
			sl.tags = map[string]bool{tagWeights: true, tagKVCache: true}
			sl.level = level
			sl.mu.Unlock()
			s.log.Info("engine asleep", "took", s.clock.Now().Sub(began), "level", level, "sleep_mode", s.cfg.EnableSleepMode)
		}
	}
	sl.record(true, level)
	w.WriteHeader(http.StatusOK)
}

func (s *Server) handleWakeUp(w http.ResponseWriter, r *http.Request) {
	tags := r.URL.Query()["tags"]
	sl := s.sleep
	sl.op.Lock()
	defer sl.op.Unlock()
	began := s.clock.Now()
	all := len(tags) == 0 // vLLM: no tags wakes every tag
	tags = slices.DeleteFunc(tags, func(t string) bool { return t == tagScheduling })
	if all || len(tags) > 0 {
		s.wakeExecutor(r.Context(), all, tags)
	}
	if !sl.asleep() {
		s.eng.resume()
		s.log.Info("engine awake", "took", s.clock.Now().Sub(began), "tags", tags)
	}
	sl.record(false, 0) // as vLLM's AsyncLLM.wake_up, whatever was woken
	w.WriteHeader(http.StatusOK)
}

// wakeExecutor wakes every sleeping tag (all) or those named, as vLLM's
// executor: a tag that is not asleep makes the whole wake a no-op.
func (s *Server) wakeExecutor(ctx context.Context, all bool, tags []string) {
	sl := s.sleep
	sl.mu.Lock()
	if len(sl.tags) == 0 {
		sl.mu.Unlock()
		s.log.Warn("Executor is not sleeping.")
		return
	}
	if all {
		tags = nil
		for t := range sl.tags {
			tags = append(tags, t)
		}
	}
	for _, t := range tags {
		if !sl.tags[t] {
			sl.mu.Unlock()
			s.log.Warn("a tag to wake is not asleep; nothing woken", "tag", t)
			return
		}
	}
	copyBack := slices.Contains(tags, tagWeights) && sl.level == 1 && s.cfg.EnableSleepMode
	sl.mu.Unlock()
	if copyBack {
		_ = s.clock.Sleep(ctx, s.cfg.LoadTimes().Wake) // as for a sleep: the copy ends either way
	}
	sl.mu.Lock()
	for _, t := range tags {
		delete(sl.tags, t)
	}
	sl.mu.Unlock()
}

func (s *Server) handleIsSleeping(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]bool{"is_sleeping": s.eng.paused() || s.sleep.asleep()})
}
