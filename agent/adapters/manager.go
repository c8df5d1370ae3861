// Package adapters applies LoRA adapter placements to the node's engines
// (design §6 "Adapters", §7.6): it loads what the control plane placed on a
// replica through vLLM's runtime LoRA API, unloads what was removed once
// no request for it has run for a while (at once, when a newly placed
// adapter needs its slot), loads everything again after an
// engine restart, and reports each adapter's state and last activity for
// the agent's ephemeral updates.
//
// The engine is the truth: on every new engine incarnation the manager
// lists the adapters it holds (/v1/models) before acting, so adapters an
// adopted engine already holds are not loaded twice, and an engine's
// activity is read from its own vllm:lora_requests_info.
//
// Reporting: one AdapterStatus per (replica, adapter) the engine holds or
// is asked to hold. The proto has no removal list for adapters, so an
// adapter that is no longer held (unloaded, or its failed placement
// withdrawn) is reported once in a delta with state UNSPECIFIED; a full
// copy simply leaves it out, and a removed replica takes its adapters
// with it.
package adapters

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/vllm"
)

// Config tunes the manager. The zero value of a duration means its
// default (DefaultConfig).
type Config struct {
	// ScrapeInterval is how often each engine's activity is read.
	ScrapeInterval time.Duration
	// IdleGrace is how long an adapter removed from the placement must have
	// had no request before it is unloaded (design §7.6 "a few seconds").
	IdleGrace time.Duration
	// RequestTimeout bounds one call to an engine; a load reads weights
	// from disk, so it is generous.
	RequestTimeout time.Duration
	// UnloadDeferMax bounds how long an adapter removed from the placement
	// stays loaded because the engine's reading says requests for it run
	// or wait: past it, the adapter is unloaded all the same. The control
	// plane removes an adapter only once no router has a request in
	// flight for it there (routers count theirs exactly, design §7.6),
	// and routers then stop sending it there; what the engine still shows
	// is requests already on their way, which end, or a metric that is
	// stuck busy (issue 27), which never ends. A third of the routers'
	// 30 s --adapter-wait, so a request waiting for the slot is served.
	UnloadDeferMax time.Duration
	// RetryInitial and RetryMax bound the backoff between loads of an
	// adapter that failed for a reason that may pass (a 5xx, the engine
	// unreachable). A 4xx (no such path, bad input) is not retried until
	// the placement or the engine changes; its retry-after is RetryMax.
	RetryInitial, RetryMax time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Client calls the engines; nil means a plain client.
	Client *http.Client
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{ScrapeInterval: time.Second, IdleGrace: 5 * time.Second, RequestTimeout: 2 * time.Minute,
		UnloadDeferMax: 10 * time.Second, RetryInitial: 5 * time.Second, RetryMax: 5 * time.Minute}
}

// Validate checks the durations; errors name the field.
func (c Config) Validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"scrape_interval", c.ScrapeInterval}, {"idle_grace", c.IdleGrace}, {"request_timeout", c.RequestTimeout},
		{"unload_defer_max", c.UnloadDeferMax}, {"retry_initial", c.RetryInitial}, {"retry_max", c.RetryMax}} {
		if f.d < 0 {
			errs = append(errs, fmt.Errorf("adapters: %s: %v must not be negative", f.name, f.d))
		}
	}
	if c.RetryMax > 0 && c.RetryInitial > c.RetryMax {
		errs = append(errs, fmt.Errorf("adapters: retry_initial: %v exceeds retry_max %v", c.RetryInitial, c.RetryMax))
	}
	return errors.Join(errs...)
}

