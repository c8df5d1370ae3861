// Package supervisor runs one replica's engine for as long as the replica is
// wanted (design §6 "Supervisor"): it starts the process in its own process
// group, probes it until ready, keeps probing, restarts it with backoff when
// it exits, stops it with SIGTERM then SIGKILL, and reports every phase
// change.
//
// The supervisor owns no goroutine but the one running Run. It reaps the
// engine by polling wait4 and reads the engine's output from a file rather
// than a pipe, so nothing blocks on the engine: an agent that leaves its
// engines running (design §6 "Engines outlive the agent") returns at once, and
// the engine is not killed by a broken pipe when the agent goes away.
package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/agent/engine"
	"github.com/llmgw/llmgw/internal/backoff"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/vllm"
)

// Config describes one replica's engine and how to supervise it.
type Config struct {
	ReplicaID string
	UID       uint64
	Model     string
	Node      string
	Launch    engine.Launch
	// LogPath receives the engine's stdout and stderr. Required when the
	// launch has a process.
	LogPath string
	// ReadyTimeout bounds STARTING: an engine not ready by then is stopped
	// and restarted. vLLM loading a large model takes minutes.
	ReadyTimeout time.Duration
	// StopGrace is how long SIGTERM is given before SIGKILL.
	StopGrace time.Duration
	// ProbeInterval spaces health probes; ProbeTimeout bounds each.
	ProbeInterval, ProbeTimeout time.Duration
	// PollInterval spaces checks for the process having exited.
	PollInterval time.Duration
	// UnhealthyAfter failed probes in a row turn READY into UNHEALTHY.
	UnhealthyAfter int
	Backoff        Backoff
	// Pdeathsig makes the kernel SIGKILL the engine when the agent dies, for
	// agents that must not leave engines behind even when killed.
	Pdeathsig bool
	// LogLines is how many of the engine's last lines are kept.
	LogLines int
	// FirstIncarnation is the incarnation an engine llmgw does not run
	// starts at (0 means 1): one past the last an earlier agent reported for
	// the same placement, so incarnations only grow (design §4 "Identity";
	// routers refuse KV state of an older one).
	FirstIncarnation uint64
	// Adopt, when set, is a running engine to watch before starting any
	// (design §6 "Engines outlive the agent"); a gone one is replaced at once.
	Adopt *Adoption
	// Dial, if set, makes the probes' connections: for an engine llmgw
	// does not run, the agent's endpoint guard, which resolves its host and
	// refuses an address the model policy refuses each time it connects
	// (design §6 "External engines"). Nil dials directly.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// SleepTimeout bounds one sleep or wake of a sleep-mode engine, its
	// check included (sleep.go): moving a large model's weights over PCIe
	// takes seconds.
	SleepTimeout time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// DefaultConfig holds the timings for production engines.
func DefaultConfig() Config {
	return Config{
		ReadyTimeout:   10 * time.Minute,
		StopGrace:      10 * time.Second,
		ProbeInterval:  time.Second,
		ProbeTimeout:   2 * time.Second,
		PollInterval:   50 * time.Millisecond,
		UnhealthyAfter: 3,
		Backoff:        DefaultBackoff(),
		LogLines:       100,
		SleepTimeout:   2 * time.Minute,
	}
}

// Reporter receives every status change, in order, from the supervisor's
// goroutine. It must not block for long and must not keep the pointer's
// target mutable: each status is a fresh value.
type Reporter func(*llmgwv1.ReplicaStatus)

// Supervisor runs one replica's engine. Create with New, drive with Run.
type Supervisor struct {
	cfg    Config
	report Reporter
	log    *slog.Logger
	client *http.Client
	ring   *logRing
	detach atomic.Bool

	// Sleep (sleep.go): wantSleep is the replica set's wish, sleepKick
	// wakes the loop when it changes; sleepClient makes the sleep and wake
	// calls, which take longer than a probe.
	wantSleep   atomic.Bool
	sleepKick   chan struct{}
	sleepClient *http.Client

	mu   sync.Mutex
	last *llmgwv1.ReplicaStatus
}

// New returns a supervisor; it starts nothing until Run.
func New(cfg Config, report Reporter, logger *slog.Logger) *Supervisor {
	d := DefaultConfig()
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = d.PollInterval
	}
	if cfg.ProbeInterval <= 0 {
		cfg.ProbeInterval = d.ProbeInterval
	}
	if cfg.ProbeTimeout <= 0 {
		cfg.ProbeTimeout = d.ProbeTimeout
	}
	if cfg.UnhealthyAfter <= 0 {
		cfg.UnhealthyAfter = d.UnhealthyAfter
	}
	if cfg.LogLines <= 0 {
		cfg.LogLines = d.LogLines
	}
	if cfg.Backoff.Initial <= 0 {
		cfg.Backoff = d.Backoff
	}
	if cfg.SleepTimeout <= 0 {
		cfg.SleepTimeout = d.SleepTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if report == nil {
		report = func(*llmgwv1.ReplicaStatus) {}
	}
	return &Supervisor{
		cfg:    cfg,
		report: report,
		log:    logger.With("replica", cfg.ReplicaID, "model", cfg.Model),
		// Probes must not reuse connections across engine restarts: a kept-
		// alive connection to a dead engine would fail the first probe.
		client:      &http.Client{Timeout: cfg.ProbeTimeout, Transport: &http.Transport{DisableKeepAlives: true, DialContext: cfg.Dial}},
		sleepClient: &http.Client{Timeout: cfg.SleepTimeout, Transport: &http.Transport{DisableKeepAlives: true, DialContext: cfg.Dial}},
		sleepKick:   make(chan struct{}, 1),
		ring:        newLogRing(cfg.LogLines),
	}
}

// Logs returns the engine's last output lines, oldest first.
func (s *Supervisor) Logs() []string { return s.ring.snapshot() }

// Status returns the last reported status (nil before the first).
func (s *Supervisor) Status() *llmgwv1.ReplicaStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// Detach makes the next cancellation of Run leave the engine running instead
// of stopping it: how an agent exits without costing its engines a reload.
func (s *Supervisor) Detach() { s.detach.Store(true) }

// errStopped ends a run because its context was cancelled.
var errStopped = errors.New("stopped")

// Run supervises the engine until ctx is cancelled, then stops it (unless
// detached) and returns once it is gone. It returns nil on cancellation.
func (s *Supervisor) Run(ctx context.Context) error {
	if len(s.cfg.Launch.Argv) == 0 {
		return s.runExternal(ctx)
	}
	var (
		incarnation uint64
		restarts    uint32
		delay       time.Duration
	)
	adopt := s.cfg.Adopt
	for {
		var (
			p       *proc
			err     error
			started time.Time
			phase   = llmgwv1.ReplicaPhase_REPLICA_PHASE_STARTING
		)
		if adopt != nil {
			// Checked healthy by the agent just before: READY at once,
			// under the incarnation the engine already has.
			incarnation, restarts = adopt.Incarnation, adopt.Restarts
			var ok bool
			if p, ok = s.adopted(adopt); ok {
				started, phase = adopt.Started, llmgwv1.ReplicaPhase_REPLICA_PHASE_READY
			} else {
				s.log.Warn("engine to adopt is gone; starting a new one", "pid", adopt.Pid)
			}
			adopt = nil
		}
		if p == nil {
			incarnation++
			started = s.cfg.Now()
			p, err = s.start()
		}
		st := s.status(incarnation, restarts)
		if err != nil {
			st.Phase, st.Message = llmgwv1.ReplicaPhase_REPLICA_PHASE_FAILED, err.Error()
			s.emit(st)
			s.log.Warn("engine failed to start", "err", err)
			delay = s.cfg.Backoff.Next(delay, 0)
		} else {
			st.Pid = int32(p.pid)
			st.Phase, st.Message = phase, ""
			if phase == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY {
				if s.asleepNow(ctx) {
					// Adopted asleep: woken below if it should not be.
					st.Phase, st.Message = llmgwv1.ReplicaPhase_REPLICA_PHASE_SLEEPING, "asleep: weights in host memory"
					phase = st.Phase
				} else {
					s.readyFacts(ctx, st)
				}
			}
			s.emit(st)
			if p.adopted {
				s.log.Info("engine adopted", "pid", p.pid, "incarnation", incarnation)
			} else {
				s.log.Info("engine started", "pid", p.pid, "incarnation", incarnation)
			}
			why := s.watch(ctx, p, st, phase)
			if errors.Is(why, errStopped) {
				if s.detach.Load() {
					s.log.Info("leaving engine running", "pid", p.pid)
					p.release()
					return nil
				}
				s.stop(p, st)
				p.closeLog()
				return nil
			}
			if !p.exited {
				s.stop(p, st)
			}
			p.closeLog()
			ran := s.cfg.Now().Sub(started)
			delay = s.cfg.Backoff.Next(delay, ran)
			restarts++
			st = s.status(incarnation, restarts)
			st.Pid = 0
			st.Phase = llmgwv1.ReplicaPhase_REPLICA_PHASE_RESTARTING
			st.Message = fmt.Sprintf("%v; restarting in %v", why, delay)
			s.emit(st)
			s.log.Warn("engine down, restarting", "err", why, "delay", delay, "restarts", restarts)
		}
		if !backoff.Sleep(ctx, delay) {
			st := s.status(incarnation, restarts)
			st.Phase, st.Message = llmgwv1.ReplicaPhase_REPLICA_PHASE_STOPPED, "stopped"
			s.emit(st)
			return nil
		}
	}
}

// runExternal probes an engine llmgw does not run: there is nothing to start
// or stop, only readiness to report (design §6). A probe is the health URL,
// then the model list, which must name the model. The incarnation counts
// the engine's returns: one that comes back READY after being UNHEALTHY may
// be a new process (a restart is invisible from outside but for the
// outage), so what was learnt about the old one — its KV mirror, the
// routers' breakers and index — starts over. A blip shorter than
// UnhealthyAfter probes keeps the incarnation, and its lost KV events are
// repaired by replay.
func (s *Supervisor) runExternal(ctx context.Context) error {
	incarnation := max(s.cfg.FirstIncarnation, 1)
	st := s.status(incarnation, uint32(incarnation-1))
	st.Phase = llmgwv1.ReplicaPhase_REPLICA_PHASE_STARTING
	s.emit(st)
	failures := 0
	t := time.NewTicker(s.cfg.ProbeInterval)
	defer t.Stop()
	for {
		ok, msg := s.probe(ctx)
		var maxLen uint32
		if ok {
			ok, msg, maxLen = s.probeModels(ctx)
		}
		next := st.Phase
		if ok {
			failures = 0
			next = llmgwv1.ReplicaPhase_REPLICA_PHASE_READY
		} else if failures++; st.Phase != llmgwv1.ReplicaPhase_REPLICA_PHASE_STARTING && failures >= s.cfg.UnhealthyAfter {
			next = llmgwv1.ReplicaPhase_REPLICA_PHASE_UNHEALTHY
		}
		if next != st.Phase || (!ok && msg != st.Message && st.Phase == llmgwv1.ReplicaPhase_REPLICA_PHASE_STARTING) ||
			(ok && maxLen != st.MaxModelLen) {
			if st.Phase == llmgwv1.ReplicaPhase_REPLICA_PHASE_UNHEALTHY && next == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY {
				incarnation++
				s.log.Info("external engine back", "incarnation", incarnation)
			} else if next == llmgwv1.ReplicaPhase_REPLICA_PHASE_UNHEALTHY {
				s.log.Warn("external engine unhealthy", "err", msg)
			}
			st = s.status(incarnation, uint32(incarnation-1))
			st.Phase, st.Message = next, msg
			if next == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY {
				st.MaxModelLen = maxLen
			}
			s.emit(st)
		}
		select {
		case <-ctx.Done():
			st = s.status(incarnation, uint32(incarnation-1))
			st.Phase, st.Message = llmgwv1.ReplicaPhase_REPLICA_PHASE_STOPPED, "stopped"
			s.emit(st)
			return nil
		case <-t.C:
		}
	}
}

// maxModelsBytes bounds what an engine's model list may be.
const maxModelsBytes = 1 << 20

// probeModels asks an external engine's OpenAI model list whether it serves
// the model by the name routers will send (no list to check: true), and
// returns the context length its card gives (0 when none).
func (s *Supervisor) probeModels(ctx context.Context) (bool, string, uint32) {
	l := s.cfg.Launch
	if l.ModelsURL == "" {
		return true, "", 0
	}
	list, err := s.models(ctx, l.ModelsURL)
	if err != nil {
		return false, err.Error(), 0
	}
	ids := make([]string, 0, len(list.Data))
	for _, m := range list.Data {
		if m.ID == l.ServedModel {
			return true, "", m.maxModelLen()
		}
		ids = append(ids, strconv.Quote(m.ID))
	}
	return false, fmt.Sprintf("the engine does not serve model %q (it serves %s): start it with --served-model-name %s", l.ServedModel, strings.Join(ids, ", "), l.ServedModel), 0
}

// modelList is what the agent reads of an engine's OpenAI model list.
type modelList struct {
	Data []modelCard `json:"data"`
}

// modelCard is one entry of it. max_model_len is vLLM's (and the
// simulator's); llama.cpp's cards have none.
type modelCard struct {
	ID          string `json:"id"`
	MaxModelLen *int64 `json:"max_model_len"`
}

// maxModelLen is the card's context length, 0 when it gives none or one
// no engine could have (not positive, past uint32).
func (c modelCard) maxModelLen() uint32 {
	if c.MaxModelLen == nil || *c.MaxModelLen <= 0 || *c.MaxModelLen > math.MaxUint32 {
		return 0
	}
	return uint32(*c.MaxModelLen)
}

// models GETs an engine's model list, at most maxModelsBytes of it.
func (s *Supervisor) models(ctx context.Context, modelsURL string) (modelList, error) {
	var list modelList
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, modelsURL, nil)
	if err != nil {
		return list, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return list, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return list, errors.New("models: " + resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxModelsBytes)).Decode(&list); err != nil {
		return list, fmt.Errorf("models: %w", err)
	}
	return list, nil
}

