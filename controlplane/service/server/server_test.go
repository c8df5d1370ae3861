package server

import (
	"context"
	"log/slog"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// fakeProposer commits REGISTER_NODE as the FSM would (the node at the
// revision), or fails with err.
type fakeProposer struct {
	err  error
	got  []*llmgwv1.Node
	next uint64
}

func (p *fakeProposer) Propose(_ context.Context, t llmgwv1.CommandType, payload proto.Message) (any, uint64, error) {
	if p.err != nil {
		return nil, 0, p.err
	}
	n := payload.(*llmgwv1.RegisterNodeCommand).Node
	p.got = append(p.got, proto.Clone(n).(*llmgwv1.Node))
	p.next++
	committed := proto.Clone(n).(*llmgwv1.Node)
	committed.Revision = p.next
	return committed, p.next, nil
}

// TestRegisterNode: the leader commits the node as given (its revision
// ignored) and answers with the committed node and revision; a request
// without an id or with a state other than unspecified or active is
// refused before proposing; a proposal's refusal comes back as its code.
func TestRegisterNode(t *testing.T) {
	node := &llmgwv1.Node{Id: "n1", Address: "10.0.0.1", Gpus: 2, Labels: map[string]string{"zone": "a"}, Version: "v0.2.0", Revision: 99}
	tests := []struct {
		name    string
		req     *llmgwv1.RegisterNodeRequest
		propErr error
		code    codes.Code
	}{
		{"registers", &llmgwv1.RegisterNodeRequest{Node: node, ServerId: "c2"}, nil, codes.OK},
		{"back from down", &llmgwv1.RegisterNodeRequest{Node: &llmgwv1.Node{Id: "n1", State: llmgwv1.NodeState_NODE_STATE_ACTIVE}}, nil, codes.OK},
		{"no node", &llmgwv1.RegisterNodeRequest{}, nil, codes.InvalidArgument},
		{"no id", &llmgwv1.RegisterNodeRequest{Node: &llmgwv1.Node{Address: "x"}}, nil, codes.InvalidArgument},
		{"draining is the operator's", &llmgwv1.RegisterNodeRequest{Node: &llmgwv1.Node{Id: "n1", State: llmgwv1.NodeState_NODE_STATE_DRAINING}}, nil, codes.InvalidArgument},
		{"a follower refuses", &llmgwv1.RegisterNodeRequest{Node: node}, status.Error(codes.Unavailable, "not the leader"), codes.Unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &fakeProposer{err: tt.propErr}
			resp, err := New(p, slog.New(slog.DiscardHandler)).RegisterNode(context.Background(), tt.req)
			if status.Code(err) != tt.code {
				t.Fatalf("err %v, want %s", err, tt.code)
			}
			if tt.code != codes.OK {
				if len(p.got) != 0 {
					t.Fatalf("proposed %v despite the refusal", p.got)
				}
				return
			}
			want := proto.Clone(tt.req.Node).(*llmgwv1.Node)
			want.Revision = 0
			if len(p.got) != 1 || !proto.Equal(p.got[0], want) {
				t.Fatalf("proposed %v, want %v", p.got, want)
			}
			if resp.Revision != 1 || resp.Node.GetId() != want.Id || resp.Node.Revision != 1 {
				t.Fatalf("response %v", resp)
			}
		})
	}
}
