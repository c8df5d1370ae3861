package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/llmgw/llmgw/internal/backoff"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Sleep (design §6 "Sleep"): an engine started with vLLM's sleep mode
// (engine.Launch.SleepMode) is put to sleep when the replica set says so
// (SetSleeping) and it is READY — POST /sleep?level=1, its weights to host
// memory, its KV cache freed — and reported SLEEPING once /is_sleeping
// agrees; it is woken — POST /wake_up — when the replica set says so, and
// reported READY once /is_sleeping says it is awake and /health answers. A
// call that fails leaves the phase as it was, says why in the status
// message, and is tried again after a backoff. An asleep engine answers
// /health, so probes keep it SLEEPING; one found asleep where it should be
// awake (adopted, or back from UNHEALTHY) is reported SLEEPING and woken.

// Sleep retries back off from 1 s to 30 s (internal/backoff, with jitter).
const (
	sleepRetryInitial = time.Second
	sleepRetryMax     = 30 * time.Second
)

// maxSleepAnswerBytes bounds what is read of a sleep-mode answer.
const maxSleepAnswerBytes = 64 << 10

// SetSleeping sets whether the engine should sleep. It never blocks: the
// supervisor's loop acts on it. Before Run, it sets where the engine
// starts from.
func (s *Supervisor) SetSleeping(want bool) {
	if s.wantSleep.Swap(want) == want {
		return
	}
	select {
	case s.sleepKick <- struct{}{}:
	default:
	}
}

// sleepOp is a sleep or a wake in flight, on a goroutine of its own so
// the loop keeps reaping and probing; the loop that started it waits for
// it before it returns.
type sleepOp struct {
	sleep  bool
	began  time.Time
	cancel context.CancelFunc
	done   chan error
}

func (o *sleepOp) verb() string {
	if o.sleep {
		return "sleep"
	}
	return "wake"
}

// sleeper is one watch's sleep control: the op in flight and the retry
// schedule. Owned by the watch loop's goroutine.
type sleeper struct {
	op      *sleepOp
	retryAt time.Time
	bo      *backoff.Backoff
	warned  bool
}

func newSleeper() *sleeper { return &sleeper{bo: backoff.New(sleepRetryInitial, sleepRetryMax, nil)} }

// done is the op's result channel, nil (never ready) when none runs.
func (sl *sleeper) done() <-chan error {
	if sl.op == nil {
		return nil
	}
	return sl.op.done
}

// stop cancels the op in flight and waits for it.
func (sl *sleeper) stop() {
	if sl.op != nil {
		sl.op.cancel()
		<-sl.op.done
		sl.op = nil
	}
}

// next starts a sleep or a wake when the engine's phase and the wish
// disagree and no op runs or waits for its retry.
func (s *Supervisor) nextSleepOp(ctx context.Context, sl *sleeper, phase llmgwv1.ReplicaPhase) {
	want := s.wantSleep.Load()
	if !s.cfg.Launch.SleepMode {
		if want && !sl.warned {
			sl.warned = true
			s.log.Warn("asked to sleep, but the engine runs without sleep mode (its model has no autoscale.sleep); it stays up")
		}
		return
	}
	if sl.op != nil || s.cfg.Now().Before(sl.retryAt) {
		return
	}
	var sleep bool
	switch {
	case want && phase == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY:
		sleep = true
	case !want && phase == llmgwv1.ReplicaPhase_REPLICA_PHASE_SLEEPING:
		sleep = false
	default:
		return
	}
	opCtx, cancel := context.WithTimeout(ctx, s.cfg.SleepTimeout)
	op := &sleepOp{sleep: sleep, began: s.cfg.Now(), cancel: cancel, done: make(chan error, 1)}
	sl.op = op
	s.log.Info("engine sleep or wake begins", "op", op.verb())
	go func() {
		defer cancel()
		if sleep {
			op.done <- s.sleepEngine(opCtx)
		} else {
			op.done <- s.wakeEngine(opCtx)
		}
	}()
}