// readyFacts fills in what an engine llmgw runs says of itself once it
// is ready: its context length (its model card) and its KV-cache size (its
// metrics). Either is 0 when the engine does not say.
func (s *Supervisor) readyFacts(ctx context.Context, st *llmgwv1.ReplicaStatus) {
	st.MaxModelLen = s.maxModelLen(ctx)
	st.KvCacheBlocks = s.kvCacheBlocks(ctx)
}

// kvCacheBlocks reads how many KV-cache blocks an engine llmgw runs holds
// from its /metrics (the same origin as its health URL):
// vllm:cache_config_info's num_gpu_blocks, which vLLM and the simulator
// publish once the cache is allocated, before they serve. It bounds the
// engine's KV mirror (design §6 "KV events"); 0 when the engine does not
// say (llama.cpp), and the mirror keeps its configured bound.
func (s *Supervisor) kvCacheBlocks(ctx context.Context) uint64 {
	u, err := url.Parse(s.cfg.Launch.HealthURL)
	if err != nil {
		return 0
	}
	u.Path, u.RawQuery = "/metrics", ""
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return 0
	}
	resp, err := s.client.Do(req)
	if err != nil {
		s.log.Debug("engine's metrics unread: no KV-cache size reported", "err", err)
		return 0
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		s.log.Debug("engine's metrics unread: no KV-cache size reported", "status", resp.Status)
		return 0
	}
	cc, _, err := vllm.ParseCacheConfig(resp.Body)
	if err != nil {
		s.log.Warn("engine's cache_config_info unreadable: no KV-cache size reported", "err", err)
		return 0
	}
	return uint64(cc.NumGPUBlocks)
}

