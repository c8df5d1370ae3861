package service

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/controlplane/store"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// fakeRaft is this server's Raft: the leader when leads, else a follower
// that knows the leader it is told, or none.
type fakeRaft struct {
	leaderID string
	leads    bool
}

func (r fakeRaft) IsLeader() bool { return r.leads }
func (r fakeRaft) NotLeader() error {
	return &store.NotLeaderError{LeaderID: r.leaderID}
}

// fakeFleet is the other servers: the leader's gRPC address (ok false with
// none), gossip's members, the Raft voters, and what a forwarded call
// meets (invoke; nil answers an empty response).
type fakeFleet struct {
	leader, addr string
	voters       []string
	alive        map[string]bool
	invoke       func(ctx context.Context, method string) error

	mu    sync.Mutex
	calls []string // methods forwarded, with whether marked forwarded
}

func (f *fakeFleet) LeaderAddr() (string, string, bool) {
	return f.leader, f.addr, f.leader != "" && f.addr != ""
}

func (f *fakeFleet) Conn(string) grpc.ClientConnInterface { return fleetConn{f} }

func (f *fakeFleet) Servers() []*llmgwv1.ControlServer {
	var out []*llmgwv1.ControlServer
	for _, id := range f.voters {
		out = append(out, &llmgwv1.ControlServer{Id: id, Voter: true})
	}
	return append(out, &llmgwv1.ControlServer{Id: "nv", Voter: false})
}

func (f *fakeFleet) Members() []*llmgwv1.Member {
	var out []*llmgwv1.Member
	for id, ok := range f.alive {
		st := "dead"
		if ok {
			st = "alive"
		}
		out = append(out, &llmgwv1.Member{Id: id, Status: st})
	}
	return out
}

type fleetConn struct{ f *fakeFleet }

func (c fleetConn) Invoke(ctx context.Context, method string, _, _ any, _ ...grpc.CallOption) error {
	c.f.mu.Lock()
	c.f.calls = append(c.f.calls, method)
	c.f.mu.Unlock()
	if !markedForwarded(ctx) {
		return errors.New("forwarded call not marked forwarded")
	}
	if c.f.invoke == nil {
		return nil
	}
	return c.f.invoke(ctx, method)
}

func (fleetConn) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, errors.New("no streams")
}

// hangs is a leader that took the call and never answers.
func hangs(ctx context.Context, _ string) error {
	<-ctx.Done()
	return status.FromContextError(ctx.Err()).Err()
}

