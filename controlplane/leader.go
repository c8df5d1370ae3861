package controlplane

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/llmgw/llmgw/controlplane/placement"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// leaderLoop runs the leader-only loops while this node leads: started after
// a Barrier (so the FSM has applied everything the previous leader
// committed) and stopped, and waited for, on losing leadership (plan §5.1).
func (s *Server) leaderLoop(ctx context.Context) {
	var wg sync.WaitGroup
	stop := func() {}
	defer func() { stop(); wg.Wait() }()
	for {
		select {
		case <-ctx.Done():
			return
		case leading := <-s.node.raft.LeaderCh():
			stop()
			wg.Wait()
			if !leading {
				s.log.Info("lost leadership; placement stopped")
				continue
			}
			lctx, cancel := context.WithCancel(ctx)
			stop = cancel
			wg.Go(func() { s.placeWhileLeading(lctx) })
		}
	}
}

func (s *Server) placeWhileLeading(ctx context.Context) {
	if err := s.node.raft.Barrier(s.cfg.ApplyTimeout).Error(); err != nil {
		s.log.Error("barrier after gaining leadership; placement not started", "err", err)
		return
	}
	// Every entry of earlier terms is applied now: consistent reads may be
	// served from this FSM (as Consul does after its barrier).
	s.leaderReady.Store(true)
	defer s.leaderReady.Store(false)
	// Membership and autopilot run beside placement, for the same term;
	// this returns only after they have stopped.
	var membership sync.WaitGroup
	defer membership.Wait()
	membership.Go(func() { s.membershipWhileLeading(ctx) })
	s.log.Info("leading; placement started")
	term := newLeaderTerm(s.now())
	t := time.NewTicker(s.cfg.ReconcileInterval)
	defer t.Stop()
	for {
		_, applied := s.fsm.Applied()
		// Readiness moves rolling placements on, so status changes wake
		// this loop too.
		statusChanged := s.eph.Changed()
		if s.reconcileOnce(ctx, term) {
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

// leaderTerm is what the leader remembers during one term, by its own
// clock: when it took office and since when it has seen each node DOWN and
// each replica draining. A new leader starts afresh, so it never judges by
// a clock it did not watch (plan §5.4: the grace after winning office).
type leaderTerm struct {
	since     time.Time
	downSeen  map[string]time.Time
	drainSeen map[replicaKey]time.Time
}

type replicaKey struct {
	id  string
	uid uint64
}

func newLeaderTerm(now time.Time) *leaderTerm {
	return &leaderTerm{since: now, downSeen: map[string]time.Time{}, drainSeen: map[replicaKey]time.Time{}}
}

// reconcileOnce marks lost nodes down and proposes one round of placement
// decisions; it reports whether any of them failed.
func (s *Server) reconcileOnce(ctx context.Context, term *leaderTerm) (failed bool) {
	now := s.now()
	st := s.fsm.State()
	failed = s.markDown(ctx, term, st, now)
	status := s.eph.StatusOf
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
			return now.Sub(term.drainSeen[replicaKey{r.Id, r.Uid}]) >= s.cfg.DrainTimeout
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
		in.Lost[n.Id] = now.Sub(term.downSeen[n.Id]) >= s.cfg.RescheduleAfter
	}

	plan := placement.Reconcile(st, in)
	for model, n := range plan.Unplaceable {
		s.log.Debug("replicas do not fit on any node", "model", model, "missing", n)
	}
	for _, r := range plan.Remove {
		_, _, err := s.propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_REMOVE_REPLICA, &llmgwv1.RemoveReplicaCommand{Id: r.Id, Uid: r.Uid})
		failed = s.recordPlacement("remove", r, err) || failed
	}
	for _, r := range plan.Drain {
		_, _, err := s.propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_SET_REPLICA_DRAINING, &llmgwv1.SetReplicaDrainingCommand{Id: r.Id, Uid: r.Uid})
		failed = s.recordPlacement("drain", r, err) || failed
	}
	for _, r := range plan.Place {
		res, _, err := s.propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_PLACE_REPLICA, &llmgwv1.PlaceReplicaCommand{Replica: r})
		if placed, ok := res.(*llmgwv1.Replica); ok {
			r = placed
		}
		failed = s.recordPlacement("place", r, err) || failed
	}
	return failed
}

// markDown marks ACTIVE nodes DOWN once no control node has held a session
// for them for NodeDownAfter, counted from the later of the last session's
// end and this leader's election: the grace after winning office, so a
// failover never reschedules replicas that are still serving (plan §5.4).
// Sessions on other servers are known from the ephemeral plane's session
// lists; without gossip they are invisible, so a leader without gossip
// judges only when it is the only server.
func (s *Server) markDown(ctx context.Context, term *leaderTerm, st *llmgwv1.State, now time.Time) (failed bool) {
	if s.gossip == nil && len(s.servers()) != 1 {
		return false
	}
	for _, n := range st.Nodes {
		if n.State != llmgwv1.NodeState_NODE_STATE_ACTIVE {
			continue
		}
		at, detached := s.detachedSince(n.Id)
		if !detached {
			continue
		}
		if at.Before(term.since) {
			at = term.since
		}
		if now.Sub(at) < s.cfg.NodeDownAfter {
			continue
		}
		_, _, err := s.propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_SET_NODE_STATE, &llmgwv1.SetNodeStateCommand{Id: n.Id, State: llmgwv1.NodeState_NODE_STATE_DOWN})
		if err != nil {
			s.log.Warn("marking node down failed", "target_node", n.Id, "err", err)
			failed = true
			continue
		}
		s.log.Warn("node marked down: no agent session", "target_node", n.Id, "since", at)
	}
	return failed
}

func (s *Server) recordPlacement(action string, r *llmgwv1.Replica, err error) bool {
	if err != nil {
		s.metrics.placements.WithLabelValues(action, "failed").Inc()
		if !errors.Is(err, context.Canceled) {
			s.log.Warn("placement decision failed", "action", action, "model", r.Model, "replica", r.Id, "target_node", r.Node, "err", err)
		}
		return true
	}
	s.metrics.placements.WithLabelValues(action, "ok").Inc()
	s.log.Info("placement decision", "action", action, "model", r.Model, "replica", r.Id, "uid", r.Uid, "target_node", r.Node, "gpus", r.GpuIndices)
	return false
}