// maxModelLen reads the context length of an engine llmgw runs from its
// model list (the same origin as its health URL; vLLM, the simulator and
// llama.cpp all serve /v1/models), on the card of the name it was started
// under. 0 when the engine does not say: the status is only the poorer
// for it, so a failure is logged, not fatal.
func (s *Supervisor) maxModelLen(ctx context.Context) uint32 {
	u, err := url.Parse(s.cfg.Launch.HealthURL)
	if err != nil {
		return 0
	}
	u.Path, u.RawQuery = "/v1/models", ""
	list, err := s.models(ctx, u.String())
	if err != nil {
		s.log.Debug("engine's model list unread: no max_model_len reported", "err", err)
		return 0
	}
	for _, m := range list.Data {
		if m.ID == s.cfg.Model {
			return m.maxModelLen()
		}
	}
	return 0
}

// watch probes a running engine and returns why it should no longer run:
// errStopped on cancellation, or the exit or readiness failure. It also
// puts a sleep-mode engine to sleep and wakes it (sleep.go).
func (s *Supervisor) watch(ctx context.Context, p *proc, st *llmgwv1.ReplicaStatus, phase llmgwv1.ReplicaPhase) error {
	poll := time.NewTicker(s.cfg.PollInterval)
	defer poll.Stop()
	sl := newSleeper()
	defer sl.stop()
	started := s.cfg.Now()
	nextProbe := started
	failures := 0
	for {
		s.drainLogs(p)
		if exited, err := p.poll(); exited {
			s.drainLogs(p)
			return err
		}
		if now := s.cfg.Now(); !now.Before(nextProbe) {
			nextProbe = now.Add(s.cfg.ProbeInterval)
			ok, msg := s.probe(ctx)
			next := phase
			switch {
			case ok && phase == llmgwv1.ReplicaPhase_REPLICA_PHASE_SLEEPING:
				// An asleep engine answers its probe: it stays asleep
				// until woken.
				failures = 0
			case ok:
				failures = 0
				next = llmgwv1.ReplicaPhase_REPLICA_PHASE_READY
				if phase == llmgwv1.ReplicaPhase_REPLICA_PHASE_UNHEALTHY && s.asleepNow(ctx) {
					next = llmgwv1.ReplicaPhase_REPLICA_PHASE_SLEEPING
				}
			case phase == llmgwv1.ReplicaPhase_REPLICA_PHASE_STARTING:
				if s.cfg.ReadyTimeout > 0 && now.Sub(started) >= s.cfg.ReadyTimeout {
					return fmt.Errorf("not ready within %v: %s", s.cfg.ReadyTimeout, msg)
				}
			default:
				failures++
				if failures >= s.cfg.UnhealthyAfter {
					next = llmgwv1.ReplicaPhase_REPLICA_PHASE_UNHEALTHY
				}
			}
			if next != phase && sl.op == nil {
				if phase == llmgwv1.ReplicaPhase_REPLICA_PHASE_STARTING && next == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY {
					// The cold start, as the benchmarks read it.
					s.log.Info("engine ready", "pid", p.pid, "incarnation", st.GetIncarnation(), "took", now.Sub(started))
				}
				phase = next
				c := cloneStatus(st)
				c.Phase, c.Message = next, msg
				switch next {
				case llmgwv1.ReplicaPhase_REPLICA_PHASE_READY:
					s.readyFacts(ctx, c)
				case llmgwv1.ReplicaPhase_REPLICA_PHASE_SLEEPING:
					c.Message = "asleep: weights in host memory"
				}
				s.emit(c)
			}
		}
		s.nextSleepOp(ctx, sl, phase)
		select {
		case <-ctx.Done():
			return errStopped
		case <-poll.C:
		case <-s.sleepKick:
		case err := <-sl.done():
			phase = s.sleepDone(ctx, sl, err, st, phase)
			failures = 0
		}
	}
}