func (c *Config) fill() {
	d := DefaultConfig()
	for _, p := range []struct{ v, def *time.Duration }{{&c.ScrapeInterval, &d.ScrapeInterval},
		{&c.IdleGrace, &d.IdleGrace}, {&c.RequestTimeout, &d.RequestTimeout}, {&c.UnloadDeferMax, &d.UnloadDeferMax},
		{&c.RetryInitial, &d.RetryInitial}, {&c.RetryMax, &d.RetryMax}} {
		if *p.v == 0 {
			*p.v = *p.def
		}
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Client == nil {
		c.Client = &http.Client{}
	}
}

// tick is how often the manager looks for work besides being woken.
const tick = 200 * time.Millisecond

// activityStep is how far last-active must have moved before an adapter
// that stays busy is reported again: the leader needs recency to pick the
// least recently used, not every scrape.
const activityStep = 5 * time.Second

// Manager is the node's adapter manager. Apply, Engine and Forget are
// called by the agent's replica set; Full, Changes and Notify by one
// control session at a time; Run drives the engines. All are safe for
// concurrent use.
type Manager struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics

	mu       sync.Mutex
	replicas map[string]*replica
	version  uint64 // bumped on every reported change
	seen     uint64 // what the session has read
	wake     chan struct{}
	notify   chan struct{}
}

// replica is one replica's engine and adapters.
type replica struct {
	id    string
	model *llmgwv1.Model
	// The engine: reachable at addr while ready; uid and incarnation
	// stamp the statuses.
	uid, incarnation uint64
	addr             string
	ready            bool
	// synced: the engine's own list has been read for this incarnation.
	synced     bool
	scraping   bool
	nextScrape time.Time
	// placed are the adapters the desired state puts here.
	placed  map[string]bool
	entries map[string]*entry
	// unloaded counts this replica's finished unloads, so a load refused
	// as full is tried again after the next one (entry.fullAt).
	unloaded uint64
}

// removedHeldLocked says whether an adapter removed from r's placement
// still holds a slot in the engine (UNLOADING): its unload will make room.
func (r *replica) removedHeldLocked() bool {
	for name, e := range r.entries {
		if !e.gone && !r.placed[name] && e.st.GetState() == llmgwv1.AdapterState_ADAPTER_STATE_UNLOADING {
			return true
		}
	}
	return false
}

// entry is one adapter on one replica.
type entry struct {
	st  *llmgwv1.AdapterStatus
	ver uint64
	// gone: no longer held, reported once as UNSPECIFIED then dropped.
	gone     bool
	inflight bool
	// failures counts consecutive failed loads; retryable says whether
	// the last may pass on its own; next is when to try again.
	failures  int
	retryable bool
	next      time.Time
	// fullAt, when not 0, is replica.unloaded+1 at a load the engine
	// refused as full: the load waits until an unload has finished.
	fullAt uint64
	// removedAt is when the adapter was removed from the placement while
	// loaded (it turned UNLOADING): UnloadDeferMax counts from it.
	removedAt time.Time
}

// New returns a manager whose metrics (llmgw_agent_adapter_*) are on reg.
func New(cfg Config, logger *slog.Logger, reg prometheus.Registerer) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		return nil, errors.New("adapters: nil logger")
	}
	cfg.fill()
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("adapters: metrics: %w", err)
	}
	return &Manager{cfg: cfg, log: logger, metrics: m, replicas: map[string]*replica{},
		wake: make(chan struct{}, 1), notify: make(chan struct{}, 1)}, nil
}

// Managed says whether the manager has anything to do for a model: vLLM
// (or the simulator) serving adapters. llama.cpp loads its adapters at
// start and has no runtime API (design §6).
func Managed(m *llmgwv1.Model) bool {
	return m != nil && len(m.GetAdapters()) > 0 && (m.GetEngine() == "vllm" || m.GetEngine() == "sim")
}

// Apply takes a desired set's placements for the replicas in it. Replicas
// of unmanaged models are ignored.
func (m *Manager) Apply(d *llmgwv1.DesiredReplicas) {
	models := map[string]*llmgwv1.Model{}
	for _, md := range d.GetModels() {
		models[md.GetName()] = md
	}
	placed := map[string]map[string]bool{}
	for _, p := range d.GetAdapters() {
		for _, id := range p.GetReplicas() {
			if placed[id] == nil {
				placed[id] = map[string]bool{}
			}
			placed[id][p.GetAdapter()] = true
		}
	}
	m.mu.Lock()
	for _, rep := range d.GetReplicas() {
		md := models[rep.GetModel()]
		if !Managed(md) {
			continue
		}
		r := m.replicaLocked(rep.GetId(), md)
		r.placed = placed[rep.GetId()]
		if r.placed == nil {
			r.placed = map[string]bool{}
		}
	}
	m.mu.Unlock()
	m.signal(m.wake)
}

