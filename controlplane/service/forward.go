package service

import (
	"context"
	"fmt"
	"strings"
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
// error. Holding also stops short of ctx's deadline (ReplyBy), so a client
// whose timeout is shorter than hold receives the last UNAVAILABLE, which
// says why, rather than its stream reset by the deadline ("RST_STREAM
// CANCEL"). It returns try's last error, or ctx's once ctx is cancelled
// while waiting.
func Hold(ctx context.Context, hold time.Duration, try func() error) error {
	end := time.Now().Add(hold)
	if by, ok := ReplyBy(ctx); ok && by.Before(end) {
		end = by
	}
	b := backoff.New(50*time.Millisecond, 200*time.Millisecond, nil)
	for {
		err := try()
		if status.Code(ToStatus(err)) != codes.Unavailable {
			return err
		}
		left := time.Until(end)
		if left <= 0 {
			return err
		}
		if !backoff.Sleep(ctx, min(b.Next(), left)) {
			return ctx.Err()
		}
	}
}

// ReplyBy is when a call must be answered for the answer to reach its
// client: ctx's deadline less a reserve for the way back (a tenth of the
// time left, 20 ms to 1 s). ok is false when ctx has no deadline.
func ReplyBy(ctx context.Context) (time.Time, bool) {
	dl, ok := ctx.Deadline()
	if !ok {
		return time.Time{}, false
	}
	reserve := min(max(time.Until(dl)/10, 20*time.Millisecond), time.Second)
	return dl.Add(-reserve), true
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
	llmgwv1.AdminService_SetApiKeysRequired_FullMethodName: func(any) (proto.Message, bool) {
		return &llmgwv1.SetApiKeysRequiredResponse{}, true
	},
	llmgwv1.AdminService_ListApiKeys_FullMethodName: func(r any) (proto.Message, bool) {
		return &llmgwv1.ListApiKeysResponse{}, r.(*llmgwv1.ListRequest).GetConsistent()
	},
	llmgwv1.AdminService_SetApiKeyTenant_FullMethodName: func(any) (proto.Message, bool) {
		return &llmgwv1.SetApiKeyTenantResponse{}, true
	},
	llmgwv1.AdminService_PutTenant_FullMethodName:    func(any) (proto.Message, bool) { return &llmgwv1.PutTenantResponse{}, true },
	llmgwv1.AdminService_DeleteTenant_FullMethodName: func(any) (proto.Message, bool) { return &llmgwv1.DeleteTenantResponse{}, true },
	// Tenant reads are local: the roll-up moves in batches anyway.
	llmgwv1.AdminService_ApplyAlias_FullMethodName:  func(any) (proto.Message, bool) { return &llmgwv1.ApplyAliasResponse{}, true },
	llmgwv1.AdminService_DeleteAlias_FullMethodName: func(any) (proto.Message, bool) { return &llmgwv1.DeleteAliasResponse{}, true },
	llmgwv1.AdminService_ListAliases_FullMethodName: func(r any) (proto.Message, bool) {
		return &llmgwv1.ListAliasesResponse{}, r.(*llmgwv1.ListRequest).GetConsistent()
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
	llmgwv1.AdminService_ListAdapters_FullMethodName: func(r any) (proto.Message, bool) {
		return &llmgwv1.ListAdaptersResponse{}, r.(*llmgwv1.ListRequest).GetConsistent()
	},
	llmgwv1.AdminService_ListPeers_FullMethodName:          func(any) (proto.Message, bool) { return &llmgwv1.ListPeersResponse{}, true },
	llmgwv1.AdminService_RemovePeer_FullMethodName:         func(any) (proto.Message, bool) { return &llmgwv1.RemovePeerResponse{}, true },
	llmgwv1.AdminService_TransferLeadership_FullMethodName: func(any) (proto.Message, bool) { return &llmgwv1.TransferLeadershipResponse{}, true },
	// The leader places adapters and single-flights each cold one (design
	// §7.6), so every server's EnsureAdapter is answered there.
	llmgwv1.AdapterService_EnsureAdapter_FullMethodName: func(any) (proto.Message, bool) { return &llmgwv1.EnsureAdapterResponse{}, true },
	// The leader alone evicts, so it keeps the routers' adapter use.
	llmgwv1.AdapterService_ReportAdapterUse_FullMethodName: func(any) (proto.Message, bool) { return &llmgwv1.AdapterUseReportResponse{}, true },
	// The leader alone grants shares of tenants' limits, and proposes the
	// usage batches (design §7.7).
	llmgwv1.QuotaService_Lease_FullMethodName:       func(any) (proto.Message, bool) { return &llmgwv1.LeaseResponse{}, true },
	llmgwv1.QuotaService_RecordUsage_FullMethodName: func(any) (proto.Message, bool) { return &llmgwv1.RecordUsageResponse{}, true },
	// The leader alone holds the routers' flow-control reports (design
	// §7.8): in memory, so only it can answer a report or the status.
	llmgwv1.FlowService_Report_FullMethodName:      func(any) (proto.Message, bool) { return &llmgwv1.FlowView{}, true },
	llmgwv1.AdminService_FlowStatus_FullMethodName: func(any) (proto.Message, bool) { return &llmgwv1.FlowStatusResponse{}, true },
	// The leader alone decides counts and places (design §5.7): its
	// decisions and reasons are in its memory.
	llmgwv1.AdminService_ModelStatus_FullMethodName: func(any) (proto.Message, bool) { return &llmgwv1.ModelStatusResponse{}, true },
}

// Quorum is what a "no leader" answer says of the voters: the Raft
// configuration as this server knows it, and gossip's view of each server
// (package cluster).
type Quorum interface {
	// Servers is the control servers of the Raft configuration, this one
	// first, voters marked.
	Servers() []*llmgwv1.ControlServer
	// Members is every server gossip has seen, with its status.
	Members() []*llmgwv1.Member
}

// ForwardPeers is what forwarding needs of the other servers: where the
// leader is, and, to explain its absence, the voters' state.
type ForwardPeers interface {
	Peers
	Quorum
}

// Forwarder is the one place leader-only unary calls reach the leader.
type Forwarder struct {
	self  string
	hold  time.Duration
	raft  Leadership
	peers ForwardPeers
}

// NewForwarder returns the forwarding of server self, holding calls up to
// hold (RPCHoldTimeout).
func NewForwarder(self string, hold time.Duration, r Leadership, p ForwardPeers) *Forwarder {
	return &Forwarder{self: self, hold: hold, raft: r, peers: p}
}

// Unary is the interceptor: this server answers a leader-only call when it
// leads; otherwise the call goes to the leader's gRPC address, held (Hold)
// while there is no leader or the leader refuses because it just stopped
// leading. Other calls, and forwarded ones, are answered here.
//
// What a held call finally answers is meant for an operator: with no
// leader, how many voters this server reaches and how many a quorum needs
// (UNAVAILABLE); with a leader that cannot be reached, which one (the
// transport's UNAVAILABLE); with a leader that took the call and did not
// answer before the client's deadline, that the outcome is unknown
// (DEADLINE_EXCEEDED) — never a stream reset by the deadline.
func (f *Forwarder) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	newResp, ok := leaderOnly[info.FullMethod]
	if !ok {
		return handler(ctx, req)
	}
	resp, needLeader := newResp(req)
	if !needLeader || IsForwarded(ctx) {
		return handler(ctx, req)
	}
	start := time.Now()
	// Answered here, the call is bounded like a forwarded one, so that a
	// leader stuck in a write (its enqueue timeout is the deadline) still
	// answers in time.
	hctx := ctx
	if by, ok := ReplyBy(ctx); ok {
		var cancel context.CancelFunc
		hctx, cancel = context.WithDeadline(ctx, by)
		defer cancel()
	}
	var out any
	noLeader := false
	err := Hold(ctx, f.hold, func() error {
		var err error
		out, noLeader = nil, false
		if f.raft.IsLeader() {
			out, err = handler(hctx, req)
		} else if id, addr, found := f.peers.LeaderAddr(); found {
			r := proto.Clone(resp)
			err = f.forward(ctx, id, addr, info.FullMethod, req, r)
			out = r
		} else {
			err = ToStatus(f.raft.NotLeader())
			noLeader = id == ""
		}
		return err
	})
	if noLeader && status.Code(err) == codes.Unavailable {
		err = status.Error(codes.Unavailable, f.noLeader(time.Since(start)))
	}
	// err is a status already, or ctx's end while holding.
	return out, ToStatus(err)
}

// forward sends the call to the leader, bounded so that this server can
// still answer before the client's deadline (ReplyBy). A leader that did
// not answer by then may have applied a write: DEADLINE_EXCEEDED says so.
// A leader that cannot be reached is UNAVAILABLE, held and retried.
func (f *Forwarder) forward(ctx context.Context, id, addr, method string, req any, resp proto.Message) error {
	fctx := ForwardedContext(ctx, f.self)
	if by, ok := ReplyBy(ctx); ok {
		var cancel context.CancelFunc
		fctx, cancel = context.WithDeadline(fctx, by)
		defer cancel()
	}
	err := f.peers.Conn(addr).Invoke(fctx, method, req, resp)
	st, _ := status.FromError(err)
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case st.Code() == codes.DeadlineExceeded && fctx.Err() != nil:
		return status.Errorf(codes.DeadlineExceeded, "the leader %s at %s did not answer %s in time (cut off, or overloaded?): a write may or may not have been applied, check before retrying", id, addr, f.self)
	case st.Code() == codes.Unavailable && !isLeaderRefusal(st.Message()):
		return status.Errorf(codes.Unavailable, "%s cannot reach the leader %s at %s: %s", f.self, id, addr, st.Message())
	}
	return err
}

