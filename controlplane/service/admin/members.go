package admin

import (
	"context"

	"github.com/llmgw/llmgw/controlplane/service"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// The operators' verbs on servers (design §5.2); package cluster does the
// work and says why it refuses.

// Join joins the gossip pool through the given addresses; Raft membership
// follows. It also clears the removal of this server and of the servers at
// those addresses.
func (a *Service) Join(_ context.Context, req *llmgwv1.JoinRequest) (*llmgwv1.JoinResponse, error) {
	n, err := a.members.Join(req.GossipAddrs)
	if err != nil {
		return nil, service.ToStatus(err)
	}
	return &llmgwv1.JoinResponse{Joined: int32(n)}, nil
}

// Members lists every server gossip has seen, as this server sees it.
func (a *Service) Members(context.Context, *llmgwv1.MembersRequest) (*llmgwv1.MembersResponse, error) {
	return &llmgwv1.MembersResponse{Members: a.members.Members()}, nil
}

// ListPeers is the Raft configuration with autopilot's view of each server
// (answered by the leader).
func (a *Service) ListPeers(context.Context, *llmgwv1.ListPeersRequest) (*llmgwv1.ListPeersResponse, error) {
	peers, err := a.members.Peers()
	if err != nil {
		return nil, service.ToStatus(err)
	}
	return &llmgwv1.ListPeersResponse{Peers: peers}, nil
}

// RemovePeer removes a server from Raft (answered by the leader) and
// tombstones it, so it comes back only through an explicit join.
func (a *Service) RemovePeer(ctx context.Context, req *llmgwv1.RemovePeerRequest) (*llmgwv1.RemovePeerResponse, error) {
	if err := a.members.RemovePeer(ctx, req.Id); err != nil {
		return nil, service.ToStatus(err)
	}
	return &llmgwv1.RemovePeerResponse{}, nil
}

// TransferLeadership hands leadership to the given server, or to the one
// Raft picks, and waits until the new leader is known.
func (a *Service) TransferLeadership(ctx context.Context, req *llmgwv1.TransferLeadershipRequest) (*llmgwv1.TransferLeadershipResponse, error) {
	leader, err := a.members.TransferLeadership(ctx, req.To)
	if err != nil {
		return nil, service.ToStatus(err)
	}
	return &llmgwv1.TransferLeadershipResponse{Leader: leader}, nil
}

// Leave makes this server leave the cluster gracefully, then stop (design
// §5.2): `llmgw control` exits, as Consul's servers do.
func (a *Service) Leave(ctx context.Context, _ *llmgwv1.LeaveRequest) (*llmgwv1.LeaveResponse, error) {
	leader, err := a.members.Leave(ctx)
	if err != nil {
		return nil, service.ToStatus(err)
	}
	return &llmgwv1.LeaveResponse{NewLeader: leader}, nil
}
