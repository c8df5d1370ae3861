package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// fakeAgent is one node's agent as the control plane sees it: a session on
// the real AgentService (hello, numbered EphemeralUpdates, heartbeats), no
// engines. It reports every replica placed on its node ready at a fake
// address and, once live, churns the replicas' KV block sets at its share
// of the event rate: each event pair stores a new block in one replica and
// removes that replica's oldest, so every set keeps its size and the
// routers' index its exact entry count. The first replica of the node is
// the probe carrier: its set is only the latest probe block (probe.go).
type fakeAgent struct {
	id       string
	replicas int // GPUs: the replicas placed on it
	blocks   int // blocks held per churning replica
	flush    time.Duration
	conn     *grpc.ClientConn
	seed     uint64

	// rate is the agent's KV events per second, as float64 bits.
	rate atomic.Uint64
	// live: statuses and KV are reported (the fleet is placed everywhere).
	live atomic.Bool

	mu      sync.Mutex
	reps    map[string]*fakeReplica // by replica id
	probe   []*probe                // waiting for the next flush
	probeID string                  // the probe carrier's replica id
	probeAt uint64                  // its block: the last probe's hash

	// Counters, read by the harness.
	events   atomic.Int64 // KV events sent (stored + removed hashes)
	sessions atomic.Int64 // sessions opened (1 when none broke)
	lastErr  atomic.Value // string: why the last session ended
	desired  atomic.Int64 // replicas in the last DesiredReplicas
	draining atomic.Int64 // of them, draining
	// markAt is set by the harness before a step (Unix ns); firstAt and
	// lastAt are when the desired set first and last changed since (ids,
	// uids or draining), so a step is timed at the agent, whatever the
	// harness's polling.
	markAt, firstAt, lastAt atomic.Int64
}

// fakeReplica is one placed replica and its block set, oldest first.
type fakeReplica struct {
	id, model string
	uid       uint64
	// draining: the control plane drains it; a live agent reports it
	// STOPPED at once (stopped: sent), as the real agent does once
	// nothing runs in the engine — nothing ever does here.
	draining, stopped bool
	reported          bool // its status and KV reset were sent in this session
	set               []uint64
	head              int // set[head] is the oldest block
	next              uint64
}

func (a *fakeAgent) setRate(perSec float64) { a.rate.Store(uint64FromFloat(perSec)) }

// run keeps a session open until ctx ends, a new one (new epoch, full
// copy) after any failure.
func (a *fakeAgent) run(ctx context.Context) {
	for ctx.Err() == nil {
		err := a.session(ctx)
		if ctx.Err() != nil {
			return
		}
		a.lastErr.Store(err.Error())
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (a *fakeAgent) session(ctx context.Context) error {
	a.sessions.Add(1)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := llmgwv1.NewAgentServiceClient(a.conn).Attach(ctx)
	if err != nil {
		return err
	}
	epoch := uint64(time.Now().UnixNano())
	if err := st.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Hello{Hello: &llmgwv1.AgentHello{
		Node:  &llmgwv1.Node{Id: a.id, Address: "127.0.0.1", Gpus: uint32(a.replicas), Labels: map[string]string{fleetLabel: "1"}, Version: "dev"},
		Epoch: epoch,
	}}}); err != nil {
		return err
	}
	a.mu.Lock()
	for _, r := range a.reps {
		r.reported = false // a new session: the full copy carries all
	}
	a.mu.Unlock()
	askFull := make(chan struct{}, 1)
	recvErr := make(chan error, 1)
	go func() { recvErr <- a.receive(st, askFull) }()

	tick := time.NewTicker(a.flush)
	defer tick.Stop()
	hb := time.NewTicker(500 * time.Millisecond)
	defer hb.Stop()
	seq := uint64(0)
	full := true
	last := time.Now()
	var acc float64
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-recvErr:
			return err
		case <-askFull:
			full = true
		case <-hb.C:
			if err := st.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Heartbeat{Heartbeat: &llmgwv1.Heartbeat{UnixNano: time.Now().UnixNano()}}}); err != nil {
				return err
			}
		case <-tick.C:
			now := time.Now()
			pairs := a.pairs(&acc, now.Sub(last))
			last = now
			seq++
			u, probes := a.update(epoch, seq, full, pairs)
			full = false
			if u == nil {
				seq--
				continue
			}
			if err := st.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Update{Update: u}}); err != nil {
				return err
			}
			sent := time.Now()
			for _, p := range probes {
				p.sent(sent)
			}
		}
	}
}

