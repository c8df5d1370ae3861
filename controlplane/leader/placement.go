package leader

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/controlplane/placement"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

const (
	// DefaultPlaceInterval is the least time between two placement rounds.
	// A round at 2,000 replicas costs ~2 ms (a copy of the state and
	// placement.Reconcile), so rounds at most this often cost under a
	// tenth of a core however busy the fleet, and a change made while the
	// leader is idle is still acted on at once; one made just after a
	// round waits at most this long, which keeps a scale step within 50 ms
	// of its decision to its placement's commit (issue 30).
	DefaultPlaceInterval = 25 * time.Millisecond
	// DefaultPlaceInFlight bounds a round's decisions in flight at once
	// (Raft's batch: hashicorp/raft's MaxAppendEntries is 64). Proposed
	// one after another, 2,000 placements are 2,000 commits back to back;
	// in flight together, Raft writes and replicates them in batches.
	DefaultPlaceInFlight = 64
)

// Place runs placement for one term, until ctx is done: a round on applied
// entries, on changes of the agents' reports (readiness moves rolling
// placements on) and every ReconcileInterval — at most one round per
// PlaceInterval, whatever comes meanwhile (issue 30: an autoscaler writes
// often, and every agent's report once woke a round over the whole fleet).
// A change that finds the loop idle past the interval is acted on at once.
// Pacing, like the tick, is by the real clock: it spreads work, it judges
// nothing (l.now is the clock of judgements).
func (l *Leader) Place(ctx context.Context) {
	l.log.Info("leading; placement started")
	// The reasons are this term's: a server that does not lead says none.
	defer l.unplaced.set(nil)
	term := newTerm(l.now())
	t := time.NewTicker(l.cfg.ReconcileInterval)
	defer t.Stop()
	gap := l.cfg.PlaceInterval
	if gap <= 0 {
		gap = DefaultPlaceInterval
	}
	pace := time.NewTimer(gap)
	defer pace.Stop()
	for {
		_, applied := l.state.Applied()
		statusChanged := l.reports.Changed()
		started := time.Now()
		if l.reconcileOnce(ctx, term) {
			// A refused decision would be recomputed identically on the
			// revision its refusal made; wait for the tick instead.
			applied, statusChanged = nil, nil
		}
		select {
		case <-ctx.Done():
			return
		case <-applied:
		case <-statusChanged:
		case <-t.C:
		}
		// Whatever else applies or reports meanwhile is in the state the
		// next round reads: one round for all of it.
		if wait := gap - time.Since(started); wait > 0 {
			pace.Reset(wait)
			select {
			case <-ctx.Done():
				return
			case <-pace.C:
			}
		}
	}
}

// term is what the leader remembers during one term, by its own clock:
// when it took office and since when it has seen each node DOWN and each
// replica draining (design §5.4: the grace after winning office).
type term struct {
	since     time.Time
	downSeen  map[string]time.Time
	drainSeen map[replicaKey]time.Time
}

type replicaKey struct {
	id  string
	uid uint64
}

func newTerm(now time.Time) *term {
	return &term{since: now, downSeen: map[string]time.Time{}, drainSeen: map[replicaKey]time.Time{}}
}

