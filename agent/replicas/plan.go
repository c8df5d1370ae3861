package replicas

import (
	"fmt"
	"path/filepath"
	"strconv"

	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/agent/engine"
	"github.com/llmgw/llmgw/agent/kv"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// plan allocates the replica's ports, binds its KV-event listener where
// the model has one, and asks its engine's driver for a launch. The
// listener is returned even with an error, for the caller to close.
//
// For an adopted engine the ports are the ones it already listens on (held
// in the port store by adopt), and its listener catches up through the
// engine's replay socket on the batches published while no agent listened
// (design §6 "KV events"). The launch is the one the engine was started with,
// since drivers are pure; it is used should the engine need a restart.
func (rs *Set) plan(r *runner) (launch engine.Launch, ports map[string]int, kvl *kv.Listener, err error) {
	rep, model, adopted := r.replica, r.model, r.adopted
	if model == nil {
		return engine.Launch{}, nil, nil, fmt.Errorf("replica %s: model %q not in the desired set", rep.GetId(), rep.GetModel())
	}
	spec := engine.Spec{Replica: rep, Model: model, Host: rs.cfg.AdvertiseAddr, OTLPTracesEndpoint: rs.cfg.OTLPTracesEndpoint}
	if ec, ok := rs.cfg.Engines[model.GetEngine()]; ok {
		spec.Command, spec.Env = ec.Command, ec.Env
	}
	ports = map[string]int{}
	port := func(purpose, host string) (int, error) {
		key := rep.GetId() + "/" + purpose
		p, err := 0, error(nil)
		if adopted != nil {
			p, err = rs.ports.Held(key)
		} else {
			p, err = rs.ports.Get(key, host)
		}
		ports[purpose] = p
		return p, err
	}
	if model.GetEngine() == engine.External {
		if model.GetKvEvents() {
			kvl = rs.connectKV(r)
		}
	} else {
		if spec.Port, err = port("http", rs.cfg.AdvertiseAddr); err != nil {
			return engine.Launch{}, nil, nil, err
		}
		if model.GetKvEvents() {
			// KV-event sockets are Unix sockets only the agent's user
			// can open, or stay on loopback (design §6).
			spec.KVEventsEndpoint, spec.KVReplayEndpoint = rs.kvIPC(rep)
			if spec.KVEventsEndpoint == "" {
				if spec.KVEventsPort, err = port("kv-events", "127.0.0.1"); err != nil {
					return engine.Launch{}, nil, nil, err
				}
				if spec.KVReplayPort, err = port("kv-replay", "127.0.0.1"); err != nil {
					return engine.Launch{}, nil, nil, err
				}
				spec.KVEventsEndpoint = "tcp://127.0.0.1:" + strconv.Itoa(spec.KVEventsPort)
				spec.KVReplayEndpoint = "tcp://127.0.0.1:" + strconv.Itoa(spec.KVReplayPort)
			}
			if kvl = rs.listenKV(rep, model, spec.KVEventsEndpoint, spec.KVReplayEndpoint, adopted != nil); kvl == nil {
				m := proto.Clone(model).(*llmgwv1.Model)
				m.KvEvents = false
				spec.Model = m
			} else if adopted != nil {
				// At once, so the catch-up replay lands in this
				// incarnation's mirror rather than being reset by the
				// supervisor's first report.
				kvl.Engine(adopted.Incarnation)
			}
		}
	}
	launch, err = engine.Plan(spec)
	return launch, ports, kvl, err
}

// kvTopic is the topic the vllm and sim drivers give engines.
const kvTopic = "kv"

// listenKV binds the KV-event listener of a replica's leader shard before
// its engine starts (design §6 "KV events", §7.5), for the engines that
// publish vLLM's events. It returns nil where there is none to bind, and
// on failure, which is logged: the engine then starts without events and
// routers use tier 1 for it, rather than the replica not running at all
// for want of an optimisation.
func (rs *Set) listenKV(rep *llmgwv1.Replica, model *llmgwv1.Model, endpoint, replay string, catchUp bool) *kv.Listener {
	if eng := model.GetEngine(); eng != engine.VLLM && eng != engine.Sim {
		return nil
	}
	if leaderNode(rep) != rs.cfg.NodeID {
		return nil
	}
	cfg := kv.DefaultListenerConfig()
	cfg.ReplicaID, cfg.UID, cfg.Topic = rep.GetId(), rep.GetUid(), kvTopic
	cfg.Endpoint, cfg.ReplayEndpoint = endpoint, replay
	// The engine runs as the agent's user: no one else may feed or
	// answer for it (issue 27).
	cfg.SameUser = true
	cfg.CatchUp = catchUp
	return rs.startKV(cfg, rep, model)
}

// startKV completes a listener's config from the model and the agent's
// settings and starts it; nil, logged, on failure.
func (rs *Set) startKV(cfg kv.ListenerConfig, rep *llmgwv1.Replica, model *llmgwv1.Model) *kv.Listener {
	cfg.BlockSize, cfg.HashSeed = model.GetBlockSize(), model.GetHashSeed()
	if n := model.GetKvEventsBufferSteps(); n != 0 {
		cfg.ReplayBufferSteps = int(n)
	}
	if rs.cfg.KVMaxFrameBytes != 0 {
		cfg.MaxMessageBytes = rs.cfg.KVMaxFrameBytes
	}
	if n := rs.cfg.KVMaxOffloadBlocks; n != 0 {
		cfg.MaxOffloadBlocks = max(n, 0)
	}
	if cfg.BlockSize == 0 {
		cfg.BlockSize = engine.DefaultBlockSize
	}
	if cfg.HashSeed == "" {
		cfg.HashSeed = engine.DefaultHashSeed
	}
	l, err := rs.kv.Listen(cfg, rs.log.With("model", rep.GetModel()))
	if err != nil {
		rs.log.Warn("cannot receive kv cache events; the engine starts without them and routers use tier 1 for it",
			"replica", rep.GetId(), "model", rep.GetModel(), "err", err)
		return nil
	}
	return l
}

// kvIPC is a replica's ipc:// KV endpoints in DataDir/kv, or empty for
// loopback TCP: when the agent is configured so (KVTCP), or the directory
// cannot be made safe or is too deep for a socket's path (logged).
func (rs *Set) kvIPC(rep *llmgwv1.Replica) (pub, replay string) {
	if rs.cfg.KVTCP {
		return "", ""
	}
	dir, err := filepath.Abs(filepath.Join(rs.cfg.DataDir, "kv"))
	if err == nil {
		err = kv.SocketDir(dir)
	}
	if err == nil {
		pub, replay, err = kv.IPCEndpoints(dir, rep.GetId())
	}
	if err != nil {
		rs.log.Warn("kv events over loopback TCP instead of ipc", "replica", rep.GetId(), "err", err)
		return "", ""
	}
	return pub, replay
}

// leaderNode is the node of a replica's rank-0 shard, the one that serves
// HTTP and publishes KV events (design §4).
func leaderNode(rep *llmgwv1.Replica) string {
	for _, sh := range rep.GetShards() {
		if sh.GetRank() == 0 {
			return sh.GetNode()
		}
	}
	return rep.GetNode()
}