// TestForwarderAnswersBeforeTheDeadline: a held leader-only call answers
// before the client's deadline, even one shorter than the hold, with a
// status that says what an operator can do — never the deadline's stream
// reset — and a consistent read is forwarded like a write.
func TestForwarderAnswersBeforeTheDeadline(t *testing.T) {
	three := []string{"c1", "c2", "c3"}
	tests := []struct {
		name     string
		leader   string
		fleet    *fakeFleet
		method   string
		req      any
		hold     time.Duration
		deadline time.Duration // 0: none
		want     codes.Code
		// wantMsg are the pieces the message must hold.
		wantMsg []string
		// forwarded is how many calls must reach the leader (-1: any).
		forwarded int
		local     bool // the handler must have answered
		leads     bool // this server leads
		// stuck: the handler waits for its context to end.
		stuck bool
	}{
		{name: "no leader, voters down, deadline shorter than the hold",
			fleet:  &fakeFleet{voters: three, alive: map[string]bool{"c3": true, "c1": false}},
			method: llmgwv1.AdminService_ApplyModel_FullMethodName, req: &llmgwv1.ApplyModelRequest{},
			hold: 5 * time.Second, deadline: 400 * time.Millisecond, want: codes.Unavailable,
			wantMsg: []string{"no leader: c3 found no leader", "it reaches 1 of 3 voters (c1, c2 not alive in gossip) and a quorum needs 2"}},
		{name: "no leader, a quorum alive in gossip: an election",
			fleet:  &fakeFleet{voters: three, alive: map[string]bool{"c1": true, "c2": true, "c3": true}},
			method: llmgwv1.AdminService_DeleteModel_FullMethodName, req: &llmgwv1.DeleteModelRequest{},
			hold: 300 * time.Millisecond, deadline: 5 * time.Second, want: codes.Unavailable,
			wantMsg: []string{"no leader: c3 found no leader in the ", " it held this call", "gossip shows 3 of 3 voters alive, a quorum, so an election is under way"}},
		{name: "no leader, no gossip",
			fleet:  &fakeFleet{voters: three, alive: map[string]bool{"c3": true}},
			method: llmgwv1.AdminService_ApplyModel_FullMethodName, req: &llmgwv1.ApplyModelRequest{},
			hold: 200 * time.Millisecond, want: codes.Unavailable,
			wantMsg: []string{"no leader", "it sees no other server over gossip, so it cannot tell which of the 3 voters are up (a quorum needs 2)"}},
		{name: "no leader, no configuration",
			fleet:  &fakeFleet{alive: map[string]bool{"c3": true}},
			method: llmgwv1.AdminService_ApplyModel_FullMethodName, req: &llmgwv1.ApplyModelRequest{},
			hold: 100 * time.Millisecond, want: codes.Unavailable,
			wantMsg: []string{"no leader", "in no Raft configuration yet"}},
		{name: "a leader gossip has no address for names it",
			leader: "c1", fleet: &fakeFleet{leader: "c1", voters: three},
			method: llmgwv1.AdminService_ApplyModel_FullMethodName, req: &llmgwv1.ApplyModelRequest{},
			hold: 100 * time.Millisecond, want: codes.Unavailable,
			wantMsg: []string{"not the leader; the leader is c1"}},
		{name: "the leader hangs: outcome unknown, before the deadline",
			leader: "c1", fleet: &fakeFleet{leader: "c1", addr: "10.0.0.1:7400", voters: three, invoke: hangs},
			method: llmgwv1.AdminService_ApplyModel_FullMethodName, req: &llmgwv1.ApplyModelRequest{},
			hold: 5 * time.Second, deadline: 400 * time.Millisecond, want: codes.DeadlineExceeded, forwarded: 1,
			wantMsg: []string{"the leader c1 at 10.0.0.1:7400 did not answer c3 in time", "may or may not have been applied"}},
		{name: "the leader cannot be reached: named, held and retried",
			leader: "c1", fleet: &fakeFleet{leader: "c1", addr: "10.0.0.1:7400", voters: three, invoke: func(context.Context, string) error {
				return status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: connection refused"`)
			}},
			method: llmgwv1.AdminService_RevokeApiKey_FullMethodName, req: &llmgwv1.RevokeApiKeyRequest{},
			hold: 300 * time.Millisecond, deadline: 5 * time.Second, want: codes.Unavailable, forwarded: -1,
			wantMsg: []string{"c3 cannot reach the leader c1 at 10.0.0.1:7400: connection error"}},
		{name: "the leader's refusal passes as it is",
			leader: "c1", fleet: &fakeFleet{leader: "c1", addr: "10.0.0.1:7400", voters: three, invoke: func(context.Context, string) error {
				return status.Error(codes.NotFound, `model "nope" not found`)
			}},
			method: llmgwv1.AdminService_DeleteModel_FullMethodName, req: &llmgwv1.DeleteModelRequest{},
			hold: time.Second, want: codes.NotFound, forwarded: 1, wantMsg: []string{`model "nope" not found`}},
		{name: "a consistent read is forwarded to the leader",
			leader: "c1", fleet: &fakeFleet{leader: "c1", addr: "10.0.0.1:7400", voters: three},
			method: llmgwv1.AdminService_ListModels_FullMethodName, req: &llmgwv1.ListRequest{Consistent: true},
			hold: time.Second, want: codes.OK, forwarded: 1},
		{name: "the leader stuck in a write still answers before the deadline",
			leads: true, stuck: true, fleet: &fakeFleet{voters: three},
			method: llmgwv1.AdminService_ApplyModel_FullMethodName, req: &llmgwv1.ApplyModelRequest{},
			hold: 5 * time.Second, deadline: 400 * time.Millisecond, want: codes.DeadlineExceeded, local: true},
		{name: "a plain read is answered here",
			leader: "c1", fleet: &fakeFleet{leader: "c1", addr: "10.0.0.1:7400", voters: three},
			method: llmgwv1.AdminService_ListReplicas_FullMethodName, req: &llmgwv1.ListRequest{},
			hold: time.Second, want: codes.OK, local: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := NewForwarder("c3", tt.hold, fakeRaft{leaderID: tt.leader, leads: tt.leads}, tt.fleet)
			ctx := context.Background()
			if tt.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.deadline)
				defer cancel()
			}
			local := false
			handler := func(ctx context.Context, _ any) (any, error) {
				local = true
				if tt.stuck {
					<-ctx.Done()
					return nil, ctx.Err()
				}
				return &llmgwv1.ListReplicasResponse{}, nil
			}
			start := time.Now()
			_, err := f.Unary(ctx, tt.req, &grpc.UnaryServerInfo{FullMethod: tt.method}, handler)
			took := time.Since(start)
			if got := status.Code(err); got != tt.want {
				t.Fatalf("code %v (%v), want %v", got, err, tt.want)
			}
			if ctx.Err() != nil {
				t.Fatalf("answered after the client's deadline (%v): %v", took, err)
			}
			for _, w := range tt.wantMsg {
				if !strings.Contains(status.Convert(err).Message(), w) {
					t.Errorf("message %q lacks %q", status.Convert(err).Message(), w)
				}
			}
			if local != tt.local {
				t.Errorf("answered here: %t, want %t", local, tt.local)
			}
			if n := len(tt.fleet.calls); tt.forwarded >= 0 && n != tt.forwarded || tt.forwarded < 0 && n < 2 {
				t.Errorf("%d calls forwarded (%v), want %d (-1: several)", n, tt.fleet.calls, tt.forwarded)
			}
		})
	}
}