func (m *Manager) replicaLocked(id string, model *llmgwv1.Model) *replica {
	r := m.replicas[id]
	if r == nil {
		r = &replica{id: id, placed: map[string]bool{}, entries: map[string]*entry{}}
		m.replicas[id] = r
	}
	r.model = model
	return r
}

// Engine tells the manager of a replica's engine status, as the supervisor
// reports it. A new uid or incarnation means a new process: it holds no
// runtime adapters, so everything is listed and loaded again.
func (m *Manager) Engine(st *llmgwv1.ReplicaStatus, model *llmgwv1.Model) {
	if !Managed(model) {
		return
	}
	m.mu.Lock()
	r := m.replicaLocked(st.GetReplicaId(), model)
	if inc := st.GetIncarnation(); inc > 0 && (inc != r.incarnation || st.GetUid() != r.uid) {
		if r.incarnation != 0 {
			m.log.Info("engine restarted; its adapters are reloaded", "replica", r.id, "incarnation", inc)
		}
		r.uid, r.incarnation, r.synced = st.GetUid(), inc, false
		for name, e := range r.entries {
			if e.gone {
				delete(r.entries, name)
				continue
			}
			m.setLocked(r, e, func(s *llmgwv1.AdapterStatus) {})
			e.gone, e.failures, e.next = true, 0, time.Time{}
		}
	}
	r.ready = st.GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY && st.GetAddress() != ""
	if r.ready {
		r.addr = st.GetAddress()
	}
	m.mu.Unlock()
	m.signal(m.wake)
}

// Forget drops a replica the agent no longer runs; the session's removal
// of the replica takes its adapters' statuses with it.
func (m *Manager) Forget(id string) {
	m.mu.Lock()
	delete(m.replicas, id)
	m.mu.Unlock()
}

// Notify holds a token when statuses changed since the last read.
func (m *Manager) Notify() <-chan struct{} { return m.notify }

// Full returns every held adapter's status, sorted by replica and adapter;
// what it returns counts as reported.
func (m *Manager) Full() []*llmgwv1.AdapterStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*llmgwv1.AdapterStatus
	for _, r := range m.replicas {
		for name, e := range r.entries {
			if e.gone {
				if !e.inflight {
					delete(r.entries, name)
				}
				continue
			}
			out = append(out, proto.Clone(e.st).(*llmgwv1.AdapterStatus))
		}
	}
	m.seen = m.version
	sortStatuses(out)
	return out
}

// Changes returns the statuses changed since the last Full or Changes,
// removals as UNSPECIFIED; nil when nothing changed.
func (m *Manager) Changes() []*llmgwv1.AdapterStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*llmgwv1.AdapterStatus
	for _, r := range m.replicas {
		for name, e := range r.entries {
			if e.ver > m.seen {
				st := proto.Clone(e.st).(*llmgwv1.AdapterStatus)
				if e.gone {
					st.State, st.Reason, st.RetryAfterUnixNano, st.Active = llmgwv1.AdapterState_ADAPTER_STATE_UNSPECIFIED, "", 0, 0
				}
				out = append(out, st)
			}
			if e.gone && !e.inflight {
				delete(r.entries, name)
			}
		}
	}
	m.seen = m.version
	sortStatuses(out)
	return out
}

func sortStatuses(s []*llmgwv1.AdapterStatus) {
	slices.SortFunc(s, func(a, b *llmgwv1.AdapterStatus) int {
		if c := strings.Compare(a.GetReplicaId(), b.GetReplicaId()); c != 0 {
			return c
		}
		return strings.Compare(a.GetAdapter(), b.GetAdapter())
	})
}