// probe asks the engine's health URL; any answer but 200 is a failure.
func (s *Supervisor) probe(ctx context.Context) (bool, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.cfg.Launch.HealthURL, nil)
	if err != nil {
		return false, err.Error()
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return false, err.Error()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, "health: " + resp.Status
	}
	return true, ""
}

// stop sends SIGTERM to the engine's process group, SIGKILL after the
// grace, and returns once the engine is reaped and its group is empty.
func (s *Supervisor) stop(p *proc, st *llmgwv1.ReplicaStatus) {
	c := cloneStatus(st)
	c.Phase, c.Message = llmgwv1.ReplicaPhase_REPLICA_PHASE_STOPPING, "SIGTERM"
	s.emit(c)
	p.signalGroup(syscall.SIGTERM)
	deadline := s.cfg.Now().Add(s.cfg.StopGrace)
	for {
		s.drainLogs(p)
		if exited, _ := p.poll(); exited {
			break
		}
		if !s.cfg.Now().Before(deadline) {
			s.log.Warn("engine ignored SIGTERM, killing", "pid", p.pid, "grace", s.cfg.StopGrace)
			p.signalGroup(syscall.SIGKILL)
			p.waitBlocking()
			break
		}
		time.Sleep(s.cfg.PollInterval)
	}
	// The engine is reaped, but what it started may still be dying: SIGKILL
	// is delivered asynchronously. Wait (bounded) until no member of its
	// group runs, so "stopped" means no engine process is left.
	for end := s.cfg.Now().Add(s.cfg.StopGrace); groupRunning(p.pid) && s.cfg.Now().Before(end); {
		p.signalGroup(syscall.SIGKILL)
		time.Sleep(s.cfg.PollInterval)
	}
	s.drainLogs(p)
	c = cloneStatus(st)
	c.Pid = 0
	c.Phase, c.Message = llmgwv1.ReplicaPhase_REPLICA_PHASE_STOPPED, "stopped"
	s.emit(c)
	s.log.Info("engine stopped", "pid", p.pid)
}

