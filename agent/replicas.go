package agent

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/agent/adapters"
	"github.com/llmgw/llmgw/agent/datadir"
	"github.com/llmgw/llmgw/agent/drain"
	"github.com/llmgw/llmgw/agent/engine"
	"github.com/llmgw/llmgw/agent/kv"
	"github.com/llmgw/llmgw/agent/supervisor"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// replicaSet makes the node run its desired replicas: one supervisor per
// replica, keyed by (id, uid). A new uid under a known id is a new replica
// (design §4 "Identity"): the old engine is stopped before the new one starts,
// since both would want the same port and GPUs.
//
// It keeps running its last desired set when the control plane is out of
// reach; only a new desired set changes what runs.
type replicaSet struct {
	cfg  *Config
	log  *slog.Logger
	book *book
	kv   *kv.Hub
	// adapters loads the LoRA placements into the engines (design §6).
	adapters *adapters.Manager
	// loads are the node's load readings, by which a draining engine is
	// judged idle; set once, before any desired set is applied.
	loads   drain.Loads
	metrics *metrics
	ports   *datadir.Ports
	records engineRecords
	logDir  string
	// ctx is the life of every supervisor: cancelled when the agent stops.
	ctx context.Context

	wg      sync.WaitGroup
	mu      sync.Mutex
	running map[string]*runner
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
	// that wait stopped the engine. Guarded by replicaSet.mu.
	draining bool
	undrain  context.CancelFunc
	drained  bool

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
}

func (r *runner) supervisor() *supervisor.Supervisor {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sup
}

func (r *runner) listener() *kv.Listener {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.kvl
}

