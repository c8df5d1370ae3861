package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"time"

	"github.com/hashicorp/raft"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// The operators' verbs on servers (plan §5.2): join, leave, members, and
// Raft's list-peers, remove-peer, transfer-leadership. The leader-only ones
// reach the leader through forwardUnary.

var (
	errNotPeer     = errors.New("no such raft peer")
	errRefused     = errors.New("refused")
	errNoGossip    = errors.New("this server runs without gossip (--gossip-addr is empty)")
	errUnreachable = errors.New("unreachable")
)

// Join joins the gossip pool through the given addresses; Raft membership
// follows (the leader adds this server, or the servers it reached, as
// non-voters). An explicit join also clears the removal of this server and
// of the servers at those addresses: it is how an operator brings back a
// server `raft remove-peer` took out.
func (a *adminService) Join(_ context.Context, req *llmgwv1.JoinRequest) (*llmgwv1.JoinResponse, error) {
	s := a.s
	if s.gossip == nil {
		return nil, toStatus(fmt.Errorf("join: %w", errNoGossip))
	}
	if len(req.GossipAddrs) == 0 {
		return nil, toStatus(fmt.Errorf("join: %w", errValidation("gossip_addrs", "at least one gossip address (host:port) is required")))
	}
	for _, addr := range req.GossipAddrs {
		if err := checkAddr(addr); err != nil {
			return nil, toStatus(fmt.Errorf("join: %w", errValidation("gossip_addrs", err.Error())))
		}
	}
	n, err := s.gossip.join(req.GossipAddrs)
	if n == 0 {
		s.log.Warn("join failed", "addrs", req.GossipAddrs, "err", err)
		return nil, toStatus(fmt.Errorf("join %v: none answered: %w (%v)", req.GossipAddrs, errUnreachable, err))
	}
	cleared := map[string]bool{s.cfg.NodeID: true}
	for id, m := range s.gossip.snapshot() {
		for _, addr := range req.GossipAddrs {
			if sameAddr(m.gossipAddr, addr) {
				cleared[id] = true
			}
		}
	}
	for id := range cleared {
		if s.gossip.removed(id) {
			s.log.Info("removal cleared by an explicit join", "member", id)
		}
		s.gossip.setRemoved(id, false)
	}
	s.log.Info("joined", "addrs", req.GossipAddrs, "contacted", n)
	return &llmgwv1.JoinResponse{Joined: int32(n)}, nil
}

func sameAddr(a, b string) bool {
	if a == b {
		return true
	}
	ah, ap, err1 := net.SplitHostPort(a)
	bh, bp, err2 := net.SplitHostPort(b)
	if err1 != nil || err2 != nil || ap != bp {
		return false
	}
	if bh == "localhost" {
		bh = "127.0.0.1"
	}
	return ah == bh
}

// Members lists every server gossip has seen, as this server sees it.
func (a *adminService) Members(context.Context, *llmgwv1.MembersRequest) (*llmgwv1.MembersResponse, error) {
	s := a.s
	if s.gossip == nil {
		self := s.servers()[0]
		return &llmgwv1.MembersResponse{Members: []*llmgwv1.Member{{
			Id: self.Id, GrpcAddr: self.GrpcAddr, RaftAddr: self.RaftAddr, Version: self.Version,
			Status: string(statusAlive), BootstrapExpect: int32(s.cfg.BootstrapExpect),
		}}}, nil
	}
	ms := s.gossip.snapshot()
	out := &llmgwv1.MembersResponse{}
	for _, id := range sortedIDs(ms) {
		m := ms[id]
		out.Members = append(out.Members, &llmgwv1.Member{
			Id: id, GossipAddr: m.gossipAddr, GrpcAddr: m.meta.GRPC, RaftAddr: m.meta.Raft,
			Version: m.meta.Version, Status: string(m.status), BootstrapExpect: int32(m.meta.Expect),
			Refused: s.refusal(m.meta),
		})
	}
	return out, nil
}