func (m *Manager) signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// setLocked changes an entry's status through f and marks it for report.
func (m *Manager) setLocked(r *replica, e *entry, f func(*llmgwv1.AdapterStatus)) {
	f(e.st)
	e.st.ReplicaId, e.st.Uid, e.st.Incarnation = r.id, r.uid, r.incarnation
	m.version++
	e.ver = m.version
	m.signal(m.notify)
}

// entryLocked returns the live entry for name, creating it in state.
func (m *Manager) entryLocked(r *replica, name string, state llmgwv1.AdapterState) *entry {
	e := r.entries[name]
	if e == nil || e.gone {
		e = &entry{st: &llmgwv1.AdapterStatus{Adapter: name, State: state,
			LastActiveUnixNano: m.cfg.Now().UnixNano()}}
		r.entries[name] = e
		m.setLocked(r, e, func(*llmgwv1.AdapterStatus) {})
	}
	return e
}

// Run drives the engines until ctx ends, and returns once every call it
// started has returned (they are cancelled with ctx).
func (m *Manager) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		m.step(ctx, &wg)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-m.wake:
		}
	}
}

// step starts whatever each replica needs: a scrape when one is due, the
// loads of placed adapters it lacks, the unloads of removed ones now idle.
func (m *Manager) step(ctx context.Context, wg *sync.WaitGroup) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.cfg.Now()
	for _, r := range m.replicas {
		if !r.ready {
			continue
		}
		if !r.scraping && !now.Before(r.nextScrape) {
			r.scraping = true
			wg.Add(1)
			go func(r *replica, addr string, inc uint64, list bool) {
				defer wg.Done()
				m.scrape(ctx, r, addr, inc, list)
			}(r, r.addr, r.incarnation, !r.synced)
		}
		if !r.synced || r.model.GetMaxLoadedAdapters() == 0 {
			// Before the engine's list is known nothing is decided; with
			// N = 0 every adapter is the engine's from its start.
			continue
		}
		m.stepReplicaLocked(ctx, wg, r, now)
	}
}