// pairs adds the events due over dt at the agent's rate to acc and takes
// the whole event pairs out of it. An acc that is not a sane count (a rate
// set to something odd) starts again from 0 rather than send garbage.
func (a *fakeAgent) pairs(acc *float64, dt time.Duration) int {
	*acc += floatFromUint64(a.rate.Load()) * max(dt, 0).Seconds()
	if !(*acc >= 0 && *acc < 1e9) {
		*acc = 0
	}
	n := int(*acc / 2)
	*acc -= float64(2 * n)
	return n
}

// receive follows the control messages: the desired set and full-copy
// requests.
func (a *fakeAgent) receive(st llmgwv1.AgentService_AttachClient, askFull chan<- struct{}) error {
	for {
		m, err := st.Recv()
		if err != nil {
			return err
		}
		switch b := m.Body.(type) {
		case *llmgwv1.ControlMessage_Desired:
			a.setDesired(b.Desired)
		case *llmgwv1.ControlMessage_FullCopyRequest:
			select {
			case askFull <- struct{}{}:
			default:
			}
		}
	}
}

// setDesired takes the node's desired replicas: new ones get a block set,
// gone ones are forgotten (and reported removed by the next full copy).
func (a *fakeAgent) setDesired(d *llmgwv1.DesiredReplicas) {
	a.mu.Lock()
	defer a.mu.Unlock()
	changed := false
	keep := map[string]bool{}
	draining := 0
	for _, r := range d.GetReplicas() {
		keep[r.GetId()] = true
		if r.GetDraining() {
			draining++
		}
		if old := a.reps[r.GetId()]; old != nil && old.uid == r.GetUid() {
			changed = changed || old.draining != r.GetDraining()
			old.draining = r.GetDraining()
			continue
		}
		changed = true
		a.reps[r.GetId()] = &fakeReplica{id: r.GetId(), model: r.GetModel(), uid: r.GetUid(), draining: r.GetDraining()}
	}
	for id := range a.reps {
		if !keep[id] {
			changed = true
			delete(a.reps, id)
		}
	}
	// The probe carrier is the replica with the lowest uid.
	a.probeID = ""
	var low uint64
	for id, r := range a.reps {
		if a.probeID == "" || r.uid < low {
			a.probeID, low = id, r.uid
		}
	}
	a.desired.Store(int64(len(a.reps)))
	a.draining.Store(int64(draining))
	if changed {
		now := time.Now().UnixNano()
		if a.firstAt.Load() < a.markAt.Load() {
			a.firstAt.Store(now)
		}
		a.lastAt.Store(now)
	}
}

