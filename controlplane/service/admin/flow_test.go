package admin

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// leaderRaft is a Raft member that leads or not; the rest of Raft is not
// called.
type leaderRaft struct {
	Raft
	leader bool
}

func (r *leaderRaft) IsLeader() bool { return r.leader }
func (r *leaderRaft) NotLeader() error {
	return status.Error(codes.Unavailable, "not the leader; the leader is c2 at 127.0.0.1:7400")
}

// flows is a table of the routers' reports holding one answer.
type flows struct{ st *llmgwv1.FlowStatusResponse }

func (f flows) Status() *llmgwv1.FlowStatusResponse { return f.st }

// TestFlowStatus: the leader answers its table of the routers' reports;
// a server that does not lead refuses naming the leader (its forwarding
// sends the call there); a server without a table says so.
func TestFlowStatus(t *testing.T) {
	table := flows{&llmgwv1.FlowStatusResponse{
		Routers: []*llmgwv1.FlowRouterDepths{{Router: "r1", ReportedUnixMs: 1_700_000_000_000, Depths: []*llmgwv1.FlowDepth{{Model: "m", Class: "batch", Queued: 2}}}},
		Total:   []*llmgwv1.FlowDepth{{Model: "m", Class: "batch", Queued: 2, Routers: 1}},
	}}
	raft := &leaderRaft{leader: true}
	a := New("c1", Deps{Raft: raft, Flows: table}, slog.New(slog.DiscardHandler))
	st, err := a.FlowStatus(context.Background(), &llmgwv1.FlowStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(st, table.st) {
		t.Fatalf("status %v, want the table's %v", st, table.st)
	}

	raft.leader = false
	_, err = a.FlowStatus(context.Background(), &llmgwv1.FlowStatusRequest{})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "not the leader; the leader is c2") {
		t.Fatalf("on a follower: %v, want UNAVAILABLE naming the leader", err)
	}

	_, err = New("c1", Deps{Raft: raft}, slog.New(slog.DiscardHandler)).FlowStatus(context.Background(), &llmgwv1.FlowStatusRequest{})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("without a table: %v, want UNIMPLEMENTED", err)
	}
}
