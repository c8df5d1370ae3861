package controlplane

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	autopilot "github.com/hashicorp/raft-autopilot"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Raft figures a server attaches to its ClusterStatus answer as gRPC
// headers, so the leader's autopilot can judge its health. The proto has no
// fields for them (see the package doc).
const (
	hdrLastIndex   = "llmgw-raft-last-index"
	hdrLastTerm    = "llmgw-raft-last-term"
	hdrLastContact = "llmgw-raft-last-contact-ms"
)

// bootstrapLoop is --bootstrap-expect (plan §5.2). It ends once this server
// is part of a Raft configuration — bootstrapped by itself or added by a
// leader — or ctx ends. The rules, each against a known split brain
// (anchors §4.6):
//   - a server with Raft state never bootstraps (it is not started at all);
//   - a peer started with another expectation (or with --bootstrap) stops
//     the bootstrap, with an error in the log and in /readyz;
//   - a peer that already has voters or a leader means a cluster exists:
//     wait for its leader to add this server;
//   - otherwise, once `expect` servers with the same expectation see each
//     other, only the lowest id bootstraps, with all of them as voters; the
//     others are brought in by its first heartbeats. One bootstrapper means
//     two servers with different views of the pool cannot configure two
//     clusters.
func (s *Server) bootstrapLoop(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	reported := map[string]bool{}
	lastWait := time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if len(s.raftServers()) > 0 || s.hasLeader() {
			s.bootstrapProblem.Store("")
			s.log.Info("part of a raft configuration; bootstrap wait over")
			return
		}
		expect := s.cfg.BootstrapExpect
		var peers []member
		problem := ""
		for _, id := range sortedIDs(s.gossip.snapshot()) {
			m, _ := s.gossip.memberByID(id)
			if m.status != statusAlive && m.status != statusSuspect {
				continue
			}
			switch {
			case m.meta.Bootstrap:
				problem = fmt.Sprintf("server %s was started with --bootstrap, this one with --bootstrap-expect %d: refusing to bootstrap", id, expect)
			case m.meta.Expect != 0 && m.meta.Expect != expect:
				problem = fmt.Sprintf("server %s expects %d servers (--bootstrap-expect), this one %d: refusing to bootstrap; start every server with the same value", id, m.meta.Expect, expect)
			case m.meta.Expect == expect:
				peers = append(peers, m)
			}
			if problem != "" && !reported[problem] {
				reported[problem] = true
				s.log.Error("bootstrap refused", "member", id, "err", problem)
			}
		}
		s.bootstrapProblem.Store(problem)
		if problem != "" {
			continue
		}
		if len(peers) < expect {
			if time.Since(lastWait) > 5*time.Second {
				lastWait = time.Now()
				s.log.Info("waiting for servers to bootstrap", "seen", len(peers), "expect", expect)
			}
			continue
		}
		if existing := s.findExistingCluster(ctx, peers); existing != "" {
			if !reported[existing] {
				reported[existing] = true
				s.log.Info("a peer is already in a cluster; waiting for its leader to add this server", "member", existing)
			}
			continue
		}
		if peers[0].meta.ID != s.cfg.NodeID {
			continue // the lowest id bootstraps; its leader adds us
		}
		var boot raft.Configuration
		for _, p := range peers {
			boot.Servers = append(boot.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(p.meta.ID), Address: raft.ServerAddress(p.meta.Raft)})
		}
		if err := s.node.raft.BootstrapCluster(boot).Error(); err != nil {
			s.log.Warn("bootstrap not done", "err", err)
			return
		}
		ids := make([]string, len(peers))
		for i, p := range peers {
			ids[i] = p.meta.ID
		}
		s.log.Info("bootstrapped the cluster", "voters", ids)
		return
	}
}