// apply converges on a desired set. It never blocks on an engine: starts and
// stops run in the replicas' own goroutines.
func (rs *replicaSet) apply(d *llmgwv1.DesiredReplicas) {
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
		rs.startLocked(rep, models[rep.GetModel()], old, nil)
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
func (rs *replicaSet) forget(id string, r *runner) {
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

func (rs *replicaSet) startLocked(rep *llmgwv1.Replica, model *llmgwv1.Model, prev *runner, adopt *supervisor.Adoption) {
	ctx, cancel := context.WithCancel(rs.ctx)
	r := &runner{replica: rep, model: model, ctx: ctx, cancel: cancel, done: make(chan struct{}), adopted: adopt,
		undrain: func() {}}
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
}

// drainLocked starts waiting for a draining placement's engine to go idle
// (package drain), then stops it: the supervisor sends SIGTERM, SIGKILL
// after the grace, and reports STOPPED, on which the control plane removes
// the replica (design §4 "Changes roll", §5.5). The placement stays in the
// running set, stopped, until the desired set drops it. The wait is owned
// by the placement's context: it ends when the placement is replaced or
// removed, when the agent stops, or on undrain.
func (rs *replicaSet) drainLocked(r *runner) {
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

func (rs *replicaSet) drain(ctx context.Context, r *runner) {
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
	log.Info("replica draining; its engine stops once idle", "quiet", rs.cfg.DrainQuiet, "timeout", rs.cfg.DrainTimeout)
	out, err := drain.Wait(ctx, rs.cfg.drainConfig(), rs.loads, drain.Replica{ID: id, UID: uid, Serving: func() bool {
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
		log.Warn("draining replica still busy at the drain timeout; stopping its engine", "timeout", rs.cfg.DrainTimeout)
	} else {
		log.Info("draining replica idle; stopping its engine", "why", out.String())
	}
	r.cancel()
	<-r.done
	rs.metrics.drains.WithLabelValues(out.String()).Inc()
	rs.metrics.drainSeconds.Observe(rs.now().Sub(began).Seconds())
}

// run plans a replica's launch and supervises it until ctx ends.
func (rs *replicaSet) run(ctx context.Context, r *runner) {
	rep := r.replica
	log := rs.log.With("replica", rep.GetId(), "model", rep.GetModel())
	report := rs.reporter(r)
	launch, ports, kvl, err := rs.plan(rep, r.model, r.adopted)
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
	sc.LogPath = filepath.Join(rs.logDir, rep.GetId()+".log")
	sc.ReadyTimeout, sc.StopGrace = rs.cfg.ReadyTimeout, rs.cfg.StopGrace
	sc.ProbeInterval = rs.cfg.ProbeInterval
	sc.Backoff = rs.cfg.RestartBackoff
	sc.Pdeathsig = rs.cfg.StopEnginesOnExit
	sc.Adopt = r.adopted
	if r.isExternal() {
		sc.FirstIncarnation = rs.nextExternalIncarnation(rep)
	}
	sup := supervisor.New(sc, report, rs.log)
	r.mu.Lock()
	r.sup = sup
	if r.detached {
		sup.Detach()
	}
	r.mu.Unlock()
	if err := sup.Run(ctx); err != nil {
		log.Error("supervisor ended", "err", err)
	}
}

// plan allocates the replica's ports, binds its KV-event listener where
// the model has one, and asks its engine's driver for a launch. The
// listener is returned even with an error, for the caller to close.
//
// For an adopted engine the ports are the ones it already listens on (held
// in the port store by adopt), and its listener catches up through the
// engine's replay socket on the batches published while no agent listened
// (design §6 "KV events"). The launch is the one the engine was started with,
// since drivers are pure; it is used should the engine need a restart.
func (rs *replicaSet) plan(rep *llmgwv1.Replica, model *llmgwv1.Model, adopted *supervisor.Adoption) (launch engine.Launch, ports map[string]int, kvl *kv.Listener, err error) {
	if model == nil {
		return engine.Launch{}, nil, nil, fmt.Errorf("replica %s: model %q not in the desired set", rep.GetId(), rep.GetModel())
	}
	spec := engine.Spec{Replica: rep, Model: model, Host: rs.cfg.AdvertiseAddr}
	if ec, ok := rs.cfg.Engines[model.GetEngine()]; ok {
		spec.Command, spec.Env = ec.Command, ec.Env
	}
	ports = map[string]int{}
	port := func(purpose, host string) (int, error) {
		key := rep.GetId() + "/" + purpose
		p, err := 0, error(nil)
		if adopted != nil {
			p, err = rs.ports.Held(key)
		} else {
			p, err = rs.ports.Get(key, host)
		}
		ports[purpose] = p
		return p, err
	}
	if model.GetEngine() == engine.External {
		if model.GetKvEvents() {
			kvl = rs.connectKV(rep, model)
		}
	} else {
		if spec.Port, err = port("http", rs.cfg.AdvertiseAddr); err != nil {
			return engine.Launch{}, nil, nil, err
		}
		if model.GetKvEvents() {
			// KV-event sockets stay on loopback (design §6).
			if spec.KVEventsPort, err = port("kv-events", "127.0.0.1"); err != nil {
				return engine.Launch{}, nil, nil, err
			}
			if spec.KVReplayPort, err = port("kv-replay", "127.0.0.1"); err != nil {
				return engine.Launch{}, nil, nil, err
			}
			if kvl = rs.listenKV(rep, model, spec.KVEventsPort, spec.KVReplayPort, adopted != nil); kvl == nil {
				m := proto.Clone(model).(*llmgwv1.Model)
				m.KvEvents = false
				spec.Model = m
			} else if adopted != nil {
				// At once, so the catch-up replay lands in this
				// incarnation's mirror rather than being reset by the
				// supervisor's first report.
				kvl.Engine(adopted.Incarnation)
			}
		}
	}
	launch, err = engine.Plan(spec)
	return launch, ports, kvl, err
}

// kvTopic is the topic the vllm and sim drivers give engines.
const kvTopic = "kv"

// listenKV binds the KV-event listener of a replica's leader shard before
// its engine starts (design §6 "KV events", §7.5), for the engines that
// publish vLLM's events. It returns nil where there is none to bind, and
// on failure, which is logged: the engine then starts without events and
// routers use tier 1 for it, rather than the replica not running at all
// for want of an optimisation.
func (rs *replicaSet) listenKV(rep *llmgwv1.Replica, model *llmgwv1.Model, port, replayPort int, catchUp bool) *kv.Listener {
	if eng := model.GetEngine(); eng != engine.VLLM && eng != engine.Sim {
		return nil
	}
	if leaderNode(rep) != rs.cfg.NodeID {
		return nil
	}
	cfg := kv.DefaultListenerConfig()
	cfg.ReplicaID, cfg.UID, cfg.Topic = rep.GetId(), rep.GetUid(), kvTopic
	cfg.Endpoint = "tcp://127.0.0.1:" + strconv.Itoa(port)
	cfg.ReplayEndpoint = "tcp://127.0.0.1:" + strconv.Itoa(replayPort)
	cfg.CatchUp = catchUp
	return rs.startKV(cfg, rep, model)
}

// startKV completes a listener's config from the model and the agent's
// settings and starts it; nil, logged, on failure.
func (rs *replicaSet) startKV(cfg kv.ListenerConfig, rep *llmgwv1.Replica, model *llmgwv1.Model) *kv.Listener {
	cfg.BlockSize, cfg.HashSeed = model.GetBlockSize(), model.GetHashSeed()
	if rs.cfg.KVMaxFrameBytes != 0 {
		cfg.MaxMessageBytes = rs.cfg.KVMaxFrameBytes
	}
	if cfg.BlockSize == 0 {
		cfg.BlockSize = engine.DefaultBlockSize
	}
	if cfg.HashSeed == "" {
		cfg.HashSeed = engine.DefaultHashSeed
	}
	l, err := rs.kv.Listen(cfg, rs.log.With("model", rep.GetModel()))
	if err != nil {
		rs.log.Warn("cannot receive kv cache events; the engine starts without them and routers use tier 1 for it",
			"replica", rep.GetId(), "model", rep.GetModel(), "err", err)
		return nil
	}
	return l
}

// leaderNode is the node of a replica's rank-0 shard, the one that serves
// HTTP and publishes KV events (design §4).
func leaderNode(rep *llmgwv1.Replica) string {
	for _, sh := range rep.GetShards() {
		if sh.GetRank() == 0 {
			return sh.GetNode()
		}
	}
	return rep.GetNode()
}

// reporter records a runner's statuses while it is the replica's current
// placement: a replaced placement's last words must not overwrite the new
// one's.
func (rs *replicaSet) reporter(r *runner) supervisor.Reporter {
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
		}
		rs.metrics.setPhase(st.GetReplicaId(), st.GetModel(), st.GetPhase())
		rs.book.put(st)
		if leaderNode(r.replica) == rs.cfg.NodeID {
			// The leader shard serves HTTP, hence the runtime LoRA API.
			rs.adapters.Engine(st, r.model)
		}
	}
}

func (rs *replicaSet) now() time.Time {
	if rs.cfg.Now != nil {
		return rs.cfg.Now()
	}
	return time.Now()
}

// logs returns a replica's last engine output lines.
func (rs *replicaSet) logs(id string) ([]string, bool) {
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
func (rs *replicaSet) detachAll() {
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

// wait returns once every replica goroutine has ended; the caller cancels
// their context first.
func (rs *replicaSet) wait() { rs.wg.Wait() }
