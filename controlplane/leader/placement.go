package leader

import (
	"context"
	"errors"
	"time"

	"github.com/llmgw/llmgw/controlplane/placement"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Place runs placement for one term, until ctx is done: one round on every
// applied entry, every change of the agents' reports (readiness moves
// rolling placements on) and every ReconcileInterval.
func (l *Leader) Place(ctx context.Context) {
	l.log.Info("leading; placement started")
	term := newTerm(l.now())
	t := time.NewTicker(l.cfg.ReconcileInterval)
	defer t.Stop()
	for {
		_, applied := l.state.Applied()
		statusChanged := l.reports.Changed()
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
	failed = l.markDown(ctx, term, st, now)
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

	plan := placement.Reconcile(st, in)
	for model, n := range plan.Unplaceable {
		l.log.Debug("replicas do not fit on any node", "model", model, "missing", n)
	}
	for _, mv := range plan.Spread {
		// The replacement is in plan.Place; one replica of From drains
		// once it is ready, on a later round (design §5.5).
		l.log.Info("spreading replicas: a replacement goes to a less-loaded node", "model", mv.Model, "from_node", mv.From, "target_node", mv.To)
	}
	for _, r := range plan.Remove {
		_, _, err := l.propose.Propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_REMOVE_REPLICA, &llmgwv1.RemoveReplicaCommand{Id: r.Id, Uid: r.Uid})
		failed = l.recordPlacement("remove", r, err) || failed
	}
	for _, r := range plan.Drain {
		_, _, err := l.propose.Propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_SET_REPLICA_DRAINING, &llmgwv1.SetReplicaDrainingCommand{Id: r.Id, Uid: r.Uid})
		failed = l.recordPlacement("drain", r, err) || failed
	}
	for _, r := range plan.Place {
		res, _, err := l.propose.Propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_PLACE_REPLICA, &llmgwv1.PlaceReplicaCommand{Replica: r})
		if placed, ok := res.(*llmgwv1.Replica); ok {
			r = placed
		}
		failed = l.recordPlacement("place", r, err) || failed
	}
	return failed
}

// markDown marks ACTIVE nodes DOWN once no control node has held a session
// for them for NodeDownAfter, counted from the later of the last session's
// end and this leader's election: the grace after winning office, so a
// failover never reschedules replicas that are still serving (design
// §5.4). Sessions on other servers are known from the ephemeral plane's
// session lists; without gossip they are invisible, so a leader without
// gossip judges only when it is the only server.
func (l *Leader) markDown(ctx context.Context, term *term, st *llmgwv1.State, now time.Time) (failed bool) {
	if !l.cluster.SessionsVisible() {
		return false
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
	}
	return failed
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