// ListPeers is the Raft configuration with autopilot's view of each server
// (answered by the leader).
func (a *adminService) ListPeers(context.Context, *llmgwv1.ListPeersRequest) (*llmgwv1.ListPeersResponse, error) {
	s := a.s
	if !s.isLeader() {
		return nil, toStatus(fmt.Errorf("list peers: %w", s.notLeader()))
	}
	st := s.autopilotState.Load()
	_, leader := s.node.raft.LeaderWithID()
	now := s.now()
	out := &llmgwv1.ListPeersResponse{}
	for _, srv := range s.raftServers() {
		p := &llmgwv1.RaftPeer{Id: string(srv.ID), Address: string(srv.Address), Voter: srv.Suffrage == raft.Voter, Leader: srv.ID == leader}
		if string(srv.ID) == s.cfg.NodeID {
			p.Version = s.cfg.Version
		} else if s.gossip != nil {
			if m, ok := s.gossip.memberByID(string(srv.ID)); ok {
				p.Version = m.meta.Version
			}
		}
		if st != nil {
			if ss, ok := st.Servers[srv.ID]; ok {
				p.Healthy = ss.Health.Healthy
				p.LastContactMs = ss.Stats.LastContact.Milliseconds()
				p.LastIndex = ss.Stats.LastIndex
				if ss.Health.Healthy && !ss.Health.StableSince.IsZero() {
					p.StableSeconds = int64(now.Sub(ss.Health.StableSince).Seconds())
				}
			}
		} else if p.Leader {
			// Without autopilot (no gossip) only the leader's own figures
			// are known.
			idx, _, _ := s.localRaftStats()
			p.Healthy, p.LastIndex = true, idx
		}
		out.Peers = append(out.Peers, p)
	}
	sort.Slice(out.Peers, func(i, j int) bool { return out.Peers[i].Id < out.Peers[j].Id })
	return out, nil
}

// RemovePeer removes a server from Raft (answered by the leader) and
// tombstones it, so it is not added back when it shows up alive over gossip
// again: it comes back only through an explicit join. The leader cannot
// remove itself (transfer leadership first, or make it leave), nor the last
// voter.
func (a *adminService) RemovePeer(_ context.Context, req *llmgwv1.RemovePeerRequest) (*llmgwv1.RemovePeerResponse, error) {
	s := a.s
	if req.Id == "" {
		return nil, toStatus(fmt.Errorf("remove peer: %w", errValidation("id", "required")))
	}
	if !s.isLeader() {
		return nil, toStatus(fmt.Errorf("remove peer: %w", s.notLeader()))
	}
	var found *raft.Server
	voters := 0
	for _, srv := range s.raftServers() {
		if srv.Suffrage == raft.Voter {
			voters++
		}
		if string(srv.ID) == req.Id {
			found = &srv
		}
	}
	switch {
	case found == nil:
		return nil, toStatus(fmt.Errorf("remove peer %q: %w (see raft list-peers)", req.Id, errNotPeer))
	case req.Id == s.cfg.NodeID:
		return nil, toStatus(fmt.Errorf("remove peer %q: %w: it is the leader; transfer leadership first, or make it leave", req.Id, errRefused))
	case found.Suffrage == raft.Voter && voters == 1:
		return nil, toStatus(fmt.Errorf("remove peer %q: %w: it is the last voter", req.Id, errRefused))
	}
	if s.gossip != nil {
		s.gossip.setRemoved(req.Id, true)
	}
	if err := s.node.raft.RemoveServer(raft.ServerID(req.Id), 0, s.cfg.ApplyTimeout).Error(); err != nil {
		return nil, toStatus(fmt.Errorf("remove peer %q: %w", req.Id, s.raftErr(err)))
	}
	s.log.Warn("raft peer removed by an operator", "member", req.Id)
	return &llmgwv1.RemovePeerResponse{}, nil
}

// raftErr maps raft's refusals of configuration changes to ours.
func (s *Server) raftErr(err error) error {
	if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipTransferInProgress) {
		return s.notLeader()
	}
	if errors.Is(err, raft.ErrLeadershipLost) {
		return errOutcomeUnknown
	}
	return err
}

// TransferLeadership hands leadership to the given server, or to the one
// Raft picks, and waits until the new leader is known.
func (a *adminService) TransferLeadership(ctx context.Context, req *llmgwv1.TransferLeadershipRequest) (*llmgwv1.TransferLeadershipResponse, error) {
	s := a.s
	if !s.isLeader() {
		return nil, toStatus(fmt.Errorf("transfer leadership: %w", s.notLeader()))
	}
	if req.To == s.cfg.NodeID {
		return &llmgwv1.TransferLeadershipResponse{Leader: s.cfg.NodeID}, nil
	}
	leader, err := s.transferLeadership(ctx, req.To)
	if err != nil {
		return nil, toStatus(fmt.Errorf("transfer leadership: %w", err))
	}
	return &llmgwv1.TransferLeadershipResponse{Leader: leader}, nil
}