func (s *Supervisor) drainLogs(p *proc) {
	if p.out == nil {
		return
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := p.out.Read(buf)
		if n > 0 {
			for _, line := range s.ring.write(buf[:n]) {
				s.log.Debug("engine output", "line", line)
			}
		}
		if err != nil || n < len(buf) {
			return
		}
	}
}

func (s *Supervisor) status(incarnation uint64, restarts uint32) *llmgwv1.ReplicaStatus {
	return &llmgwv1.ReplicaStatus{
		ReplicaId:   s.cfg.ReplicaID,
		Uid:         s.cfg.UID,
		Incarnation: incarnation,
		Model:       s.cfg.Model,
		Node:        s.cfg.Node,
		Address:     s.cfg.Launch.Address,
		Restarts:    restarts,
	}
}

func (s *Supervisor) emit(st *llmgwv1.ReplicaStatus) {
	st.UpdatedUnixNano = s.cfg.Now().UnixNano()
	s.mu.Lock()
	s.last = st
	s.mu.Unlock()
	s.report(cloneStatus(st))
}

func cloneStatus(st *llmgwv1.ReplicaStatus) *llmgwv1.ReplicaStatus {
	return proto.Clone(st).(*llmgwv1.ReplicaStatus)
}

// maxLogBytes bounds the engine's log file: at a start past it, the file is
// rotated once (to .1), so a chatty engine cannot fill the data dir.
const maxLogBytes = 16 << 20

