// Package load is the agent's side of load snapshots (design §6 "Load
// snapshots", §7.2): a Reader reads every running engine's /metrics each
// interval (50 ms by default) and folds the readings into one compact
// snapshot per node, and a Server streams that snapshot to every router
// that subscribes over LoadService.
//
// vLLM renders /metrics in the process that serves requests, so one local
// reader per node costs the engine far less than every router polling it;
// routers then add their own in-flight counts.
package load

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/vllm"
)

// Target is one engine to read: a replica incarnation and where its HTTP
// server listens.
type Target struct {
	ReplicaID   string
	UID         uint64
	Incarnation uint64
	// Address is the engine's host:port.
	Address string
	// Names maps the engine's metric names onto a load: vllm.VLLMLoadNames
	// for vLLM and the simulator, vllm.LlamaCppLoadNames for llama.cpp.
	Names vllm.LoadNames
}

// Targets tells the reader which engines run now.
type Targets interface {
	// LoadTargets returns the engines ready to serve, at most one per
	// replica id. It is called once per interval from the reader's
	// goroutine, so it must be cheap and safe alongside the agent's own
	// changes; the reader does not keep or modify the slice.
	LoadTargets() []Target
}

// Config configures a Reader.
type Config struct {
	// Node is the agent's node id, stamped on every snapshot.
	Node string
	// Interval spaces the reads of each engine and the snapshots.
	Interval time.Duration
	// ReadTimeout bounds one read of one engine. Engines are read
	// independently, so a slow one only ages its own reading.
	ReadTimeout time.Duration
	// Client does the reads; nil means a plain client with ReadTimeout.
	Client *http.Client
	// Now is the clock stamped on readings and snapshots; nil is time.Now.
	Now func() time.Time
}

// DefaultConfig reads every 50 ms (design §6) and gives an engine a second to
// answer.
func DefaultConfig() Config {
	return Config{Interval: 50 * time.Millisecond, ReadTimeout: time.Second}
}

// Validate names the bad field by its flag.
func (c Config) Validate() error {
	if c.Node == "" {
		return errors.New("--node-id: required")
	}
	if c.Interval <= 0 {
		return fmt.Errorf("--load-interval: must be positive, got %s", c.Interval)
	}
	if c.ReadTimeout <= 0 {
		return fmt.Errorf("load read timeout: must be positive, got %s", c.ReadTimeout)
	}
	return nil
}

// Reader reads the node's engines and publishes snapshots. Latest is safe
// for concurrent use; Run is called once.
type Reader struct {
	cfg     Config
	targets Targets
	log     *slog.Logger
	now     func() time.Time
	hub     hub

	reads *prometheus.CounterVec
}

// NewReader returns a reader whose first snapshot, until Run publishes one,
// is empty. reg receives its metrics (it may be nil).
func NewReader(cfg Config, targets Targets, log *slog.Logger, reg prometheus.Registerer) (*Reader, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if targets == nil || log == nil {
		return nil, errors.New("load: nil targets or logger")
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: cfg.ReadTimeout}
	}
	r := &Reader{cfg: cfg, targets: targets, log: log, now: cfg.Now}
	if r.now == nil {
		r.now = time.Now
	}
	r.reads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgw_agent_load_reads_total",
		Help: "Engine /metrics reads for load snapshots, by result (ok, error).",
	}, []string{"result"})
	if reg != nil {
		reg.MustRegister(r.reads)
	}
	r.hub.init(r.snapshot(nil))
	return r, nil
}

// Latest returns the newest snapshot and a channel closed once a newer one
// is published. The snapshot is shared: callers must not modify it.
func (r *Reader) Latest() (*llmgwv1.LoadSnapshot, <-chan struct{}) { return r.hub.latest() }

// Interval is how often snapshots are published.
func (r *Reader) Interval() time.Duration { return r.cfg.Interval }

// worker reads one target until its context ends.
type worker struct {
	target Target
	cancel context.CancelFunc
	last   atomic.Pointer[reading]
}

type reading struct {
	load vllm.Load
	at   time.Time
}

