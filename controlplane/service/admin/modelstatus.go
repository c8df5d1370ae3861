package admin

import (
	"context"
	"fmt"

	"github.com/llmgw/llmgw/controlplane/service"
	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// ModelStatus is one model's count and replicas, why any is missing and
// what the autoscaler decided (design §5.7). The forwarding interceptor
// sends the call to the leader, whose memory holds the reasons; the
// replica counts are its state's.
func (a *Service) ModelStatus(_ context.Context, req *llmgwv1.ModelStatusRequest) (*llmgwv1.ModelStatusResponse, error) {
	if !a.raft.IsLeader() {
		return nil, service.ToStatus(fmt.Errorf("model status: %w", a.raft.NotLeader()))
	}
	st := a.state.State()
	var m *llmgwv1.Model
	for _, x := range st.Models {
		if x.Name == req.GetName() {
			m = x
		}
	}
	if m == nil {
		return nil, service.ToStatus(fmt.Errorf("model %q: %w", req.GetName(), fsm.ErrNotFound))
	}
	out := &llmgwv1.ModelStatusResponse{Model: m, Desired: fsm.EffectiveReplicas(st, m)}
	for _, s := range st.Scales {
		if s.Model == m.Name {
			out.Scale = s
		}
	}
	for _, r := range st.Replicas {
		if r.Model != m.Name || r.Draining {
			continue
		}
		out.Placed++
		switch {
		case r.Sleeping:
			out.Sleeping++
		case a.reports.StatusOf(r).GetPhase() == llmgwv1.ReplicaPhase_REPLICA_PHASE_READY:
			out.Ready++
		}
	}
	if a.scaling != nil {
		out.UnplacedReason = a.scaling.Unplaced(m.Name)
		out.Events, out.Demand = a.scaling.ScaleStatus(m.Name)
	}
	return out, nil
}
