// Package replicas is the node's replica set (design §6): it makes the node
// run the replicas the control plane places on it, one supervisor per
// placement, re-adopts the engines an earlier agent left running, drains
// the placements the desired set marks draining, and books every replica's
// latest status for the control session to report (Book). It is the agent's
// engine side; the control session (package agent/session) only hands it
// desired sets, and the agent root wires the two.
package replicas

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/agent/datadir"
	"github.com/llmgw/llmgw/agent/drain"
	"github.com/llmgw/llmgw/agent/engine"
	"github.com/llmgw/llmgw/agent/kv"
	"github.com/llmgw/llmgw/agent/supervisor"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Config is what the replica set needs of the agent's configuration (the
// agent's Config documents each setting to its user).
type Config struct {
	// NodeID is this node; a replica whose leader shard is elsewhere gets
	// no KV listener or adapters here.
	NodeID string
	// AdvertiseAddr is the host engines listen on.
	AdvertiseAddr string
	// DataDir holds the engine records (engines/) and the external
	// replicas' records (external/) the next agent reads.
	DataDir string
	// LogDir holds each engine's output, <replica id>.log; the caller
	// creates it.
	LogDir string
	// Engines overrides how each engine kind is run, by engine name.
	Engines map[string]Engine
	// StopEnginesOnExit has the kernel kill the engines should the agent
	// die (supervisor.Config.Pdeathsig).
	StopEnginesOnExit bool
	ReadyTimeout      time.Duration
	StopGrace         time.Duration
	ProbeInterval     time.Duration
	RestartBackoff    supervisor.Backoff
	// Drain judges a draining replica's engine idle (package drain).
	Drain drain.Config
	// KVMaxFrameBytes caps the KV-event sockets' frames; 0 keeps the
	// listener's default.
	KVMaxFrameBytes uint64
	// KVTCP puts managed engines' KV-event sockets on loopback TCP instead
	// of ipc:// in DataDir/kv (design §6 "KV events"): the fallback.
	KVTCP bool
	// OTLPTracesEndpoint is what the engines are given as vLLM's
	// --otlp-traces-endpoint (a URL); "" gives none.
	OTLPTracesEndpoint string
	// KVStreamTimeout is how long an external engine's KV-event publisher
	// has to connect before its replica is untrusted; 0 means
	// DefaultKVStreamTimeout.
	KVStreamTimeout time.Duration
	// KVMaxOffloadBlocks caps the blocks a KV mirror holds in its engine's
	// offload tiers (kv.ListenerConfig.MaxOffloadBlocks); 0 keeps the
	// listener's default, a negative value mirrors no offload tier.
	KVMaxOffloadBlocks int
	// Resolver resolves external engines' host names at each connection
	// (external.go); nil is net.DefaultResolver.
	Resolver Resolver
	// Dial connects to the addresses an external engine's guard checked;
	// nil is a net.Dialer. Tests set it so nothing leaves loopback.
	Dial DialFunc
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Engine is how one engine kind is run on this node: its program and
// leading arguments (empty: the driver's default) and the environment
// added after the driver's.
type Engine struct {
	Command []string
	Env     map[string]string
}

// KV is where the KV-event listeners of the replicas' engines are bound
// (a *kv.Hub).
type KV interface {
	Listen(cfg kv.ListenerConfig, logger *slog.Logger) (*kv.Listener, error)
}

// Adapters loads the LoRA placements into the engines (design §6; an
// *adapters.Manager): it is told every desired set, every status of a
// leader shard's engine, and every replica forgotten.
type Adapters interface {
	Apply(d *llmgwv1.DesiredReplicas)
	Engine(st *llmgwv1.ReplicaStatus, model *llmgwv1.Model)
	Forget(id string)
}

// Set makes the node run its desired replicas: one supervisor per
// replica, keyed by (id, uid). A new uid under a known id is a new replica
// (design §4 "Identity"): the old engine is stopped before the new one starts,
// since both would want the same port and GPUs.
//
// It keeps running its last desired set when the control plane is out of
// reach; only a new desired set changes what runs.
//
// Create with New (which starts nothing), then Start once, Apply any number
// of times, and Stop once.
type Set struct {
	cfg      Config
	log      *slog.Logger
	book     *Book
	kv       KV
	adapters Adapters
	metrics  *metrics
	records  engineRecords

	// Set by Start, before any replica runs.
	//
	// loads are the node's load readings, by which a draining engine is
	// judged idle.
	loads drain.Loads
	ports *datadir.Ports
	// ctx is the life of every supervisor: cancelled by Stop.
	ctx  context.Context
	stop context.CancelFunc

	wg      sync.WaitGroup
	mu      sync.Mutex
	running map[string]*runner
}

// New returns an empty set whose metrics (llmgw_agent_desired_*,
// llmgw_agent_replica_phase, llmgw_agent_engine_*, llmgw_agent_drain*) are
// registered on reg. It starts nothing and touches no file.
func New(cfg Config, kvs KV, ads Adapters, logger *slog.Logger, reg prometheus.Registerer) (*Set, error) {
	if logger == nil {
		return nil, errors.New("replicas: nil logger")
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("replicas: metrics: %w", err)
	}
	return &Set{cfg: cfg, log: logger, book: newBook(), kv: kvs, adapters: ads, metrics: m,
		records: engineRecords{dir: filepath.Join(cfg.DataDir, "engines")}, running: map[string]*runner{}}, nil
}

// Book is the replicas' latest statuses, which the control session reports.
func (rs *Set) Book() *Book { return rs.book }

// Start readies the set to run replicas, their ports from ports and their
// drains judged on loads, and re-adopts the engines an earlier agent left
// running (adopt): called before the first session, so its hello lists
// them.
func (rs *Set) Start(ctx context.Context, ports *datadir.Ports, loads drain.Loads) {
	rs.ports, rs.loads = ports, loads
	rs.ctx, rs.stop = context.WithCancel(context.Background())
	rs.adopt(ctx)
}

// Stop ends every replica's supervision and returns once every goroutine
// of the set has ended. With detach the engines are left running for the
// next agent to re-adopt (design §6 "Engines outlive the agent"); without,
// each supervisor stops its engine. A replica removed from the desired set
// before Stop is stopped either way.
func (rs *Set) Stop(detach bool) {
	if detach {
		rs.detachAll()
	}
	if rs.stop != nil {
		rs.stop()
	}
	rs.wg.Wait()
}

// runner is one replica placement being run.
type runner struct {
	replica *llmgwv1.Replica
	model   *llmgwv1.Model
	// ctx is the placement's life; cancel ends it, stopping the engine.
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	// draining is set once the desired set marks the placement draining;
	// undrain ends the wait for it to go idle, and drained is set when
	// that wait stopped the engine. Guarded by Set.mu.
	draining bool
	undrain  context.CancelFunc
	drained  bool

	// sleeping is the desired set's Replica.sleeping; unsleep ends the
	// wait for the engine to go idle before it sleeps. Guarded by Set.mu.
	sleeping bool
	unsleep  context.CancelFunc

	// adopted is the engine an earlier agent left running that this
	// runner takes over (design §6); nil for a fresh start.
	adopted *supervisor.Adoption

	mu       sync.Mutex
	sup      *supervisor.Supervisor
	kvl      *kv.Listener // nil without KV events
	detached bool
	// launch and ports are what plan gave; recordedPid is the process the
	// data dir's engine record names (0: none).
	launch      engine.Launch
	ports       map[string]int
	recordedPid int
	// recordedIncarnation is the incarnation of an external replica its
	// record holds (external.go).
	recordedIncarnation uint64
	// guard makes every connection to an external replica's engine
	// (external.go); nil for an engine llmgw runs. Set before the runner
	// starts, never changed.
	guard *endpointGuard
	// sleepNow is what the supervisor is told: sleep (the replica is
	// wanted asleep and was idle) or be awake.
	sleepNow bool
}

func (r *runner) supervisor() *supervisor.Supervisor {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sup
}

// setSleep tells the supervisor, now or once it exists, whether its engine
// should sleep.
func (r *runner) setSleep(v bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sleepNow = v
	if r.sup != nil {
		r.sup.SetSleeping(v)
	}
}

func (r *runner) listener() *kv.Listener {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.kvl
}

// Apply converges on a desired set. It never blocks on an engine: starts and
// stops run in the replicas' own goroutines.
func (rs *Set) Apply(d *llmgwv1.DesiredReplicas) {
	models := make(map[string]*llmgwv1.Model, len(d.GetModels()))
	for _, m := range d.GetModels() {
		models[m.GetName()] = m
	}
	rs.adapters.Apply(d)
	rs.metrics.desired.Set(float64(len(d.GetReplicas())))
	rs.metrics.desiredRevision.Set(float64(d.GetRevision()))
	rs.mu.Lock()
	defer rs.mu.Unlock()
	want := make(map[string]bool, len(d.GetReplicas()))
	for _, rep := range d.GetReplicas() {
		id := rep.GetId()
		if id == "" || want[id] {
			rs.log.Warn("desired set has a replica without id or twice", "replica", id)
			continue
		}
		old := rs.running[id]
		if old != nil && old.replica.GetUid() == rep.GetUid() {
			want[id] = true
			switch {
			case rep.GetDraining() && !old.draining:
				rs.drainLocked(old)
			case !rep.GetDraining() && old.draining:
				// Today's control plane never takes a drain back (a
				// placement drains once); should one, the replica is
				// not left stopped while wanted.
				rs.log.Info("replica no longer draining", "replica", id)
				old.draining = false
				old.undrain()
				if old.drained {
					rs.startLocked(rep, models[rep.GetModel()], old, nil)
				}
			}
			if cur := rs.running[id]; rep.GetSleeping() != cur.sleeping {
				rs.sleepLocked(cur, rep.GetSleeping())
			}
			continue
		}
		if rep.GetDraining() {
			// Placed and draining at once: a new agent learning of a
			// drain its predecessor did not finish, with no engine left
			// to adopt. Nothing runs, so nothing is started; the
			// control plane reads the missing status as drained.
			continue
		}
		want[id] = true
		if old != nil {
			rs.log.Info("replica re-placed, replacing its engine", "replica", id,
				"old_uid", old.replica.GetUid(), "uid", rep.GetUid())
			old.cancel()
		}
		r := rs.startLocked(rep, models[rep.GetModel()], old, nil)
		if rep.GetSleeping() {
			rs.sleepLocked(r, true)
		}
	}
	for id, r := range rs.running {
		if !want[id] {
			rs.log.Info("replica no longer desired, stopping", "replica", id)
			r.cancel()
			rs.wg.Add(1)
			go rs.forget(id, r)
		}
	}
}

// forget drops a removed replica once its engine has stopped, unless it was
// placed here again meanwhile.
func (rs *Set) forget(id string, r *runner) {
	defer rs.wg.Done()
	<-r.done
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.running[id] != r {
		return
	}
	delete(rs.running, id)
	rs.book.remove(id)
	rs.dropExternal(id)
	rs.adapters.Forget(id)
	rs.metrics.forgetReplica(id, r.replica.GetModel())
	if err := rs.ports.Release(id + "/"); err != nil {
		rs.log.Warn("releasing ports", "replica", id, "err", err)
	}
}

func (rs *Set) startLocked(rep *llmgwv1.Replica, model *llmgwv1.Model, prev *runner, adopt *supervisor.Adoption) *runner {
	ctx, cancel := context.WithCancel(rs.ctx)
	r := &runner{replica: rep, model: model, ctx: ctx, cancel: cancel, done: make(chan struct{}), adopted: adopt,
		undrain: func() {}, unsleep: func() {}}
	if r.isExternal() {
		r.guard = rs.newGuard(rep, model)
	}
	rs.running[rep.GetId()] = r
	rs.wg.Add(1)
	go func() {
		defer rs.wg.Done()
		defer close(r.done)
		defer cancel()
		if prev != nil {
			select {
			case <-prev.done:
			case <-ctx.Done():
				return
			}
		}
		rs.run(ctx, r)
	}()
	return r
}

// sleepLocked follows a placement's Replica.sleeping (design §5.7 "Sharing
// GPUs", §6 "Sleep"). Asleep: once the engine has been idle for the drain's
// quiet period (package drain) — routers stop choosing a sleeping replica
// a moment after the agent learns of it — its supervisor puts it to sleep,
// so nothing in flight is cut; after the drain timeout, however busy.
// Awake: the supervisor wakes it at once. The wait is owned by the
// placement's context and ends on a wake.
func (rs *Set) sleepLocked(r *runner, sleeping bool) {
	r.sleeping = sleeping
	r.unsleep()
	log := rs.log.With("replica", r.replica.GetId(), "model", r.replica.GetModel())
	if !sleeping {
		log.Info("replica to wake")
		r.setSleep(false)
		return
	}
	ctx, cancel := context.WithCancel(r.ctx)
	r.unsleep = cancel
	rs.wg.Add(1)
	go func() {
		defer rs.wg.Done()
		defer cancel()
		rs.sleepWhenIdle(ctx, r, log)
	}()
}

func (rs *Set) sleepWhenIdle(ctx context.Context, r *runner, log *slog.Logger) {
	id, uid := r.replica.GetId(), r.replica.GetUid()
	log.Info("replica to sleep; its engine sleeps once idle", "quiet", rs.cfg.Drain.Quiet, "timeout", rs.cfg.Drain.Timeout)
	out, err := drain.Wait(ctx, rs.cfg.Drain, rs.loads, drain.Replica{ID: id, UID: uid, Serving: func() bool {
		st := rs.book.status(id)
		if st == nil || st.GetUid() != uid {
			return false
		}
		p := st.GetPhase()
		return p == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY || p == llmgwv1.ReplicaPhase_REPLICA_PHASE_UNHEALTHY
	}})
	if err != nil && !errors.Is(err, drain.ErrNoLoads) {
		return // woken, replaced or removed
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if ctx.Err() != nil {
		return // woken as the wait ended
	}
	switch {
	case err != nil:
		log.Warn("no load readings to judge the engine idle; it sleeps now")
	case out == drain.TimedOut:
		log.Warn("replica still busy at the drain timeout; its engine sleeps now, cutting what runs", "timeout", rs.cfg.Drain.Timeout)
	default:
		log.Info("replica idle; its engine sleeps", "why", out.String())
	}
	r.setSleep(true)
}

// drainLocked starts waiting for a draining placement's engine to go idle
// (package drain), then stops it: the supervisor sends SIGTERM, SIGKILL
// after the grace, and reports STOPPED, on which the control plane removes
// the replica (design §4 "Changes roll", §5.5). The placement stays in the
// running set, stopped, until the desired set drops it. The wait is owned
// by the placement's context: it ends when the placement is replaced or
// removed, when the agent stops, or on undrain.
func (rs *Set) drainLocked(r *runner) {
	r.draining = true
	ctx, cancel := context.WithCancel(r.ctx)
	r.undrain = cancel
	rs.wg.Add(1)
	go func() {
		defer rs.wg.Done()
		defer cancel()
		rs.drain(ctx, r)
	}()
}

func (rs *Set) drain(ctx context.Context, r *runner) {
	id, uid := r.replica.GetId(), r.replica.GetUid()
	log := rs.log.With("replica", id, "model", r.replica.GetModel())
	began := rs.now()
	if r.isExternal() {
		// Nothing runs here to go idle: routers stop choosing the replica
		// on their own and the engine serves on, so the probing stops now.
		log.Info("external replica draining; its probing stops")
		rs.mu.Lock()
		r.drained = ctx.Err() == nil
		rs.mu.Unlock()
		r.cancel()
		<-r.done
		return
	}
	log.Info("replica draining; its engine stops once idle", "quiet", rs.cfg.Drain.Quiet, "timeout", rs.cfg.Drain.Timeout)
	out, err := drain.Wait(ctx, rs.cfg.Drain, rs.loads, drain.Replica{ID: id, UID: uid, Serving: func() bool {
		st := rs.book.status(id)
		if st == nil || st.GetUid() != uid {
			return false
		}
		p := st.GetPhase()
		return p == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY || p == llmgwv1.ReplicaPhase_REPLICA_PHASE_UNHEALTHY
	}})
	if err != nil {
		if ctx.Err() == nil {
			log.Error("draining replica: cannot judge idleness; the control plane's drain timeout removes it", "err", err)
		}
		return
	}
	rs.mu.Lock()
	if ctx.Err() != nil {
		// Undrained, replaced or removed just as the wait ended.
		rs.mu.Unlock()
		return
	}
	r.drained = true
	rs.mu.Unlock()
	if out == drain.TimedOut {
		log.Warn("draining replica still busy at the drain timeout; stopping its engine", "timeout", rs.cfg.Drain.Timeout)
	} else {
		log.Info("draining replica idle; stopping its engine", "why", out.String())
	}
	r.cancel()
	<-r.done
	rs.metrics.drains.WithLabelValues(out.String()).Inc()
	rs.metrics.drainSeconds.Observe(rs.now().Sub(began).Seconds())
}

// run plans a replica's launch and supervises it until ctx ends.
func (rs *Set) run(ctx context.Context, r *runner) {
	rep := r.replica
	log := rs.log.With("replica", rep.GetId(), "model", rep.GetModel())
	report := rs.reporter(r)
	launch, ports, kvl, err := rs.plan(r)
	r.mu.Lock()
	r.launch, r.ports = launch, ports
	r.mu.Unlock()
	if kvl != nil {
		// Closed once the supervisor has returned: the listener outlives
		// every process of this placement, so a restarted engine connects
		// to the same socket.
		defer kvl.Close()
		r.mu.Lock()
		r.kvl = kvl
		r.mu.Unlock()
	}
	if err != nil {
		log.Error("cannot run replica", "err", err)
		report(&llmgwv1.ReplicaStatus{ReplicaId: rep.GetId(), Uid: rep.GetUid(), Model: rep.GetModel(),
			Node: rs.cfg.NodeID, Phase: llmgwv1.ReplicaPhase_REPLICA_PHASE_FAILED, Message: err.Error(),
			UpdatedUnixNano: rs.now().UnixNano()})
		<-ctx.Done()
		return
	}
	sc := supervisor.DefaultConfig()
	sc.ReplicaID, sc.UID, sc.Model, sc.Node = rep.GetId(), rep.GetUid(), rep.GetModel(), rs.cfg.NodeID
	sc.Launch = launch
	sc.LogPath = filepath.Join(rs.cfg.LogDir, rep.GetId()+".log")
	sc.ReadyTimeout, sc.StopGrace = rs.cfg.ReadyTimeout, rs.cfg.StopGrace
	sc.ProbeInterval = rs.cfg.ProbeInterval
	sc.Backoff = rs.cfg.RestartBackoff
	sc.Pdeathsig = rs.cfg.StopEnginesOnExit
	sc.Adopt = r.adopted
	if r.isExternal() {
		sc.FirstIncarnation = rs.nextExternalIncarnation(rep)
		sc.Dial = r.guard.DialContext
	}
	sup := supervisor.New(sc, report, rs.log)
	r.mu.Lock()
	r.sup = sup
	if r.detached {
		sup.Detach()
	}
	sup.SetSleeping(r.sleepNow)
	r.mu.Unlock()
	if err := sup.Run(ctx); err != nil {
		log.Error("supervisor ended", "err", err)
	}
}

// reporter records a runner's statuses while it is the replica's current
// placement: a replaced placement's last words must not overwrite the new
// one's.
func (rs *Set) reporter(r *runner) supervisor.Reporter {
	return func(st *llmgwv1.ReplicaStatus) {
		// Before the currency check: a replaced placement's engine is
		// stopped (and its record removed) before the new one starts.
		rs.record(r, st)
		if r.isExternal() {
			rs.recordExternal(r, st)
		}
		rs.mu.Lock()
		current := rs.running[r.replica.GetId()] == r
		rs.mu.Unlock()
		if !current {
			return
		}
		if st.GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_RESTARTING {
			rs.metrics.restarts.WithLabelValues(st.GetModel()).Inc()
		}
		if l := r.listener(); l != nil && st.GetIncarnation() > 0 {
			// Reported as the process starts, before it can publish.
			l.Engine(st.GetIncarnation())
			if n := st.GetKvCacheBlocks(); n > 0 && st.GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY {
				// The engine's own cache size bounds its mirror below the
				// configured cap (design §6 "KV events").
				l.SetEngineBlocks(int(min(n, math.MaxInt32)))
			}
		}
		rs.metrics.setPhase(st.GetReplicaId(), st.GetModel(), st.GetPhase())
		rs.book.put(st)
		if leaderNode(r.replica) == rs.cfg.NodeID {
			// The leader shard serves HTTP, hence the runtime LoRA API.
			rs.adapters.Engine(st, r.model)
		}
	}
}

func (rs *Set) now() time.Time {
	if rs.cfg.Now != nil {
		return rs.cfg.Now()
	}
	return time.Now()
}

// Logs returns a replica's last engine output lines.
func (rs *Set) Logs(id string) ([]string, bool) {
	rs.mu.Lock()
	r := rs.running[id]
	rs.mu.Unlock()
	if r == nil {
		return nil, false
	}
	if sup := r.supervisor(); sup != nil {
		return sup.Logs(), true
	}
	return nil, true
}

// detachAll marks every engine to be left running when the agent stops
// (design §6 "Engines outlive the agent"). Called before the supervisors'
// context is cancelled, so none of them stops its engine; a replica removed
// from the desired set before this is still stopped.
func (rs *Set) detachAll() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for _, r := range rs.running {
		r.mu.Lock()
		r.detached = true
		if r.sup != nil {
			r.sup.Detach()
		}
		r.mu.Unlock()
	}
}
