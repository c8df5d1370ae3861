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
	s.log.Info("leading; placement started")
	t := time.NewTicker(s.cfg.ReconcileInterval)
	defer t.Stop()
	for {
		_, applied := s.fsm.Applied()
		failed := s.reconcileOnce(ctx)
		if failed {
			// A refused decision would be recomputed identically on the
			// revision its refusal made; wait for the tick instead.
			applied = nil
		}
		select {
		case <-ctx.Done():
			return
		case <-applied:
		case <-t.C:
		}
	}
}

// reconcileOnce proposes one round of placement decisions; it reports
// whether any of them failed.
func (s *Server) reconcileOnce(ctx context.Context) (failed bool) {
	plan := placement.Reconcile(s.fsm.State())
	for model, n := range plan.Unplaceable {
		s.log.Debug("replicas do not fit on any node", "model", model, "missing", n)
	}
	for _, r := range plan.Remove {
		_, _, err := s.propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_REMOVE_REPLICA, &llmgwv1.RemoveReplicaCommand{Id: r.Id, Uid: r.Uid})
		failed = s.recordPlacement("remove", r, err) || failed
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