// stepReplicaLocked loads what is placed on r and unloads what was removed
// (design §7.6). A replica holds at most max_loaded_adapters N adapters, and
// an engine at N refuses a load, so the order matters: when the loads
// wanted would go past N, removed adapters that are idle right now (no
// request for them running or waiting in the latest reading) are unloaded
// first, without IdleGrace — the control plane removed them because it
// judged them idle for its adapter_min_idle, and a request waits for the
// new one — and the loads start as the unloads finish. IdleGrace applies
// only to removals no load needs room from.
func (m *Manager) stepReplicaLocked(ctx context.Context, wg *sync.WaitGroup, r *replica, now time.Time) {
	var want []string
	for name := range r.placed {
		e := r.entries[name]
		switch {
		case e == nil || e.gone:
			want = append(want, name)
		case e.inflight:
		case e.st.GetState() == llmgwv1.AdapterState_ADAPTER_STATE_UNLOADING:
			// Placed again before it was unloaded.
			e.removedAt = time.Time{}
			m.setLocked(r, e, func(s *llmgwv1.AdapterStatus) { s.State = llmgwv1.AdapterState_ADAPTER_STATE_LOADED })
		case e.st.GetState() == llmgwv1.AdapterState_ADAPTER_STATE_LOADING:
			// Waiting for room: refused as full, or not started for lack
			// of a slot.
			want = append(want, name)
		case e.st.GetState() == llmgwv1.AdapterState_ADAPTER_STATE_FAILED && e.retryable && !now.Before(e.next):
			want = append(want, name)
		}
	}
	slices.Sort(want)
	var removed []*entry
	for name, e := range r.entries {
		if r.placed[name] || e.gone || e.inflight {
			continue
		}
		switch e.st.GetState() {
		case llmgwv1.AdapterState_ADAPTER_STATE_FAILED, llmgwv1.AdapterState_ADAPTER_STATE_LOADING:
			// A withdrawn failed or not yet started placement holds nothing.
			m.setLocked(r, e, func(*llmgwv1.AdapterStatus) {})
			e.gone = true
		case llmgwv1.AdapterState_ADAPTER_STATE_LOADED:
			e.removedAt = now
			m.setLocked(r, e, func(s *llmgwv1.AdapterStatus) { s.State = llmgwv1.AdapterState_ADAPTER_STATE_UNLOADING })
			fallthrough
		case llmgwv1.AdapterState_ADAPTER_STATE_UNLOADING:
			// Idle in the latest reading, or removed so long ago that a
			// reading still busy is not believed (UnloadDeferMax).
			if (e.st.GetActive() == 0 && !now.Before(e.next)) || m.overdueLocked(e, now) {
				removed = append(removed, e)
			}
		}
	}
	// Least recently active first; ties by name, so the choice is stable.
	slices.SortFunc(removed, func(a, b *entry) int {
		if c := cmp.Compare(a.st.GetLastActiveUnixNano(), b.st.GetLastActiveUnixNano()); c != 0 {
			return c
		}
		return strings.Compare(a.st.GetAdapter(), b.st.GetAdapter())
	})
	free := int(r.model.GetMaxLoadedAdapters()) - r.occupiedLocked()
	freeing := r.freeingLocked()
	short := len(want) - free - freeing
	refused := 0
	for _, name := range want {
		if e := r.entries[name]; e != nil && !e.gone && e.fullAt != 0 {
			refused++
		}
	}
	// The engine said it is full for these, whatever the count says (it
	// may hold more than the model's N, or count differently).
	short = max(short, refused-freeing)
	for _, e := range removed {
		overdue := m.overdueLocked(e, now)
		graceOver := overdue || now.Sub(time.Unix(0, e.st.GetLastActiveUnixNano())) >= m.cfg.IdleGrace
		if graceOver || short > 0 {
			short--
			m.startUnload(ctx, wg, r, e.st.GetAdapter(), e, overdue)
		}
	}
	for _, name := range want {
		if e := r.entries[name]; e != nil && !e.gone && e.fullAt != 0 && e.fullAt == r.unloaded+1 {
			// Refused as full: tried again once an unload has finished.
			continue
		}
		if free <= 0 {
			// No slot yet: reported LOADING (the control plane keeps it
			// placed, and the router waits) until an unload frees one.
			e := m.entryLocked(r, name, llmgwv1.AdapterState_ADAPTER_STATE_LOADING)
			if e.st.GetState() != llmgwv1.AdapterState_ADAPTER_STATE_LOADING {
				m.setLocked(r, e, func(s *llmgwv1.AdapterStatus) {
					s.State, s.Reason, s.RetryAfterUnixNano = llmgwv1.AdapterState_ADAPTER_STATE_LOADING, "", 0
				})
			}
			continue
		}
		free--
		m.startLoad(ctx, wg, r, name)
	}
}

// overdueLocked says whether e was removed from the placement
// UnloadDeferMax ago or more: it is unloaded whatever the engine's reading
// says.
func (m *Manager) overdueLocked(e *entry, now time.Time) bool {
	return !e.removedAt.IsZero() && now.Sub(e.removedAt) >= m.cfg.UnloadDeferMax
}

// occupiedLocked counts the adapters that hold a slot in r's engine:
// loaded, being unloaded, or being loaded.
func (r *replica) occupiedLocked() int {
	n := 0
	for _, e := range r.entries {
		switch st := e.st.GetState(); {
		case e.gone:
		case st == llmgwv1.AdapterState_ADAPTER_STATE_LOADED, st == llmgwv1.AdapterState_ADAPTER_STATE_UNLOADING:
			n++
		case st == llmgwv1.AdapterState_ADAPTER_STATE_LOADING && e.inflight:
			n++
		}
	}
	return n
}

// freeingLocked counts the unloads under way on r: slots about to be free.
func (r *replica) freeingLocked() int {
	n := 0
	for _, e := range r.entries {
		if !e.gone && e.inflight && e.st.GetState() == llmgwv1.AdapterState_ADAPTER_STATE_UNLOADING {
			n++
		}
	}
	return n
}

