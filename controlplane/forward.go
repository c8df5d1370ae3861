package controlplane

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// mdForwarded marks a call one server forwarded to another: the receiver
// answers it itself (or refuses), never forwards it again, so a leader
// change in flight cannot make calls bounce between servers.
const mdForwarded = "llmgw-forwarded"

func isForwarded(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(mdForwarded)) > 0
}

func forwardedContext(ctx context.Context, from string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, mdForwarded, from)
}

// connPool holds one client connection per peer gRPC address, for
// forwarding and autopilot's health checks. Connections are created lazily
// and closed together when the server stops.
type connPool struct {
	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	closed bool
}

func newConnPool() *connPool { return &connPool{conns: map[string]*grpc.ClientConn{}} }

// get returns the connection to addr; a closed pool (or a bad address)
// yields a connection whose calls fail, never nil.
func (p *connPool) get(addr string) *grpc.ClientConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.conns[addr]; ok {
		return c
	}
	c, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil || p.closed {
		// NewClient fails only on a malformed target; the call on this
		// placeholder fails the same way a dead peer would.
		c, _ = grpc.NewClient("passthrough:///invalid.invalid:1", grpc.WithTransportCredentials(insecure.NewCredentials()))
		if p.closed {
			c.Close()
			return c
		}
	}
	p.conns[addr] = c
	return c
}

func (p *connPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for a, c := range p.conns {
		c.Close()
		delete(p.conns, a)
	}
}

// leaderGRPC returns the leader's gRPC address as gossip carries it.
func (s *Server) leaderGRPC() (id, addr string, ok bool) {
	_, lid := s.node.raft.LeaderWithID()
	if lid == "" || s.gossip == nil {
		return string(lid), "", false
	}
	m, found := s.gossip.memberByID(string(lid))
	if !found || m.meta.GRPC == "" {
		return string(lid), "", false
	}
	return string(lid), m.meta.GRPC, true
}

// leaderOnly says which AdminService calls must be answered by the leader
// and makes the empty response to decode the leader's answer into. Reads
// are local unless consistent is asked (plan §5.3).
var leaderOnly = map[string]func(req any) (proto.Message, bool){
	llmgwv1.AdminService_ApplyModel_FullMethodName:    func(any) (proto.Message, bool) { return &llmgwv1.ApplyModelResponse{}, true },
	llmgwv1.AdminService_DeleteModel_FullMethodName:   func(any) (proto.Message, bool) { return &llmgwv1.DeleteModelResponse{}, true },
	llmgwv1.AdminService_DrainNode_FullMethodName:     func(any) (proto.Message, bool) { return &llmgwv1.DrainNodeResponse{}, true },
	llmgwv1.AdminService_SetNodeLabels_FullMethodName: func(any) (proto.Message, bool) { return &llmgwv1.SetNodeLabelsResponse{}, true },
	llmgwv1.AdminService_ListModels_FullMethodName: func(r any) (proto.Message, bool) {
		return &llmgwv1.ListModelsResponse{}, r.(*llmgwv1.ListRequest).GetConsistent()
	},
	llmgwv1.AdminService_ListNodes_FullMethodName: func(r any) (proto.Message, bool) {
		return &llmgwv1.ListNodesResponse{}, r.(*llmgwv1.ListRequest).GetConsistent()
	},
	llmgwv1.AdminService_ListReplicas_FullMethodName: func(r any) (proto.Message, bool) {
		return &llmgwv1.ListReplicasResponse{}, r.(*llmgwv1.ListRequest).GetConsistent()
	},
	llmgwv1.AdminService_ListPeers_FullMethodName:          func(any) (proto.Message, bool) { return &llmgwv1.ListPeersResponse{}, true },
	llmgwv1.AdminService_RemovePeer_FullMethodName:         func(any) (proto.Message, bool) { return &llmgwv1.RemovePeerResponse{}, true },
	llmgwv1.AdminService_TransferLeadership_FullMethodName: func(any) (proto.Message, bool) { return &llmgwv1.TransferLeadershipResponse{}, true },
	// The leader places adapters and single-flights each cold one (plan
	// §7.6), so every server's EnsureAdapter is answered there.
	llmgwv1.AdapterService_EnsureAdapter_FullMethodName: func(any) (proto.Message, bool) { return &llmgwv1.EnsureAdapterResponse{}, true },
}

// forwardUnary is the one place leader-only calls reach the leader: this
// node answers when it leads; otherwise the call goes to the leader's gRPC
// address (from gossip). While there is no leader, or the leader refuses
// because it just stopped leading, the call is held and retried for up to
// RPCHoldTimeout (Consul's rpc_hold_timeout), so an election or a
// leadership transfer costs a client latency, not an error. Only refusals
// that guarantee nothing was applied (UNAVAILABLE) are retried.
func (s *Server) forwardUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	newResp, ok := leaderOnly[info.FullMethod]
	if !ok {
		return handler(ctx, req)
	}
	resp, needLeader := newResp(req)
	if !needLeader || isForwarded(ctx) {
		return handler(ctx, req)
	}
	deadline := time.Now().Add(s.cfg.RPCHoldTimeout)
	for {
		var out any
		var err error
		if s.isLeader() {
			out, err = handler(ctx, req)
		} else if _, addr, found := s.leaderGRPC(); found {
			r := proto.Clone(resp)
			err = s.conns.get(addr).Invoke(forwardedContext(ctx, s.cfg.NodeID), info.FullMethod, req, r)
			out = r
		} else {
			err = toStatus(s.notLeader())
		}
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			return out, err
		}
		select {
		case <-ctx.Done():
			return nil, toStatus(ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// forwardRegister commits an agent's node registration through the leader
// when this server does not lead. The proto has no registration RPC, so it
// rides on a forwarded Attach: the hello registers, the welcome confirms,
// and the leader keeps no session for it.
func (s *Server) forwardRegister(ctx context.Context, n *llmgwv1.Node) error {
	deadline := time.Now().Add(s.cfg.RPCHoldTimeout)
	for {
		err := s.registerOnLeader(ctx, n)
		if err == nil || status.Code(toStatus(err)) != codes.Unavailable || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (s *Server) registerOnLeader(ctx context.Context, n *llmgwv1.Node) error {
	if s.isLeader() {
		return s.proposeRegister(ctx, n)
	}
	_, addr, ok := s.leaderGRPC()
	if !ok {
		return s.notLeader()
	}
	cctx, cancel := context.WithTimeout(forwardedContext(ctx, s.cfg.NodeID), s.cfg.ApplyTimeout)
	defer cancel()
	stream, err := llmgwv1.NewAgentServiceClient(s.conns.get(addr)).Attach(cctx)
	if err != nil {
		return fmt.Errorf("forward registration to the leader at %s: %w", addr, err)
	}
	if err := stream.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Hello{Hello: &llmgwv1.AgentHello{Node: n, Epoch: 1}}}); err != nil {
		return fmt.Errorf("forward registration to the leader at %s: %w", addr, err)
	}
	msg, err := stream.Recv()
	if err != nil {
		return fmt.Errorf("forward registration to the leader at %s: %w", addr, err)
	}
	if msg.GetWelcome() == nil {
		return errors.New("forward registration: the leader answered without a welcome")
	}
	stream.CloseSend()
	return nil
}
