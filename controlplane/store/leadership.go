package store

import (
	"context"
	"sync"

	"github.com/hashicorp/raft"
)

// RunLeadership runs lead for each term this node leads, until ctx is done.
// On gaining leadership it first waits for a Barrier, so the FSM has
// applied everything earlier leaders committed; LeaderReady is true from
// then until lead returns. On losing leadership lead's context is
// cancelled and RunLeadership waits for it to return before it handles the
// next change (design §5.1). It returns only after the last lead has.
func (s *Store) RunLeadership(ctx context.Context, lead func(ctx context.Context)) {
	var wg sync.WaitGroup
	stop := func() {}
	defer func() { stop(); wg.Wait() }()
	for {
		select {
		case <-ctx.Done():
			return
		case leading := <-s.raft.LeaderCh():
			stop()
			wg.Wait()
			if !leading {
				s.log.Info("lost leadership; leader loops stopped")
				continue
			}
			lctx, cancel := context.WithCancel(ctx)
			stop = cancel
			wg.Go(func() { s.term(lctx, lead) })
		}
	}
}

// term is one term's Barrier, then lead.
func (s *Store) term(ctx context.Context, lead func(ctx context.Context)) {
	if err := s.raft.Barrier(s.cfg.ApplyTimeout).Error(); err != nil {
		s.log.Error("barrier after gaining leadership; leader loops not started", "err", err)
		return
	}
	// Every entry of earlier terms is applied now: consistent reads may be
	// served from this FSM (as Consul does after its barrier).
	s.leaderReady.Store(true)
	defer s.leaderReady.Store(false)
	lead(ctx)
}

// Observe counts and logs leader changes from raft's observer until ctx is
// done.
func (s *Store) Observe(ctx context.Context) {
	ch := make(chan raft.Observation, 16)
	obs := raft.NewObserver(ch, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	s.raft.RegisterObserver(obs)
	defer s.raft.DeregisterObserver(obs)
	for {
		select {
		case <-ctx.Done():
			return
		case o := <-ch:
			lo := o.Data.(raft.LeaderObservation)
			s.metrics.leaderChanges.Inc()
			s.log.Info("leader changed", "leader", string(lo.LeaderID), "leader_addr", string(lo.LeaderAddr))
		}
	}
}