// pathOf is the adapter's path in the model, "" if the model lacks it.
func pathOf(model *llmgwv1.Model, name string) string {
	for _, a := range model.GetAdapters() {
		if a.GetName() == name {
			return a.GetPath()
		}
	}
	return ""
}

func (m *Manager) startLoad(ctx context.Context, wg *sync.WaitGroup, r *replica, name string) {
	e := m.entryLocked(r, name, llmgwv1.AdapterState_ADAPTER_STATE_LOADING)
	path := pathOf(r.model, name)
	if path == "" {
		m.failLocked(r, e, fmt.Sprintf("adapter %q is not one of model %q's adapters", name, r.model.GetName()), false)
		return
	}
	m.setLocked(r, e, func(s *llmgwv1.AdapterStatus) {
		s.State, s.Reason, s.RetryAfterUnixNano = llmgwv1.AdapterState_ADAPTER_STATE_LOADING, "", 0
	})
	e.inflight, e.fullAt = true, 0
	addr, inc := r.addr, r.incarnation
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer m.signal(m.wake)
		start := m.cfg.Now()
		code, msg, err := m.call(ctx, addr, "/v1/load_lora_adapter", map[string]string{"lora_name": name, "lora_path": path})
		m.mu.Lock()
		defer m.mu.Unlock()
		e.inflight = false
		if m.replicas[r.id] != r || r.incarnation != inc || e.gone {
			return // the engine changed meanwhile: its state is listed anew
		}
		log := m.log.With("replica", r.id, "model", r.model.GetName(), "adapter", name)
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			m.metrics.loads.WithLabelValues("failed").Inc()
			log.Warn("adapter load failed", "err", err)
			m.failLocked(r, e, err.Error(), true)
		case code == http.StatusOK || (code == http.StatusBadRequest && strings.Contains(msg, "already been loaded")):
			m.metrics.loads.WithLabelValues("ok").Inc()
			m.metrics.loadSeconds.Observe(m.cfg.Now().Sub(start).Seconds())
			log.Info("adapter loaded", "seconds", m.cfg.Now().Sub(start).Seconds())
			e.failures = 0
			m.setLocked(r, e, func(s *llmgwv1.AdapterStatus) {
				s.State, s.Reason, s.RetryAfterUnixNano = llmgwv1.AdapterState_ADAPTER_STATE_LOADED, "", 0
				// Counted as used now, so a fresh load is not the least
				// recently used one.
				s.LastActiveUnixNano = m.cfg.Now().UnixNano()
			})
		case code >= 500 && r.removedHeldLocked():
			// The engine is full, and an adapter removed from the
			// placement still holds a slot: the load waits in LOADING for
			// that unload (stepReplicaLocked makes room), not for a retry
			// delay, and the control plane sees no failure.
			m.metrics.loads.WithLabelValues("full").Inc()
			log.Info("adapter load refused while a removed adapter is held; loaded after its unload", "status", code, "err", msg)
			e.fullAt = r.unloaded + 1
		default:
			m.metrics.loads.WithLabelValues("failed").Inc()
			log.Warn("adapter load refused by the engine", "status", code, "err", msg)
			m.failLocked(r, e, fmt.Sprintf("engine answered %d: %s", code, msg), code >= 500)
		}
	}()
}

// failLocked marks a load failed. A failure that may pass is retried with
// a doubling delay; one that will not (4xx) only when the placement or the
// engine changes, so a bad path is not loaded in a loop.
func (m *Manager) failLocked(r *replica, e *entry, reason string, retryable bool) {
	e.failures++
	d := m.cfg.RetryMax
	if retryable {
		d = m.cfg.RetryInitial << min(e.failures-1, 16)
		d = min(d, m.cfg.RetryMax)
	}
	e.retryable, e.next = retryable, m.cfg.Now().Add(d)
	m.setLocked(r, e, func(s *llmgwv1.AdapterStatus) {
		s.State, s.Reason, s.RetryAfterUnixNano = llmgwv1.AdapterState_ADAPTER_STATE_FAILED, reason, e.next.UnixNano()
	})
}