// reconcileOnce marks lost nodes down and proposes one round of placement
// decisions; it reports whether any of them failed.
func (l *Leader) reconcileOnce(ctx context.Context, term *term) (failed bool) {
	now := l.now()
	st := l.state.State()
	marked, failed := l.markDown(ctx, term, st, now)
	status := l.reports.StatusOf
	in := placement.Inputs{
		Ready: func(r *llmgwv1.Replica) bool {
			return status(r).GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY
		},
		Drained: func(r *llmgwv1.Replica) bool {
			switch status(r).GetPhase() {
			case llmgwv1.ReplicaPhase_REPLICA_PHASE_UNSPECIFIED, // not reported: nothing runs
				llmgwv1.ReplicaPhase_REPLICA_PHASE_STOPPED, llmgwv1.ReplicaPhase_REPLICA_PHASE_FAILED:
				return true
			}
			return now.Sub(term.drainSeen[replicaKey{r.Id, r.Uid}]) >= l.cfg.DrainTimeout
		},
		Lost: map[string]bool{},
		Idle: l.idle,
	}
	seenDraining := map[replicaKey]bool{}
	for _, r := range st.Replicas {
		if r.Draining {
			k := replicaKey{r.Id, r.Uid}
			seenDraining[k] = true
			if _, ok := term.drainSeen[k]; !ok {
				term.drainSeen[k] = now
			}
		}
	}
	for k := range term.drainSeen {
		if !seenDraining[k] {
			delete(term.drainSeen, k)
		}
	}
	for _, n := range st.Nodes {
		if n.State != llmgwv1.NodeState_NODE_STATE_DOWN {
			delete(term.downSeen, n.Id)
			continue
		}
		if _, ok := term.downSeen[n.Id]; !ok {
			term.downSeen[n.Id] = now
		}
		in.Lost[n.Id] = now.Sub(term.downSeen[n.Id]) >= l.cfg.RescheduleAfter
	}
	// A node this round marked DOWN was seen DOWN now, though st, read
	// before, has it ACTIVE: the grace counts from here, not from the next
	// round, which pacing may start a little later.
	for _, id := range marked {
		term.downSeen[id] = now
	}

	plan := placement.Reconcile(st, in)
	l.sayUnplaced(plan)
	for _, mv := range plan.Spread {
		// The replacement is in plan.Place; one replica of From drains
		// once it is ready, on a later round (design §5.5).
		l.log.Info("spreading replicas: a replacement goes to a less-loaded node", "model", mv.Model, "from_node", mv.From, "target_node", mv.To)
	}
	// Removals first (they free GPUs the placements may take), then
	// drains, then placements; within each, up to PlaceInFlight at once.
	failed = l.proposeAll(ctx, "remove", plan.Remove, func(r *llmgwv1.Replica) (llmgwv1.CommandType, proto.Message) {
		return llmgwv1.CommandType_COMMAND_TYPE_REMOVE_REPLICA, &llmgwv1.RemoveReplicaCommand{Id: r.Id, Uid: r.Uid}
	}) || failed
	failed = l.proposeAll(ctx, "drain", plan.Drain, func(r *llmgwv1.Replica) (llmgwv1.CommandType, proto.Message) {
		return llmgwv1.CommandType_COMMAND_TYPE_SET_REPLICA_DRAINING, &llmgwv1.SetReplicaDrainingCommand{Id: r.Id, Uid: r.Uid}
	}) || failed
	// GPUs shared between models (design §5.7): a donor gives its GPU up
	// (asleep, or draining) for a model of higher priority; surplus
	// replicas of sleeping models park; short ones wake.
	var sleep, drainFor []*llmgwv1.Replica
	for _, t := range plan.Take {
		l.log.Info("taking an idle model's GPU for a model of higher priority", "replica", t.Replica.Id, "model", t.Replica.Model, "for", t.For, "sleep", t.Sleep)
		if t.Sleep {
			sleep = append(sleep, t.Replica)
		} else {
			drainFor = append(drainFor, t.Replica)
		}
	}
	failed = l.proposeAll(ctx, "drain", drainFor, func(r *llmgwv1.Replica) (llmgwv1.CommandType, proto.Message) {
		return llmgwv1.CommandType_COMMAND_TYPE_SET_REPLICA_DRAINING, &llmgwv1.SetReplicaDrainingCommand{Id: r.Id, Uid: r.Uid}
	}) || failed
	failed = l.proposeAll(ctx, "sleep", append(sleep, plan.Sleep...), func(r *llmgwv1.Replica) (llmgwv1.CommandType, proto.Message) {
		return llmgwv1.CommandType_COMMAND_TYPE_SET_REPLICA_SLEEPING, &llmgwv1.SetReplicaSleepingCommand{Id: r.Id, Uid: r.Uid, Sleeping: true}
	}) || failed
	failed = l.proposeAll(ctx, "wake", plan.Wake, func(r *llmgwv1.Replica) (llmgwv1.CommandType, proto.Message) {
		return llmgwv1.CommandType_COMMAND_TYPE_SET_REPLICA_SLEEPING, &llmgwv1.SetReplicaSleepingCommand{Id: r.Id, Uid: r.Uid, Sleeping: false}
	}) || failed
	failed = l.proposeAll(ctx, "place", plan.Place, func(r *llmgwv1.Replica) (llmgwv1.CommandType, proto.Message) {
		return llmgwv1.CommandType_COMMAND_TYPE_PLACE_REPLICA, &llmgwv1.PlaceReplicaCommand{Replica: r}
	}) || failed
	return failed
}