// Run reads and publishes until ctx is cancelled, and returns once every
// read it started has ended. Each interval it asks Targets what runs, starts
// a worker for each new engine incarnation and stops the workers of engines
// gone, then publishes the snapshot of every target's last good reading.
func (r *Reader) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	workers := map[Target]*worker{}
	defer func() {
		for _, w := range workers {
			w.cancel()
		}
		wg.Wait()
	}()
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		want := r.targets.LoadTargets()
		live := make(map[Target]bool, len(want))
		for _, tg := range want {
			live[tg] = true
			if workers[tg] != nil {
				continue
			}
			wctx, cancel := context.WithCancel(ctx)
			w := &worker{target: tg, cancel: cancel}
			workers[tg] = w
			wg.Go(func() { r.runWorker(wctx, w) })
		}
		for tg, w := range workers {
			if !live[tg] {
				w.cancel()
				delete(workers, tg)
			}
		}
		r.hub.publish(r.snapshot(workers))
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// runWorker reads its engine once per interval; a failed read leaves the
// last good reading in place, to age until routers count it saturated.
func (r *Reader) runWorker(ctx context.Context, w *worker) {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		l, err := r.read(ctx, w.target)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			r.reads.WithLabelValues("error").Inc()
			r.log.Debug("load: read failed", "replica", w.target.ReplicaID, "err", err)
		} else {
			r.reads.WithLabelValues("ok").Inc()
			w.last.Store(&reading{load: l, at: r.now()})
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (r *Reader) read(ctx context.Context, tg Target) (vllm.Load, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.ReadTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+tg.Address+"/metrics", nil)
	if err != nil {
		return vllm.Load{}, fmt.Errorf("read load of %s: %w", tg.Address, err)
	}
	resp, err := r.cfg.Client.Do(req)
	if err != nil {
		return vllm.Load{}, fmt.Errorf("read load of %s: %w", tg.Address, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return vllm.Load{}, fmt.Errorf("read load of %s: status %d", tg.Address, resp.StatusCode)
	}
	l, err := vllm.ParseLoad(resp.Body, tg.Names)
	if err != nil {
		return vllm.Load{}, fmt.Errorf("read load of %s: %w", tg.Address, err)
	}
	return l, nil
}

// snapshot is every target's last good reading, sorted by replica id. A
// target never read yet is listed with no scrape time, so a router knows it
// runs but has no load for it (saturated).
func (r *Reader) snapshot(workers map[Target]*worker) *llmgwv1.LoadSnapshot {
	s := &llmgwv1.LoadSnapshot{
		Node:          r.cfg.Node,
		UnixNano:      r.now().UnixNano(),
		IntervalNanos: r.cfg.Interval.Nanoseconds(),
		Replicas:      make([]*llmgwv1.ReplicaLoad, 0, len(workers)),
	}
	for tg, w := range workers {
		rl := &llmgwv1.ReplicaLoad{ReplicaId: tg.ReplicaID, Uid: tg.UID, Incarnation: tg.Incarnation}
		if rd := w.last.Load(); rd != nil {
			rl.Waiting, rl.Running, rl.KvUsage = rd.load.Waiting, rd.load.Running, rd.load.KVUsage
			rl.ScrapedUnixNano = rd.at.UnixNano()
		}
		s.Replicas = append(s.Replicas, rl)
	}
	slices.SortFunc(s.Replicas, func(a, b *llmgwv1.ReplicaLoad) int { return strings.Compare(a.ReplicaId, b.ReplicaId) })
	return s
}

// hub holds the latest snapshot with latest-value semantics: publishing
// never waits for a reader, and a reader that falls behind skips straight
// to the newest snapshot.
type hub struct {
	mu      sync.Mutex
	cur     *llmgwv1.LoadSnapshot
	changed chan struct{}
}

func (h *hub) init(s *llmgwv1.LoadSnapshot) {
	h.cur, h.changed = s, make(chan struct{})
}

func (h *hub) publish(s *llmgwv1.LoadSnapshot) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cur = s
	close(h.changed)
	h.changed = make(chan struct{})
}

func (h *hub) latest() (*llmgwv1.LoadSnapshot, <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cur, h.changed
}