// startUnload unloads a removed adapter. overdue: it was removed
// UnloadDeferMax ago, and a reading that says it is busy no longer puts
// the unload off.
func (m *Manager) startUnload(ctx context.Context, wg *sync.WaitGroup, r *replica, name string, e *entry, overdue bool) {
	e.inflight = true
	addr, inc := r.addr, r.incarnation
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Woken when done: a load may be waiting for the slot.
		defer m.signal(m.wake)
		// The decision was made on the latest reading, up to a scrape
		// interval old: a burst routed since then is running in the engine
		// now. Read it again just before the unload, judged as every
		// reading is (busyWith), and leave a busy one be (routers have
		// stopped sending it; it is unloaded once idle) — until it is
		// overdue: then the reading is stuck, or the requests are some
		// router's that did not learn of the removal, and the slot is
		// worth more (UnloadDeferMax).
		if rd, err := m.read(ctx, addr); err == nil && rd.busyWith(name) {
			if !overdue {
				m.mu.Lock()
				defer m.mu.Unlock()
				e.inflight = false
				if m.replicas[r.id] != r || r.incarnation != inc || e.gone {
					return
				}
				now := m.cfg.Now()
				e.next = now.Add(unloadRecheck)
				m.setLocked(r, e, func(s *llmgwv1.AdapterStatus) { s.Active, s.LastActiveUnixNano = max(s.Active, 1), now.UnixNano() })
				m.metrics.unloadsDeferred.Inc()
				m.log.Info("adapter unload deferred: requests for it are in the engine", "replica", r.id, "model", r.model.GetName(), "adapter", name)
				return
			}
			m.metrics.unloadsOverdue.Inc()
			m.log.Warn("adapter unloaded although the engine's reading says requests for it run or wait: removed from the placement longer ago than the bound",
				"replica", r.id, "model", r.model.GetName(), "adapter", name, "bound", m.cfg.UnloadDeferMax)
		}
		code, msg, err := m.call(ctx, addr, "/v1/unload_lora_adapter", map[string]string{"lora_name": name})
		m.mu.Lock()
		defer m.mu.Unlock()
		e.inflight = false
		if m.replicas[r.id] != r || r.incarnation != inc || e.gone {
			return
		}
		log := m.log.With("replica", r.id, "model", r.model.GetName(), "adapter", name)
		if err != nil || (code != http.StatusOK && code != http.StatusNotFound) {
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				err = fmt.Errorf("engine answered %d: %s", code, msg)
			}
			log.Warn("adapter unload failed; retried later", "err", err)
			e.next = m.cfg.Now().Add(m.cfg.RetryInitial)
			return
		}
		m.metrics.unloads.Inc()
		r.unloaded++
		log.Info("adapter unloaded")
		m.setLocked(r, e, func(*llmgwv1.AdapterStatus) {})
		e.gone = true
	}()
}

// unloadRecheck is how soon an unload deferred because the engine was busy
// with the adapter is tried again (after a fresh reading).
const unloadRecheck = 250 * time.Millisecond

// maxErrorBody bounds what is read of an engine's answer.
const maxErrorBody = 64 << 10

