package replicas

import (
	"slices"
	"strings"

	"github.com/llmgw/llmgw/agent/engine"
	"github.com/llmgw/llmgw/agent/load"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
	"github.com/llmgw/llmgw/vllm"
)

// LoadTargets lists the engines the load reader reads (design §6 "Load
// snapshots"): every current placement whose latest status is READY with an
// address, under the incarnation that status reports. A starting or
// restarting engine has no load worth reading; routers do not send it
// requests anyway.
func (rs *Set) LoadTargets() []load.Target {
	rs.mu.Lock()
	runners := make([]*runner, 0, len(rs.running))
	for _, r := range rs.running {
		runners = append(runners, r)
	}
	rs.mu.Unlock()
	out := make([]load.Target, 0, len(runners))
	for _, r := range runners {
		st := rs.book.status(r.replica.GetId())
		if st == nil || st.GetUid() != r.replica.GetUid() || st.GetPhase() != llmgwv1.ReplicaPhase_REPLICA_PHASE_READY ||
			st.GetAddress() == "" {
			continue
		}
		out = append(out, load.Target{ReplicaID: st.GetReplicaId(), UID: st.GetUid(), Incarnation: st.GetIncarnation(),
			Address: st.GetAddress(), Names: loadNames(r.model.GetEngine())})
	}
	slices.SortFunc(out, func(a, b load.Target) int { return strings.Compare(a.ReplicaID, b.ReplicaID) })
	return out
}

// loadNames picks an engine's metric names: llama.cpp has its own; vLLM,
// the simulator and external engines (vLLM-compatible by contract) speak
// vLLM's.
func loadNames(engineName string) vllm.LoadNames {
	if engineName == engine.LlamaCpp {
		return vllm.LlamaCppLoadNames
	}
	return vllm.VLLMLoadNames
}