// idle reports whether the routers' demand, as the autoscaler last read
// it, shows nothing using model (design §5.7): only such a model gives a
// GPU to another. A model the routers do not report on is not idle.
func (l *Leader) idle(model string) bool {
	l.scaleMu.Lock()
	sc := l.scaler
	l.scaleMu.Unlock()
	if sc == nil {
		return false
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	s := sc.models[model]
	return s != nil && placement.Idle(s.demand)
}

// proposeAll proposes one command per replica of a kind (action), at most
// PlaceInFlight at once, records each and reports whether any failed. Raft
// commits the entries in flight together — one log write and one round
// trip for many — which is what makes placing 2,000 replicas take a second
// rather than 2,000 commits in a row (issue 30). The decisions of one kind
// never conflict (placement gave each its own GPUs), so their order in the
// log only decides which new replica gets which ordinal. Nothing more is
// proposed once ctx is done.
func (l *Leader) proposeAll(ctx context.Context, action string, rs []*llmgwv1.Replica, cmd func(*llmgwv1.Replica) (llmgwv1.CommandType, proto.Message)) bool {
	one := func(r *llmgwv1.Replica) bool {
		t, msg := cmd(r)
		res, _, err := l.propose.Propose(ctx, t, msg)
		if placed, ok := res.(*llmgwv1.Replica); ok {
			r = placed
		}
		return l.recordPlacement(action, r, err)
	}
	n := l.cfg.PlaceInFlight
	if n <= 0 {
		n = DefaultPlaceInFlight
	}
	if n == 1 || len(rs) == 1 {
		failed := false
		for _, r := range rs {
			if ctx.Err() != nil {
				return true
			}
			failed = one(r) || failed
		}
		return failed
	}
	var (
		wg      sync.WaitGroup
		anyFail atomic.Bool
		slot    = make(chan struct{}, n)
	)
	for _, r := range rs {
		if ctx.Err() != nil {
			anyFail.Store(true)
			break
		}
		slot <- struct{}{}
		wg.Go(func() {
			defer func() { <-slot }()
			if one(r) {
				anyFail.Store(true)
			}
		})
	}
	wg.Wait()
	return anyFail.Load()
}

// sayUnplaced keeps the round's reasons for Unplaced and logs each model's
// once per change (design §5.7 "Saying why"), not once per round.
func (l *Leader) sayUnplaced(plan placement.Plan) {
	changed, cleared := l.unplaced.set(plan.Unplaced)
	for _, m := range changed {
		l.log.Warn("replicas cannot be placed", "model", m, "missing", plan.Unplaceable[m], "reason", plan.Unplaced[m])
	}
	for _, m := range cleared {
		l.log.Info("no replica of the model is left unplaced", "model", m)
	}
}

// markDown marks ACTIVE nodes DOWN once no control node has held a session
// for them for NodeDownAfter, counted from the later of the last session's
// end and this leader's election: the grace after winning office, so a
// failover never reschedules replicas that are still serving (design
// §5.4). Sessions on other servers are known from the ephemeral plane's
// session lists; without gossip they are invisible, so a leader without
// gossip judges only when it is the only server. It returns the nodes it
// marked.
func (l *Leader) markDown(ctx context.Context, term *term, st *llmgwv1.State, now time.Time) (marked []string, failed bool) {
	if !l.cluster.SessionsVisible() {
		return nil, false
	}
	for _, n := range st.Nodes {
		if n.State != llmgwv1.NodeState_NODE_STATE_ACTIVE {
			continue
		}
		at, detached := l.sessions.DetachedSince(n.Id)
		if !detached {
			continue
		}
		if at.Before(term.since) {
			at = term.since
		}
		if now.Sub(at) < l.cfg.NodeDownAfter {
			continue
		}
		_, _, err := l.propose.Propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_SET_NODE_STATE, &llmgwv1.SetNodeStateCommand{Id: n.Id, State: llmgwv1.NodeState_NODE_STATE_DOWN})
		if err != nil {
			l.log.Warn("marking node down failed", "target_node", n.Id, "err", err)
			failed = true
			continue
		}
		l.log.Warn("node marked down: no agent session", "target_node", n.Id, "since", at)
		marked = append(marked, n.Id)
	}
	return marked, failed
}

func (l *Leader) recordPlacement(action string, r *llmgwv1.Replica, err error) bool {
	if err != nil {
		l.metrics.placements.WithLabelValues(action, "failed").Inc()
		if !errors.Is(err, context.Canceled) {
			l.log.Warn("placement decision failed", "action", action, "model", r.Model, "replica", r.Id, "target_node", r.Node, "err", err)
		}
		return true
	}
	l.metrics.placements.WithLabelValues(action, "ok").Inc()
	if r.Endpoint != "" {
		// An external engine's replica: the node owns (probes) it.
		l.log.Info("placement decision", "action", action, "model", r.Model, "replica", r.Id, "uid", r.Uid, "target_node", r.Node, "endpoint", r.Endpoint)
		return false
	}
	l.log.Info("placement decision", "action", action, "model", r.Model, "replica", r.Id, "uid", r.Uid, "target_node", r.Node, "gpus", r.GpuIndices)
	return false
}