// sleepDone applies the op's result: the new phase (reported), or the
// failure in the status message and a retry scheduled. It returns the
// phase the engine is now in.
func (s *Supervisor) sleepDone(ctx context.Context, sl *sleeper, err error, st *llmgwv1.ReplicaStatus, phase llmgwv1.ReplicaPhase) llmgwv1.ReplicaPhase {
	op := sl.op
	sl.op = nil
	took := s.cfg.Now().Sub(op.began)
	c := cloneStatus(st)
	if err != nil {
		if ctx.Err() != nil {
			return phase // stopping: not a failure of the engine's
		}
		d := sl.bo.Next()
		sl.retryAt = s.cfg.Now().Add(d)
		c.Phase, c.Message = phase, fmt.Sprintf("%s failed: %v; retrying in %v", op.verb(), err, d.Round(time.Millisecond))
		s.emit(c)
		s.log.Warn("engine sleep or wake failed", "op", op.verb(), "err", err, "retry_in", d)
		return phase
	}
	sl.bo.Reset()
	sl.retryAt = time.Time{}
	if op.sleep {
		c.Phase, c.Message = llmgwv1.ReplicaPhase_REPLICA_PHASE_SLEEPING, "asleep: weights in host memory"
		s.log.Info("engine asleep", "took", took)
	} else {
		c.Phase, c.Message = llmgwv1.ReplicaPhase_REPLICA_PHASE_READY, ""
		s.readyFacts(ctx, c)
		s.log.Info("engine awake", "took", took)
	}
	s.emit(c)
	return c.Phase
}

// sleepEngine puts the engine to sleep at level 1 and checks it sleeps.
// Mode abort: the replica set asks only once the engine has been idle for
// a quiet period, so nothing should be in flight; what came in the last
// moment ends at once rather than holding the GPU (vLLM's mode wait) or
// waiting, held in the engine, for a wake that may never come.
func (s *Supervisor) sleepEngine(ctx context.Context) error {
	if err := s.sleepCall(ctx, "/sleep", url.Values{"level": {"1"}, "mode": {"abort"}}); err != nil {
		return err
	}
	asleep, err := s.isSleeping(ctx, s.sleepClient)
	if err != nil {
		return err
	}
	if !asleep {
		return errors.New("the engine answered the sleep but says it is not sleeping")
	}
	return nil
}

// wakeEngine wakes the engine and checks it is awake and healthy.
func (s *Supervisor) wakeEngine(ctx context.Context) error {
	if err := s.sleepCall(ctx, "/wake_up", nil); err != nil {
		return err
	}
	asleep, err := s.isSleeping(ctx, s.sleepClient)
	if err != nil {
		return err
	}
	if asleep {
		return errors.New("the engine answered the wake but says it is still sleeping")
	}
	if ok, msg := s.probe(ctx); !ok {
		return fmt.Errorf("awake but unhealthy: %s", msg)
	}
	return nil
}

// engineURL is path on the origin of the engine's health URL.
func (s *Supervisor) engineURL(path string, q url.Values) (string, error) {
	u, err := url.Parse(s.cfg.Launch.HealthURL)
	if err != nil {
		return "", fmt.Errorf("health URL: %w", err)
	}
	u.Path, u.RawQuery = path, q.Encode()
	return u.String(), nil
}

// sleepCall POSTs a sleep-mode endpoint; any 2xx is success (vLLM answers
// 200 with no body, or a JSON status in later versions).
func (s *Supervisor) sleepCall(ctx context.Context, path string, q url.Values) error {
	u, err := s.engineURL(path, q)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
	if err != nil {
		return err
	}
	resp, err := s.sleepClient.Do(req)
	if err != nil {
		return fmt.Errorf("POST %s: %w", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxSleepAnswerBytes))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s: %s: %s", path, resp.Status, excerpt(b))
	}
	return nil
}

// isSleeping asks GET /is_sleeping.
func (s *Supervisor) isSleeping(ctx context.Context, client *http.Client) (bool, error) {
	u, err := s.engineURL("/is_sleeping", nil)
	if err != nil {
		return false, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return false, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return false, fmt.Errorf("GET /is_sleeping: %w", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxSleepAnswerBytes))
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("GET /is_sleeping: %s: %s", resp.Status, excerpt(b))
	}
	var v struct {
		IsSleeping *bool `json:"is_sleeping"`
	}
	if err := json.Unmarshal(b, &v); err != nil || v.IsSleeping == nil {
		return false, fmt.Errorf("GET /is_sleeping: not {\"is_sleeping\": bool}: %s", excerpt(b))
	}
	return *v.IsSleeping, nil
}

// asleepNow is whether a sleep-mode engine says it sleeps, for an engine
// about to be reported READY without the supervisor having woken it; an
// engine that cannot say is taken as awake (its probes judge it).
func (s *Supervisor) asleepNow(ctx context.Context) bool {
	if !s.cfg.Launch.SleepMode {
		return false
	}
	asleep, err := s.isSleeping(ctx, s.client)
	if err != nil {
		s.log.Debug("engine's sleep state unread", "err", err)
		return false
	}
	return asleep
}

// excerpt is the start of an engine's answer, for a status message.
func excerpt(b []byte) string {
	const n = 200
	t := strings.TrimSpace(string(b))
	if len(t) > n {
		t = t[:n] + "…"
	}
	return t
}
