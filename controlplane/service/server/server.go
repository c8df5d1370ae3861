package server

import (
	"context"
	"fmt"
	"log/slog"

	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/controlplane/service"
	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Proposer commits commands on the leader through the minimum-version gate
// (package gate): the FSM's result and the revision it was applied at, or
// why not (a NotLeaderError on a follower, the FSM's validation error).
type Proposer interface {
	Propose(ctx context.Context, t llmgwv1.CommandType, payload proto.Message) (any, uint64, error)
}

// Service is the ServerService.
type Service struct {
	llmgwv1.UnimplementedServerServiceServer
	propose Proposer
	log     *slog.Logger

	// Set by WithKeyring before serving.
	self    string
	keyring Keyring
}

// New returns the ServerService.
func New(p Proposer, log *slog.Logger) *Service {
	return &Service{propose: p, log: log}
}

// RegisterNode commits the registration of a node whose agent is attached
// to the calling server: the node as the agent reported it, with state
// unspecified (keep the current one) or ACTIVE (back from DOWN), which the
// caller decided as it decides for its own sessions. The leader commits it
// as it commits the registration of an agent attached to itself.
func (s *Service) RegisterNode(ctx context.Context, req *llmgwv1.RegisterNodeRequest) (*llmgwv1.RegisterNodeResponse, error) {
	n := req.GetNode()
	if n.GetId() == "" {
		return nil, service.ToStatus(fmt.Errorf("register node: %w", &fsm.ValidationError{Field: "node.id", Reason: "required"}))
	}
	if st := n.GetState(); st != llmgwv1.NodeState_NODE_STATE_UNSPECIFIED && st != llmgwv1.NodeState_NODE_STATE_ACTIVE {
		return nil, service.ToStatus(fmt.Errorf("register node %s: %w", n.Id, &fsm.ValidationError{Field: "node.state", Reason: fmt.Sprintf("must be unspecified or active, got %s", st)}))
	}
	want := proto.Clone(n).(*llmgwv1.Node)
	want.Revision = 0
	res, rev, err := s.propose.Propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_REGISTER_NODE, &llmgwv1.RegisterNodeCommand{Node: want})
	if err != nil {
		return nil, service.ToStatus(fmt.Errorf("register node %s: %w", n.Id, err))
	}
	committed, _ := res.(*llmgwv1.Node)
	s.log.Info("node registered for a peer's agent session", "target_node", n.Id, "from", req.GetServerId(), "revision", rev)
	return &llmgwv1.RegisterNodeResponse{Revision: rev, Node: committed}, nil
}
