package replicas

import (
	"encoding/json"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"slices"

	"github.com/llmgw/llmgw/agent/datadir"
	"github.com/llmgw/llmgw/agent/engine"
	"github.com/llmgw/llmgw/agent/kv"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// External engines (design §6): a replica of engine "external" placed on
// this node is one this agent owns, not one it runs. The supervisor probes
// the endpoint (/health, then /v1/models for the model's name) and reports
// READY or UNHEALTHY with the endpoint as address; the load reader reads
// the engine's /metrics like any vLLM's (LoadTargets); and for a kv_events
// model the KV listener connects to the engine's own publisher and replay
// sockets, named in the model, instead of binding sockets for the engine
// to connect to. Nothing is started, stopped, adopted or drained: when the
// owner goes away the control plane gives the replica to another agent
// (design §5.5), and the engine never notices.

// connectKV connects the KV listener of an external replica to its
// engine's publisher: the model's kv_events_publishers and
// kv_events_replay entries at the index of the replica's endpoint. Like
// listenKV it returns nil, logged, when it cannot: routers then use tier 1
// for the replica.
func (rs *Set) connectKV(rep *llmgwv1.Replica, model *llmgwv1.Model) *kv.Listener {
	i := slices.Index(model.GetEndpoints(), rep.GetEndpoint())
	if i < 0 || i >= len(model.GetKvEventsPublishers()) {
		rs.log.Warn("kv_events model without a publisher for this endpoint; routers use tier 1 for it",
			"replica", rep.GetId(), "model", rep.GetModel(), "endpoint", rep.GetEndpoint())
		return nil
	}
	cfg := kv.DefaultListenerConfig()
	cfg.ReplicaID, cfg.UID, cfg.Topic = rep.GetId(), rep.GetUid(), model.GetKvEventsTopic()
	cfg.Endpoint, cfg.Connect = model.GetKvEventsPublishers()[i], true
	// The engine was running before this listener, whatever it is: the
	// mirror starts with a replay from seq 0 (untrusted if the engine's
	// buffer no longer holds it).
	cfg.CatchUp = true
	if i < len(model.GetKvEventsReplay()) {
		cfg.ReplayEndpoint = model.GetKvEventsReplay()[i]
	}
	return rs.startKV(cfg, rep, model)
}

// isExternal reports whether a runner's replica is one this agent owns
// rather than runs.
func (r *runner) isExternal() bool { return r.model.GetEngine() == engine.External }

// externalRecord is what the agent keeps of an external replica across its
// own restarts: the last incarnation it reported. A new agent cannot know
// whether the engine restarted while no one watched, and its KV mirror
// starts over anyway, so it counts one more — never one fewer, which
// routers would take for an older engine and refuse the KV state of.
type externalRecord struct {
	UID         uint64 `json:"uid"`
	Incarnation uint64 `json:"incarnation"`
}

func (rs *Set) externalPath(id string) string {
	return filepath.Join(rs.cfg.DataDir, "external", url.PathEscape(id)+".json")
}

// nextExternalIncarnation is the incarnation an external replica's
// supervisor starts at: 1, or one past the recorded one of the same
// placement.
func (rs *Set) nextExternalIncarnation(rep *llmgwv1.Replica) uint64 {
	b, err := os.ReadFile(rs.externalPath(rep.GetId()))
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			rs.log.Warn("reading an external replica's record", "replica", rep.GetId(), "err", err)
		}
		return 1
	}
	var rec externalRecord
	if err := json.Unmarshal(b, &rec); err != nil || rec.UID != rep.GetUid() {
		return 1 // unreadable, or another placement's: this one starts afresh
	}
	return rec.Incarnation + 1
}

// recordExternal keeps the record in step with the incarnations reported.
// Called from the runner's supervisor goroutine, in order.
func (rs *Set) recordExternal(r *runner, st *llmgwv1.ReplicaStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if st.GetIncarnation() == r.recordedIncarnation {
		return
	}
	b, _ := json.Marshal(externalRecord{UID: st.GetUid(), Incarnation: st.GetIncarnation()})
	p := rs.externalPath(st.GetReplicaId())
	err := os.MkdirAll(filepath.Dir(p), 0o755)
	if err == nil {
		err = datadir.WriteFileAtomic(p, b)
	}
	if err != nil {
		rs.log.Warn("external replica's record not saved; after an agent restart its incarnation may repeat", "replica", st.GetReplicaId(), "err", err)
		return
	}
	r.recordedIncarnation = st.GetIncarnation()
}

// dropExternal forgets a removed replica's record (there may be none).
func (rs *Set) dropExternal(id string) {
	if err := os.Remove(rs.externalPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		rs.log.Warn("removing an external replica's record", "replica", id, "err", err)
	}
}
