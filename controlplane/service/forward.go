package service

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/controlplane/cluster"
	"github.com/llmgw/llmgw/internal/backoff"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Leadership is what forwarding needs of the Raft store.
type Leadership interface {
	// IsLeader reports whether this server leads now.
	IsLeader() bool
	// NotLeader is the error naming the leader (UNAVAILABLE).
	NotLeader() error
}

// Peers reach the other servers (package cluster).
type Peers interface {
	// LeaderAddr is the leader's id and gRPC address; ok is false while
	// either is unknown (no leader, or no gossip to carry its address).
	LeaderAddr() (id, addr string, ok bool)
	// Conn is a pooled connection to a peer's gRPC address; calls on it
	// fail, never panic, once the node stops.
	Conn(addr string) grpc.ClientConnInterface
}

// IsForwarded reports whether a call was forwarded by another server: it is
// answered here or refused, never forwarded again.
func IsForwarded(ctx context.Context) bool { return cluster.IsForwarded(ctx) }

// ForwardedContext marks an outgoing call as forwarded by server from.
func ForwardedContext(ctx context.Context, from string) context.Context {
	return cluster.ForwardedContext(ctx, from)
}

// Hold runs try until it succeeds, fails with anything but UNAVAILABLE — a
// refusal that guarantees nothing was applied — or hold has passed,
// backing off with jitter (50 ms doubling to 200 ms) between attempts, so
// an election or a leadership transfer costs a client latency, not an
// error. It returns try's last error, or ctx's once ctx ends while waiting.
func Hold(ctx context.Context, hold time.Duration, try func() error) error {
	deadline := time.Now().Add(hold)
	b := backoff.New(50*time.Millisecond, 200*time.Millisecond, nil)
	for {
		err := try()
		if status.Code(ToStatus(err)) != codes.Unavailable || time.Now().After(deadline) {
			return err
		}
		if !backoff.Sleep(ctx, b.Next()) {
			return ctx.Err()
		}
	}
}

// leaderOnly says which calls must be answered by the leader and makes the
// empty response to decode the leader's answer into. Reads are local
// unless consistent is asked (design §5.3).
var leaderOnly = map[string]func(req any) (proto.Message, bool){
	llmgwv1.AdminService_ApplyModel_FullMethodName:    func(any) (proto.Message, bool) { return &llmgwv1.ApplyModelResponse{}, true },
	llmgwv1.AdminService_DeleteModel_FullMethodName:   func(any) (proto.Message, bool) { return &llmgwv1.DeleteModelResponse{}, true },
	llmgwv1.AdminService_DrainNode_FullMethodName:     func(any) (proto.Message, bool) { return &llmgwv1.DrainNodeResponse{}, true },
	llmgwv1.AdminService_SetNodeLabels_FullMethodName: func(any) (proto.Message, bool) { return &llmgwv1.SetNodeLabelsResponse{}, true },
	llmgwv1.AdminService_CreateApiKey_FullMethodName:  func(any) (proto.Message, bool) { return &llmgwv1.CreateApiKeyResponse{}, true },
	llmgwv1.AdminService_RevokeApiKey_FullMethodName:  func(any) (proto.Message, bool) { return &llmgwv1.RevokeApiKeyResponse{}, true },
	llmgwv1.AdminService_ListApiKeys_FullMethodName: func(r any) (proto.Message, bool) {
		return &llmgwv1.ListApiKeysResponse{}, r.(*llmgwv1.ListRequest).GetConsistent()
	},
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
	// The leader places adapters and single-flights each cold one (design
	// §7.6), so every server's EnsureAdapter is answered there.
	llmgwv1.AdapterService_EnsureAdapter_FullMethodName: func(any) (proto.Message, bool) { return &llmgwv1.EnsureAdapterResponse{}, true },
}

// Forwarder is the one place leader-only unary calls reach the leader.
type Forwarder struct {
	self  string
	hold  time.Duration
	raft  Leadership
	peers Peers
}

// NewForwarder returns the forwarding of server self, holding calls up to
// hold (RPCHoldTimeout).
func NewForwarder(self string, hold time.Duration, r Leadership, p Peers) *Forwarder {
	return &Forwarder{self: self, hold: hold, raft: r, peers: p}
}

// Unary is the interceptor: this server answers a leader-only call when it
// leads; otherwise the call goes to the leader's gRPC address, held (Hold)
// while there is no leader or the leader refuses because it just stopped
// leading. Other calls, and forwarded ones, are answered here.
func (f *Forwarder) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	newResp, ok := leaderOnly[info.FullMethod]
	if !ok {
		return handler(ctx, req)
	}
	resp, needLeader := newResp(req)
	if !needLeader || IsForwarded(ctx) {
		return handler(ctx, req)
	}
	var out any
	err := Hold(ctx, f.hold, func() error {
		var err error
		out = nil
		if f.raft.IsLeader() {
			out, err = handler(ctx, req)
		} else if _, addr, found := f.peers.LeaderAddr(); found {
			r := proto.Clone(resp)
			err = f.peers.Conn(addr).Invoke(ForwardedContext(ctx, f.self), info.FullMethod, req, r)
			out = r
		} else {
			err = ToStatus(f.raft.NotLeader())
		}
		return err
	})
	// err is a status already, or ctx's end while holding.
	return out, ToStatus(err)
}

// ServersEqual reports whether two server lists are the same, in order:
// the sessions and watch streams send a new list only when it changed.
func ServersEqual(a, b []*llmgwv1.ControlServer) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !proto.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}