// isLeaderRefusal tells the leader's own UNAVAILABLE (it stopped leading,
// or is catching up) from the transport's: only the transport's needs the
// leader's address to be read.
func isLeaderRefusal(msg string) bool {
	for _, s := range []string{"not the leader", "no leader", ErrCatchingUp.Error()} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// noLeader is the answer to a call held for held while no server led: what
// this server sees of the voters, so an operator knows whether servers are
// down or cut off (bring them back) or an election is still under way
// (retry).
func (f *Forwarder) noLeader(held time.Duration) string {
	alive := map[string]bool{}
	gossip := false
	for _, m := range f.peers.Members() {
		if m.Id != f.self {
			gossip = true
		}
		alive[m.Id] = m.Status == "alive"
	}
	voters, up := 0, 0
	var down []string
	for _, s := range f.peers.Servers() {
		if !s.Voter {
			continue
		}
		voters++
		if s.Id == f.self || alive[s.Id] {
			up++
		} else {
			down = append(down, s.Id)
		}
	}
	quorum := voters/2 + 1
	msg := fmt.Sprintf("no leader: %s found no leader in the %v it held this call", f.self, held.Round(10*time.Millisecond))
	switch {
	case voters == 0:
		return msg + "; this server is in no Raft configuration yet (is the cluster bootstrapped? see llmgwctl server members)"
	case !gossip && voters > 1:
		return msg + fmt.Sprintf("; it sees no other server over gossip, so it cannot tell which of the %d voters are up (a quorum needs %d): check the servers and their gossip addresses", voters, quorum)
	case up < quorum:
		return msg + fmt.Sprintf("; it reaches %d of %d voters (%s not alive in gossip) and a quorum needs %d: start or reconnect them, then retry (llmgwctl server members)", up, voters, strings.Join(down, ", "), quorum)
	}
	return msg + fmt.Sprintf("; gossip shows %d of %d voters alive, a quorum, so an election is under way, Raft cannot connect them, or gossip has not yet noticed servers down: retry, and if it persists check the servers' logs and Raft addresses", up, voters)
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
