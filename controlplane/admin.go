package controlplane

import (
	"context"
	"fmt"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// adminService is everything llmgwctl needs (plan §5.3). Writes go through
// Raft on the leader; reads are served from this node's FSM unless
// consistent is asked, when this node must be the leader and confirm it.
type adminService struct {
	llmgwv1.UnimplementedAdminServiceServer
	s *Server
}

func (a *adminService) ApplyModel(ctx context.Context, req *llmgwv1.ApplyModelRequest) (*llmgwv1.ApplyModelResponse, error) {
	// The same pure validation llmgwctl ran, so a bad model is refused
	// before it costs a log entry; the FSM checks again when applying.
	// What is proposed is the model as given: the FSM fills the cluster's
	// defaults, then the built-in ones, at the revision it applies.
	m := req.GetModel()
	if m == nil {
		return nil, toStatus(&fsm.ValidationError{Field: "model", Reason: "required"})
	}
	if err := fsm.ValidateModel(fsm.ModelDefaults(fsm.ClusterDefaults(m, a.s.fsm.Config()))); err != nil {
		return nil, toStatus(err)
	}
	res, rev, err := a.s.propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_UPSERT_MODEL, &llmgwv1.UpsertModelCommand{Model: m})
	if err != nil {
		return nil, toStatus(fmt.Errorf("apply model %s: %w", m.Name, err))
	}
	stored, _ := res.(*llmgwv1.Model)
	a.s.log.Info("model applied", "model", m.Name, "revision", rev)
	return &llmgwv1.ApplyModelResponse{Revision: rev, Model: stored}, nil
}

func (a *adminService) DeleteModel(ctx context.Context, req *llmgwv1.DeleteModelRequest) (*llmgwv1.DeleteModelResponse, error) {
	_, rev, err := a.s.propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_DELETE_MODEL, &llmgwv1.DeleteModelCommand{Name: req.GetName()})
	if err != nil {
		return nil, toStatus(fmt.Errorf("delete model %s: %w", req.GetName(), err))
	}
	a.s.log.Info("model deleted", "model", req.GetName(), "revision", rev)
	return &llmgwv1.DeleteModelResponse{Revision: rev}, nil
}

// read returns the state to answer a read from. A consistent read needs
// this node to be the leader, past its post-election Barrier (so its FSM
// holds every committed entry of earlier terms), and still the leader when
// it asks a quorum (VerifyLeader): hashicorp/raft has no ReadIndex.
func (a *adminService) read(req *llmgwv1.ListRequest) (*llmgwv1.State, error) {
	if req.GetConsistent() {
		if !a.s.isLeader() {
			return nil, toStatus(fmt.Errorf("consistent read: %w", a.s.notLeader()))
		}
		if !a.s.leaderReady.Load() {
			return nil, toStatus(fmt.Errorf("consistent read: %w", errCatchingUp))
		}
		if err := a.s.node.raft.VerifyLeader().Error(); err != nil {
			return nil, toStatus(fmt.Errorf("consistent read: %w", a.s.notLeader()))
		}
	}
	return a.s.fsm.State(), nil
}

func (a *adminService) ListModels(_ context.Context, req *llmgwv1.ListRequest) (*llmgwv1.ListModelsResponse, error) {
	st, err := a.read(req)
	if err != nil {
		return nil, err
	}
	return &llmgwv1.ListModelsResponse{Revision: st.Revision, Models: st.Models}, nil
}

func (a *adminService) ListNodes(_ context.Context, req *llmgwv1.ListRequest) (*llmgwv1.ListNodesResponse, error) {
	st, err := a.read(req)
	if err != nil {
		return nil, err
	}
	return &llmgwv1.ListNodesResponse{Revision: st.Revision, Nodes: st.Nodes, Connected: a.s.connected()}, nil
}

// ListReplicas joins each desired replica with its last status, as its own
// node reported it for the same placement (uid).
func (a *adminService) ListReplicas(_ context.Context, req *llmgwv1.ListRequest) (*llmgwv1.ListReplicasResponse, error) {
	st, err := a.read(req)
	if err != nil {
		return nil, err
	}
	out := &llmgwv1.ListReplicasResponse{Revision: st.Revision}
	for _, r := range st.Replicas {
		out.Replicas = append(out.Replicas, &llmgwv1.ReplicaView{Replica: r, Status: a.s.eph.StatusOf(r)})
	}
	return out, nil
}

// ClusterStatus is this server's view of the cluster, with autopilot's
// figures (the leader's own judgement on the leader, an estimate from
// gossip elsewhere). The answer's headers carry this server's Raft log
// position and last contact, which the leader's autopilot reads.
func (a *adminService) ClusterStatus(ctx context.Context, _ *llmgwv1.ClusterStatusRequest) (*llmgwv1.ClusterStatusResponse, error) {
	s := a.s
	idx, term, lc := s.localRaftStats()
	_ = grpc.SetHeader(ctx, metadata.Pairs(
		hdrLastIndex, strconv.FormatUint(idx, 10),
		hdrLastTerm, strconv.FormatUint(term, 10),
		hdrLastContact, strconv.FormatInt(lc.Milliseconds(), 10)))
	_, leader := s.node.raft.LeaderWithID()
	healthy, tolerance, voters := s.clusterFigures()
	return &llmgwv1.ClusterStatusResponse{
		Leader:           string(leader),
		Servers:          s.servers(),
		Revision:         s.fsm.Revision(),
		ServerId:         s.cfg.NodeID,
		Healthy:          healthy,
		FailureTolerance: int32(tolerance),
		Voters:           int32(voters),
		MinVersion:       s.fsm.Config().GetMinVersion(),
	}, nil
}

func errValidation(field, reason string) error {
	return &fsm.ValidationError{Field: field, Reason: reason}
}

// DrainNode marks a node DRAINING — placement then moves its replicas off
// one at a time, each replacement ready before the old one drains (plan
// §5.5) — or, with undrain, ACTIVE again. Undrain refuses a node that is
// DOWN: that is the leader's judgement, which its agent's return clears.
func (a *adminService) DrainNode(ctx context.Context, req *llmgwv1.DrainNodeRequest) (*llmgwv1.DrainNodeResponse, error) {
	if req.GetId() == "" {
		return nil, toStatus(errValidation("id", "required"))
	}
	n, ok := a.s.fsm.Node(req.Id)
	if !ok {
		return nil, toStatus(fmt.Errorf("drain node %s: %w", req.Id, fsm.ErrNotFound))
	}
	want, verb := llmgwv1.NodeState_NODE_STATE_DRAINING, "drain"
	if req.Undrain {
		want, verb = llmgwv1.NodeState_NODE_STATE_ACTIVE, "undrain"
		if n.State == llmgwv1.NodeState_NODE_STATE_DOWN {
			return nil, toStatus(fmt.Errorf("undrain node %s: %w", req.Id, errNodeDown))
		}
	}
	if n.State == want {
		return &llmgwv1.DrainNodeResponse{Revision: a.s.fsm.Revision()}, nil
	}
	_, rev, err := a.s.propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_SET_NODE_STATE, &llmgwv1.SetNodeStateCommand{Id: req.Id, State: want})
	if err != nil {
		return nil, toStatus(fmt.Errorf("%s node %s: %w", verb, req.Id, err))
	}
	a.s.log.Info("node state set by operator", "target_node", req.Id, "state", want.String(), "revision", rev)
	return &llmgwv1.DrainNodeResponse{Revision: rev}, nil
}