// transferLeadership moves leadership away from this node (to `to`, or to
// Raft's choice when empty) and returns the new leader's id.
func (s *Server) transferLeadership(ctx context.Context, to string) (string, error) {
	var f raft.Future
	if to == "" {
		f = s.node.raft.LeadershipTransfer()
	} else {
		var target *raft.Server
		for _, srv := range s.raftServers() {
			if string(srv.ID) == to {
				target = &srv
			}
		}
		if target == nil {
			return "", fmt.Errorf("to %q: %w (see raft list-peers)", to, errNotPeer)
		}
		if target.Suffrage != raft.Voter {
			return "", fmt.Errorf("to %q: %w: it is not a voter yet", to, errRefused)
		}
		f = s.node.raft.LeadershipTransferToServer(target.ID, target.Address)
	}
	if err := f.Error(); err != nil {
		return "", fmt.Errorf("%w: %v", errRefused, err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.LeaveTimeout)
	defer cancel()
	for {
		if _, id := s.node.raft.LeaderWithID(); id != "" && string(id) != s.cfg.NodeID {
			s.log.Info("leadership transferred", "leader", string(id))
			return string(id), nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("waiting for a new leader: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Leave makes this server leave the cluster gracefully (plan §5.2), then
// stop: Run returns and `llmgw control` exits, as Consul's servers do — a
// server that left is no longer a server. In order:
//  1. refuse when this is the last voter (the cluster would be gone);
//  2. a leader transfers leadership and waits for the new leader;
//  3. gossip Leave: every server sees it "left", so no leader adds it back;
//  4. the leader removes it from Raft (asked directly, and by its own
//     reconcile of left servers); this waits until the removal reaches this
//     server's configuration or LeaveTimeout passes.
func (a *adminService) Leave(ctx context.Context, _ *llmgwv1.LeaveRequest) (*llmgwv1.LeaveResponse, error) {
	s := a.s
	if s.gossip == nil {
		return nil, toStatus(fmt.Errorf("leave: %w", errNoGossip))
	}
	s.leaveMu.Lock()
	defer s.leaveMu.Unlock()
	select {
	case <-s.leaving:
		return nil, toStatus(fmt.Errorf("leave: %w: this server has already left", errRefused))
	default:
	}
	voters, selfVoter := 0, false
	for _, srv := range s.raftServers() {
		if srv.Suffrage == raft.Voter {
			voters++
			selfVoter = selfVoter || string(srv.ID) == s.cfg.NodeID
		}
	}
	if selfVoter && voters == 1 {
		return nil, toStatus(fmt.Errorf("leave: %w: this server is the last voter; the cluster would be gone", errRefused))
	}
	resp := &llmgwv1.LeaveResponse{}
	if s.isLeader() {
		leader, err := s.transferLeadership(ctx, "")
		if err != nil {
			return nil, toStatus(fmt.Errorf("leave: transfer leadership first: %w", err))
		}
		resp.NewLeader = leader
	}
	s.log.Info("leaving the cluster", "new_leader", resp.NewLeader)
	if err := s.gossip.leave(s.cfg.LeaveTimeout); err != nil {
		s.log.Warn("gossip leave not confirmed", "err", err)
	}
	if err := s.removeSelfViaLeader(ctx); err != nil {
		s.log.Warn("removal from raft not confirmed; the leader removes left servers on its own", "err", err)
	}
	s.leaveOnce.Do(func() { close(s.leaving) })
	return resp, nil
}

// removeSelfViaLeader asks the leader to remove this server from Raft and
// waits until this server's configuration no longer has it.
func (s *Server) removeSelfViaLeader(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.LeaveTimeout)
	defer cancel()
	asked := false
	for {
		in := false
		for _, srv := range s.raftServers() {
			in = in || string(srv.ID) == s.cfg.NodeID
		}
		if !in {
			s.log.Info("removed from raft")
			return nil
		}
		if !asked {
			if _, addr, ok := s.leaderGRPC(); ok && !s.isLeader() {
				rctx, rcancel := context.WithTimeout(ctx, s.cfg.ApplyTimeout)
				_, err := llmgwv1.NewAdminServiceClient(s.conns.get(addr)).RemovePeer(forwardedContext(rctx, s.cfg.NodeID), &llmgwv1.RemovePeerRequest{Id: s.cfg.NodeID})
				rcancel()
				asked = err == nil
				if err != nil {
					s.log.Debug("asking the leader to remove this server", "err", err)
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for removal from raft: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