// call POSTs body as JSON and returns the status and, for an error, the
// message of vLLM's error body (or the raw text).
func (m *Manager) call(ctx context.Context, addr, path string, body any) (int, string, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return 0, "", err
	}
	ctx, cancel := context.WithTimeout(ctx, m.cfg.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+path, bytes.NewReader(b))
	if err != nil {
		return 0, "", fmt.Errorf("%s: %w", path, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := m.cfg.Client.Do(req)
	if err != nil {
		return 0, "", fmt.Errorf("%s: %w", path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	if resp.StatusCode == http.StatusOK {
		return resp.StatusCode, "", nil
	}
	var e vllm.ErrorResponse
	if json.Unmarshal(raw, &e) == nil && e.Error.Message != "" {
		return resp.StatusCode, e.Error.Message, nil
	}
	return resp.StatusCode, strings.TrimSpace(string(raw)), nil
}

// scrape reads an engine: its adapter list first for a new incarnation,
// then its activity.
func (m *Manager) scrape(ctx context.Context, r *replica, addr string, inc uint64, list bool) {
	var held []string
	var err error
	if list {
		held, err = m.listAdapters(ctx, addr)
	}
	var rd reading
	if err == nil {
		rd, err = m.read(ctx, addr)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r.scraping = false
	r.nextScrape = m.cfg.Now().Add(m.cfg.ScrapeInterval)
	if m.replicas[r.id] != r || r.incarnation != inc {
		return
	}
	if err != nil {
		if ctx.Err() == nil {
			m.log.Debug("reading engine adapters", "replica", r.id, "err", err)
		}
		return
	}
	now := m.cfg.Now()
	if list {
		r.synced = true
		for _, name := range held {
			e := m.entryLocked(r, name, llmgwv1.AdapterState_ADAPTER_STATE_LOADED)
			if e.st.GetState() != llmgwv1.AdapterState_ADAPTER_STATE_LOADED {
				m.setLocked(r, e, func(s *llmgwv1.AdapterStatus) { s.State = llmgwv1.AdapterState_ADAPTER_STATE_LOADED })
			}
		}
	}
	for name, e := range r.entries {
		if e.gone {
			continue
		}
		active := rd.busyWith(name)
		var n uint32
		if active {
			n = 1 // the metric names adapters, it does not count their requests
		}
		last := time.Unix(0, e.st.GetLastActiveUnixNano())
		if was := e.st.GetActive() > 0; active != was || (active && now.Sub(last) >= activityStep) {
			// Becoming idle is the last moment it was active, too.
			m.setLocked(r, e, func(s *llmgwv1.AdapterStatus) { s.Active, s.LastActiveUnixNano = n, now.UnixNano() })
		} else if active {
			// Kept current for the idle check without a report.
			e.st.LastActiveUnixNano = now.UnixNano()
		}
	}
}

func (m *Manager) get(ctx context.Context, url string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := m.cfg.Client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, vllm.MaxMetricsBytes+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	if len(b) > vllm.MaxMetricsBytes {
		return nil, fmt.Errorf("GET %s: body over %d bytes", url, vllm.MaxMetricsBytes)
	}
	return b, nil
}

// listAdapters returns the adapters an engine serves: the cards of
// /v1/models with a parent.
func (m *Manager) listAdapters(ctx context.Context, addr string) ([]string, error) {
	b, err := m.get(ctx, "http://"+addr+"/v1/models")
	if err != nil {
		return nil, err
	}
	return parseModels(b)
}

func parseModels(b []byte) ([]string, error) {
	var list vllm.ModelList
	if err := json.Unmarshal(b, &list); err != nil {
		return nil, fmt.Errorf("/v1/models: %w", err)
	}
	var out []string
	for _, c := range list.Data {
		if c.Parent != nil && c.ID != "" {
			out = append(out, c.ID)
		}
	}
	return out, nil
}

// reading is one read of an engine's /metrics: which adapters its
// vllm:lora_requests_info names, and whether the engine is idle.
type reading struct {
	act activity
	// idle: the engine says nothing runs or waits (its load was read).
	idle bool
}

// busyWith says whether the reading shows requests for adapter running or
// waiting: the metric names it, and the engine is not idle. An idle
// engine has no active adapter whatever a stale series still names:
// vLLM's labelled gauge keeps the last one shown, and some engines' never
// returns to idle (issue 27). Both the periodic reading and the one just
// before an unload judge by it, so the two cannot disagree.
func (rd reading) busyWith(adapter string) bool {
	return rd.act.found && rd.act.active[adapter] && !rd.idle
}

func (m *Manager) read(ctx context.Context, addr string) (reading, error) {
	b, err := m.get(ctx, "http://"+addr+"/metrics")
	if err != nil {
		return reading{}, err
	}
	act, err := parseActivity(b)
	if err != nil {
		return reading{}, err
	}
	load, loadErr := vllm.ParseLoad(bytes.NewReader(b), vllm.VLLMLoadNames)
	return reading{act: act, idle: loadErr == nil && load.Running+load.Waiting == 0}, nil
}