// update builds the next update: a full copy, or the delta of statuses
// and resets not yet reported, pairs churn event pairs and the waiting
// probes. nil when there is nothing to send.
func (a *fakeAgent) update(epoch, seq uint64, full bool, pairs int) (*llmgwv1.EphemeralUpdate, []*probe) {
	a.mu.Lock()
	defer a.mu.Unlock()
	u := &llmgwv1.EphemeralUpdate{Node: a.id, Epoch: epoch, Seq: seq, Full: full}
	live := a.live.Load()
	ids := make([]string, 0, len(a.reps))
	for id := range a.reps {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	// A waiting probe moves the carrier's block to the newest probe's.
	var probes []*probe
	carrier := a.reps[a.probeID]
	probeWas := a.probeAt
	if live && len(a.probe) > 0 && carrier != nil {
		a.probeAt = a.probe[len(a.probe)-1].seq
		probes, a.probe = a.probe, nil
	}
	var churn []*fakeReplica
	for _, id := range ids {
		r := a.reps[id]
		if !live {
			continue
		}
		if id != a.probeID && !r.draining {
			churn = append(churn, r)
		}
		phase := llmgwv1.ReplicaPhase_REPLICA_PHASE_READY
		if r.draining {
			phase = llmgwv1.ReplicaPhase_REPLICA_PHASE_STOPPED
		}
		if r.draining && !r.stopped && r.reported && !full {
			r.stopped = true
			u.Statuses = append(u.Statuses, &llmgwv1.ReplicaStatus{
				ReplicaId: id, Uid: r.uid, Incarnation: 1, Model: r.model, Node: a.id,
				Phase: phase, UpdatedUnixNano: time.Now().UnixNano(),
			})
		}
		if full || !r.reported {
			r.reported = true
			r.stopped = r.draining
			u.Statuses = append(u.Statuses, &llmgwv1.ReplicaStatus{
				ReplicaId: id, Uid: r.uid, Incarnation: 1, Model: r.model, Node: a.id,
				Phase: phase, Address: fakeAddr, UpdatedUnixNano: time.Now().UnixNano(),
			})
			kv := &llmgwv1.KVBlocks{ReplicaId: id, Uid: r.uid, Incarnation: 1, Reset_: true, BlockSize: 16}
			if id == a.probeID {
				kv.Stored = []uint64{probeHash(a.probeAt)}
			} else {
				a.fill(r)
				kv.Stored = r.ordered()
			}
			u.Kv = append(u.Kv, kv)
		} else if id == a.probeID && a.probeAt != probeWas {
			u.Kv = append(u.Kv, &llmgwv1.KVBlocks{ReplicaId: id, Uid: r.uid, Incarnation: 1,
				Stored: []uint64{probeHash(a.probeAt)}, Removed: []uint64{probeHash(probeWas)}})
		}
	}
	if live {
		u.Kv = append(u.Kv, a.churn(churn, pairs)...)
	}
	if !full && len(u.Statuses) == 0 && len(u.Kv) == 0 {
		return nil, nil
	}
	for _, kv := range u.Kv {
		if !kv.Reset_ {
			a.events.Add(int64(len(kv.Stored) + len(kv.Removed)))
		}
	}
	return u, probes
}

// fill gives a replica its first set of a.blocks blocks.
func (a *fakeAgent) fill(r *fakeReplica) {
	if len(r.set) == a.blocks {
		return
	}
	r.set, r.head = make([]uint64, a.blocks), 0
	for i := range r.set {
		r.set[i] = a.hash(r)
	}
}

// ordered returns r's blocks, oldest first.
func (r *fakeReplica) ordered() []uint64 {
	return append(slices.Clone(r.set[r.head:]), r.set[:r.head]...)
}

// churn spreads pairs of (store a new block, remove the oldest) over
// replicas, one KVBlocks per replica touched.
func (a *fakeAgent) churn(reps []*fakeReplica, pairs int) []*llmgwv1.KVBlocks {
	if len(reps) == 0 || pairs == 0 || a.blocks == 0 {
		return nil
	}
	out := make([]*llmgwv1.KVBlocks, 0, min(len(reps), pairs))
	for i, r := range reps {
		n := pairs / len(reps)
		if i < pairs%len(reps) {
			n++
		}
		// At most the whole set once per update: a block stored and
		// removed within one flush is no net change, which the agent's
		// mirror never sends. Past that rate the sent rate falls short of
		// the target, and the report shows it.
		n = min(n, len(r.set))
		if n == 0 {
			continue
		}
		kv := &llmgwv1.KVBlocks{ReplicaId: r.id, Uid: r.uid, Incarnation: 1,
			Stored: make([]uint64, 0, n), Removed: make([]uint64, 0, n)}
		for range n {
			kv.Removed = append(kv.Removed, r.set[r.head])
			h := a.hash(r)
			r.set[r.head] = h
			r.head = (r.head + 1) % len(r.set)
			kv.Stored = append(kv.Stored, h)
		}
		out = append(out, kv)
	}
	return out
}

// hash is r's next block hash: distinct across replicas and agents (a
// splitmix64 stream per replica), never a probe's.
func (a *fakeAgent) hash(r *fakeReplica) uint64 {
	r.next++
	for {
		h := splitmix(a.seed ^ splitmix(r.uid) ^ r.next*0x9e3779b97f4a7c15)
		if h>>48 != probeTag {
			return h
		}
		r.next++
	}
}

// addProbe queues a probe for the next flush.
func (a *fakeAgent) addProbe(p *probe) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.probeID == "" {
		return errors.New("no replica placed yet")
	}
	p.replica = a.probeID
	a.probe = append(a.probe, p)
	return nil
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// fleetLabel selects the fake nodes: the model's node selector requires it.
const fleetLabel = "fleetsim"

// fakeAddr is every fake replica's address: nothing listens on the discard
// port, and the routers never scrape it (--scrape-interval 1h).
const fakeAddr = "127.0.0.1:9"

func (a *fakeAgent) String() string { return fmt.Sprintf("agent %s", a.id) }
