package agent

import (
	"slices"

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
func (rs *replicaSet) connectKV(rep *llmgwv1.Replica, model *llmgwv1.Model) *kv.Listener {
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