// TestForwardedCallIsAnsweredHere: a call another server forwarded is never
// forwarded again, whatever this server thinks of the leader.
func TestForwardedCallIsAnsweredHere(t *testing.T) {
	fleet := &fakeFleet{leader: "c1", addr: "10.0.0.1:7400"}
	f := NewForwarder("c3", time.Second, fakeRaft{leaderID: "c1"}, fleet)
	ctx := forwardedIncoming(context.Background(), "c2")
	local := false
	_, err := f.Unary(ctx, &llmgwv1.ListRequest{Consistent: true}, &grpc.UnaryServerInfo{FullMethod: llmgwv1.AdminService_ListModels_FullMethodName},
		func(context.Context, any) (any, error) { local = true; return &llmgwv1.ListModelsResponse{}, nil })
	if err != nil || !local || len(fleet.calls) != 0 {
		t.Fatalf("err %v, answered here %t, forwarded %v", err, local, fleet.calls)
	}
}

// TestHoldStopsBeforeTheDeadline: Hold returns try's last UNAVAILABLE
// before ctx's deadline, not ctx's error; it returns at once on any other
// outcome, and ctx's error once ctx is cancelled.
func TestHoldStopsBeforeTheDeadline(t *testing.T) {
	unavailable := status.Error(codes.Unavailable, "no leader: why")
	t.Run("deadline shorter than the hold", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		tries := 0
		err := Hold(ctx, time.Minute, func() error { tries++; return unavailable })
		if !errors.Is(err, unavailable) || ctx.Err() != nil {
			t.Fatalf("Hold = %v after %d tries, ctx %v: want the last UNAVAILABLE before the deadline", err, tries, ctx.Err())
		}
		if tries < 2 {
			t.Errorf("%d tries: Hold did not retry", tries)
		}
	})
	t.Run("other outcomes end it", func(t *testing.T) {
		for _, want := range []error{nil, status.Error(codes.Aborted, "x"), errors.New("boom")} {
			tries := 0
			if err := Hold(context.Background(), time.Minute, func() error { tries++; return want }); !errors.Is(err, want) || tries != 1 {
				t.Errorf("Hold = %v after %d tries, want %v after 1", err, tries, want)
			}
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		err := Hold(ctx, time.Minute, func() error { cancel(); return unavailable })
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Hold = %v, want context.Canceled", err)
		}
	})
}

func TestReplyBy(t *testing.T) {
	if _, ok := ReplyBy(context.Background()); ok {
		t.Fatal("a deadline without one")
	}
	for _, tt := range []struct{ left, minReserve, maxReserve time.Duration }{
		{100 * time.Millisecond, 20 * time.Millisecond, 25 * time.Millisecond},
		{5 * time.Second, 490 * time.Millisecond, 500 * time.Millisecond},
		{time.Minute, time.Second, time.Second},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), tt.left)
		dl, _ := ctx.Deadline()
		by, ok := ReplyBy(ctx)
		cancel()
		if r := dl.Sub(by); !ok || r < tt.minReserve || r > tt.maxReserve {
			t.Errorf("%v left: reserve %v, want %v..%v", tt.left, r, tt.minReserve, tt.maxReserve)
		}
	}
}

// markedForwarded reports whether an outgoing call carries the forwarded
// mark, as the receiving server will read it.
func markedForwarded(ctx context.Context) bool {
	md, _ := metadata.FromOutgoingContext(ctx)
	return IsForwarded(metadata.NewIncomingContext(ctx, md))
}

// forwardedIncoming is an incoming call forwarded by server from.
func forwardedIncoming(ctx context.Context, from string) context.Context {
	md, _ := metadata.FromOutgoingContext(ForwardedContext(ctx, from))
	return metadata.NewIncomingContext(ctx, md)
}