// start launches the engine in its own process group with its output going
// to the log file.
func (s *Supervisor) start() (*proc, error) {
	l := s.cfg.Launch
	if s.cfg.LogPath == "" {
		return nil, errors.New("supervisor: no log path")
	}
	if fi, err := os.Stat(s.cfg.LogPath); err == nil && fi.Size() > maxLogBytes {
		_ = os.Rename(s.cfg.LogPath, s.cfg.LogPath+".1")
	}
	w, err := os.OpenFile(s.cfg.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open engine log: %w", err)
	}
	defer w.Close() // the child holds its own copy
	r, err := os.Open(s.cfg.LogPath)
	if err != nil {
		return nil, fmt.Errorf("open engine log: %w", err)
	}
	if _, err := r.Seek(0, io.SeekEnd); err != nil {
		r.Close()
		return nil, fmt.Errorf("seek engine log: %w", err)
	}
	cmd := exec.Command(l.Argv[0], l.Argv[1:]...)
	cmd.Env = append(os.Environ(), l.Env...)
	cmd.Stdin = nil
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if s.cfg.Pdeathsig {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	}
	if err := cmd.Start(); err != nil {
		r.Close()
		return nil, fmt.Errorf("start %s: %w", l.Argv[0], err)
	}
	return &proc{cmd: cmd, pid: cmd.Process.Pid, out: r}, nil
}