// findExistingCluster asks each peer for its Raft view and returns the id
// of one that already has voters or a leader ("" when none does). A peer
// that does not answer counts as existing, so nothing is bootstrapped on a
// partial view.
func (s *Server) findExistingCluster(ctx context.Context, peers []member) string {
	for _, p := range peers {
		if p.meta.ID == s.cfg.NodeID {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		cs, err := llmgwv1.NewAdminServiceClient(s.conns.get(p.meta.GRPC)).ClusterStatus(cctx, &llmgwv1.ClusterStatusRequest{})
		cancel()
		if err != nil || cs.Voters > 0 || cs.Leader != "" {
			return p.meta.ID
		}
	}
	return ""
}

// raftServers returns the latest Raft configuration as this node knows it.
func (s *Server) raftServers() []raft.Server {
	f := s.node.raft.GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	return f.Configuration().Servers
}

// expectMismatch reports whether a server's start-up expectation conflicts
// with this one's: both set and different.
func (s *Server) expectMismatch(m serverMeta) bool {
	return m.Expect != 0 && s.cfg.BootstrapExpect != 0 && m.Expect != s.cfg.BootstrapExpect
}

// membershipWhileLeading makes Raft membership follow gossip (plan §5.2,
// Consul's reconcile) and runs autopilot, while this node leads. It
// returns after autopilot and every removal it started have stopped.
func (s *Server) membershipWhileLeading(ctx context.Context) {
	if s.gossip == nil {
		return // no gossip: membership is the operator's (a hand-formed cluster)
	}
	ap := autopilot.New(s.node.raft, (*autopilotDelegate)(s),
		autopilot.WithLogger(newHCLogger(s.log.With("subsystem", "autopilot"))),
		autopilot.WithUpdateInterval(s.cfg.AutopilotInterval),
		autopilot.WithReconcileInterval(s.cfg.ReconcileInterval))
	var removals sync.WaitGroup
	s.removalsMu.Lock()
	s.removals = &removals
	s.removalsMu.Unlock()
	ap.Start(ctx)
	defer func() {
		<-ap.Stop()
		s.removalsMu.Lock()
		s.removals = nil
		s.removalsMu.Unlock()
		removals.Wait()
		s.autopilotState.Store(nil)
	}()
	reported := map[string]bool{}
	t := time.NewTicker(s.cfg.ReconcileInterval)
	defer t.Stop()
	for {
		s.reconcileMembers(reported)
		select {
		case <-ctx.Done():
			return
		case <-s.gossip.changed:
		case <-t.C:
		}
	}
}

// reconcileMembers adds live servers that gossip knows and Raft does not as
// non-voters (autopilot promotes them once stable), and removes servers
// that left. A removed (tombstoned) server is not added back until an
// explicit join clears it; a server with a conflicting expectation is
// refused.
func (s *Server) reconcileMembers(reported map[string]bool) {
	inConf := map[string]raft.Server{}
	for _, srv := range s.raftServers() {
		inConf[string(srv.ID)] = srv
	}
	for id, m := range s.gossip.snapshot() {
		if id == s.cfg.NodeID {
			continue
		}
		_, in := inConf[id]
		switch m.status {
		case statusAlive, statusSuspect:
			if in || s.gossip.removed(id) {
				continue
			}
			if why := s.refusal(m.meta); why != "" {
				if key := "refused/" + id + "/" + why; !reported[key] {
					reported[key] = true
					s.log.Error("server refused: not added to raft", "member", id, "its_version", m.meta.Version, "reason", why)
				}
				continue
			}
			if err := s.node.raft.AddNonvoter(raft.ServerID(id), raft.ServerAddress(m.meta.Raft), 0, s.cfg.ApplyTimeout).Error(); err != nil {
				s.log.Warn("adding server as non-voter failed", "member", id, "err", err)
				continue
			}
			s.log.Info("server added to raft as non-voter", "member", id, "raft_addr", m.meta.Raft)
		case statusLeft:
			if !in {
				continue
			}
			if err := s.node.raft.RemoveServer(raft.ServerID(id), 0, s.cfg.ApplyTimeout).Error(); err != nil {
				s.log.Warn("removing a server that left failed", "member", id, "err", err)
				continue
			}
			s.log.Info("server that left removed from raft", "member", id)
		}
	}
}

// autopilotDelegate is autopilot's view of the application: gossip says who
// is alive, each server's ClusterStatus headers say how far its log is.
type autopilotDelegate Server

func (d *autopilotDelegate) AutopilotConfig() *autopilot.Config {
	return &autopilot.Config{
		CleanupDeadServers:      d.cfg.CleanupDeadServers,
		LastContactThreshold:    max(200*time.Millisecond, d.cfg.HeartbeatTimeout/2),
		MaxTrailingLogs:         250,
		MinQuorum:               uint(d.cfg.BootstrapExpect),
		ServerStabilizationTime: d.cfg.ServerStabilizationTime,
	}
}

func (d *autopilotDelegate) NotifyState(st *autopilot.State) { d.autopilotState.Store(st) }

func (d *autopilotDelegate) FetchServerStats(ctx context.Context, servers map[raft.ServerID]*autopilot.Server) map[raft.ServerID]*autopilot.ServerStats {
	s := (*Server)(d)
	out := map[raft.ServerID]*autopilot.ServerStats{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for id := range servers {
		if string(id) == s.cfg.NodeID {
			idx, term, _ := s.localRaftStats()
			mu.Lock()
			out[id] = &autopilot.ServerStats{LastIndex: idx, LastTerm: term}
			mu.Unlock()
			continue
		}
		m, ok := s.gossip.memberByID(string(id))
		if !ok || (m.status != statusAlive && m.status != statusSuspect) {
			continue
		}
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, max(s.cfg.AutopilotInterval/2, 100*time.Millisecond))
			defer cancel()
			var hdr metadata.MD
			_, err := llmgwv1.NewAdminServiceClient(s.conns.get(m.meta.GRPC)).ClusterStatus(cctx, &llmgwv1.ClusterStatusRequest{}, grpc.Header(&hdr))
			if err != nil {
				return
			}
			num := func(k string) int64 {
				v := hdr.Get(k)
				if len(v) == 0 {
					return -1
				}
				n, err := strconv.ParseInt(v[0], 10, 64)
				if err != nil {
					return -1
				}
				return n
			}
			idx, term, lc := num(hdrLastIndex), num(hdrLastTerm), num(hdrLastContact)
			if idx < 0 || term < 0 || lc < 0 {
				return
			}
			mu.Lock()
			out[id] = &autopilot.ServerStats{LastIndex: uint64(idx), LastTerm: uint64(term), LastContact: time.Duration(lc) * time.Millisecond}
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

func (d *autopilotDelegate) KnownServers() map[raft.ServerID]*autopilot.Server {
	s := (*Server)(d)
	members := s.gossip.snapshot()
	_, leader := s.node.raft.LeaderWithID()
	out := map[raft.ServerID]*autopilot.Server{}
	add := func(id, addr, version string, st autopilot.NodeStatus) {
		out[raft.ServerID(id)] = &autopilot.Server{
			ID: raft.ServerID(id), Name: id, Address: raft.ServerAddress(addr), NodeStatus: st,
			Version: version, RaftVersion: raft.ProtocolVersionMax, IsLeader: raft.ServerID(id) == leader,
			NodeType: autopilot.NodeVoter,
		}
	}
	for id, m := range members {
		st := autopilot.NodeUnknown
		switch m.status {
		case statusAlive, statusSuspect:
			st = autopilot.NodeAlive
		case statusDead:
			st = autopilot.NodeFailed
		case statusLeft:
			st = autopilot.NodeLeft
		}
		if s.gossip.removed(id) {
			st = autopilot.NodeLeft
		}
		add(id, m.meta.Raft, m.meta.Version, st)
	}
	// A server in the configuration that gossip has not (yet) seen is
	// unknown, never "stale": autopilot would otherwise remove it the moment
	// a new leader's gossip view lags.
	for _, srv := range s.raftServers() {
		if _, ok := out[srv.ID]; !ok {
			add(string(srv.ID), string(srv.Address), "", autopilot.NodeUnknown)
		}
	}
	return out
}

// RemoveFailedServer removes a server gossip reports dead or left;
// autopilot has already kept the removal above MinQuorum. It must return
// at once, so the removal runs in a goroutine membershipWhileLeading waits
// for.
func (d *autopilotDelegate) RemoveFailedServer(srv *autopilot.Server) {
	s := (*Server)(d)
	if srv.NodeStatus != autopilot.NodeFailed && srv.NodeStatus != autopilot.NodeLeft {
		return
	}
	s.removalsMu.Lock()
	defer s.removalsMu.Unlock()
	if s.removals == nil {
		return
	}
	s.removals.Go(func() {
		if err := s.node.raft.RemoveServer(srv.ID, 0, s.cfg.ApplyTimeout).Error(); err != nil {
			s.log.Warn("autopilot: removing a failed server failed", "member", string(srv.ID), "err", err)
			return
		}
		s.log.Warn("autopilot: failed server removed from raft", "member", string(srv.ID), "status", string(srv.NodeStatus))
	})
}

// localRaftStats is this node's last log index and term, and how long ago
// it heard from the leader (0 on the leader or before any contact).
func (s *Server) localRaftStats() (index, term uint64, lastContact time.Duration) {
	st := s.node.raft.Stats()
	index, _ = strconv.ParseUint(st["last_log_index"], 10, 64)
	term, _ = strconv.ParseUint(st["last_log_term"], 10, 64)
	if !s.isLeader() {
		if lc := s.node.raft.LastContact(); !lc.IsZero() {
			lastContact = time.Since(lc)
		}
	}
	return index, term, lastContact
}

// clusterFigures is autopilot's health, failure tolerance and voter count
// (plan §5.2). The leader has autopilot's judgement; any other server
// estimates from gossip: healthy while a leader is known and every voter is
// alive, tolerating the alive voters beyond a quorum.
func (s *Server) clusterFigures() (healthy bool, tolerance, voters int) {
	if st := s.autopilotState.Load(); st != nil && s.isLeader() {
		return st.Healthy, st.FailureTolerance, len(st.Voters)
	}
	alive := 0
	for _, srv := range s.raftServers() {
		if srv.Suffrage != raft.Voter {
			continue
		}
		voters++
		if string(srv.ID) == s.cfg.NodeID {
			alive++
			continue
		}
		if s.gossip == nil {
			continue
		}
		if m, ok := s.gossip.memberByID(string(srv.ID)); ok && m.status == statusAlive {
			alive++
		}
	}
	if voters == 0 {
		return false, 0, 0
	}
	tolerance = max(0, alive-(voters/2+1))
	return s.hasLeader() && alive == voters, tolerance, voters
}
