package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/chunking"
	"github.com/llmgw/llmgw/controlplane/ephemeral"
	"github.com/llmgw/llmgw/controlplane/service"
	"github.com/llmgw/llmgw/internal/mtls"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Config is what the sessions take from the node's configuration.
type Config struct {
	// Self is this server's id.
	Self string
	// HeartbeatInterval paces heartbeats and the session's checks;
	// AgentTimeout ends a session that sent nothing for that long.
	HeartbeatInterval time.Duration
	AgentTimeout      time.Duration
	// ElectionTimeout: three of them without a leader end the session.
	ElectionTimeout time.Duration
	// RPCHoldTimeout holds a registration while there is no leader;
	// ApplyTimeout bounds its forward to the leader.
	RPCHoldTimeout time.Duration
	ApplyTimeout   time.Duration
	// HelloForwardOnly forwards registrations only by replaying the
	// agent's hello, never with ServerService.RegisterNode: how releases
	// before that RPC forwarded them. Only the build that plays the
	// previous release in the upgrade test sets it.
	HelloForwardOnly bool
	// Bounds limit what one session may make this server hold (bounds.go).
	Bounds Bounds
	// ChunkBytes is the chunk budget the welcome asks the agent to keep
	// to (ephemeral_chunk_bytes): an update larger than it comes as chunks
	// (design §5.4 "Chunks"). 0 asks for whole updates, as servers before
	// chunks did.
	ChunkBytes int
}

// Proposer commits commands on the leader through the minimum-version gate
// (package gate); a NotLeaderError on a follower.
type Proposer interface {
	Propose(ctx context.Context, t llmgwv1.CommandType, payload proto.Message) (any, uint64, error)
}

// Desired is the replicated state as this server has applied it (package
// fsm); reads return copies, Applied's channel closes at the next entry.
type Desired interface {
	Node(id string) (*llmgwv1.Node, bool)
	Replica(id string) (*llmgwv1.Replica, bool)
	NodeDesired(node string) *llmgwv1.DesiredReplicas
	Applied() (uint64, <-chan struct{})
}

// Raft is this server's Raft member (package store).
type Raft interface {
	IsLeader() bool
	HasLeader() bool
	// LastContact is when this server last heard from a leader (zero
	// before any contact).
	LastContact() time.Time
	NotLeader() error
}

// Peers is what the sessions need of the other servers (package cluster).
type Peers interface {
	// Servers is the list agents fail over along, this server first.
	Servers() []*llmgwv1.ControlServer
	service.Peers
}

// Reports keeps the agents' data on this server (package ephemeral).
type Reports interface {
	// Apply applies an update by the (epoch, seq) rule.
	Apply(u *llmgwv1.EphemeralUpdate) ephemeral.Verdict
	// ApplyWithin applies an update from a session within a budget,
	// dropping the node's data when it would break it.
	ApplyWithin(u *llmgwv1.EphemeralUpdate, b ephemeral.Budget) (ephemeral.Verdict, error)
	// Drop forgets a node's data held for epoch.
	Drop(node string, epoch uint64) bool
	// Held is the (epoch, seq) held for a node.
	Held(node string) (epoch, seq uint64, ok bool)
}

// Plane forwards this server's sessions and their accepted updates to the
// other servers (package plane). Its methods do not block.
type Plane interface {
	SessionStarted(node string, epoch uint64)
	SessionEnded(node string, epoch uint64)
	Forward(u *llmgwv1.EphemeralUpdate, received time.Time)
}

// Sessions counts the sessions attached here (package sessions).
type Sessions interface {
	Started(node string)
	Ended(node string)
}

// Deps are the Service's dependencies; all are required.
type Deps struct {
	Propose  Proposer
	State    Desired
	Raft     Raft
	Peers    Peers
	Reports  Reports
	Plane    Plane
	Sessions Sessions
	Metrics  *Metrics
}

// Service is the AgentService.
type Service struct {
	llmgwv1.UnimplementedAgentServiceServer
	cfg      Config
	propose  Proposer
	state    Desired
	raft     Raft
	peers    Peers
	reports  Reports
	plane    Plane
	sessions Sessions
	metrics  *Metrics
	log      *slog.Logger
	seq      atomic.Uint64
}

// New returns the AgentService.
func New(cfg Config, d Deps, log *slog.Logger) *Service {
	return &Service{cfg: cfg, propose: d.Propose, state: d.State, raft: d.Raft, peers: d.Peers, reports: d.Reports,
		plane: d.Plane, sessions: d.Sessions, metrics: d.Metrics, log: log}
}

// Attach runs one agent session:
//   - the first message must be a hello; the node is registered through
//     Raft when it is new, changed or was down;
//   - this side sends a welcome, the node's DesiredReplicas (again on every
//     change to its set or their models), and heartbeats;
//   - the agent's updates are applied by the (epoch, seq) rule; on a gap a
//     full copy is asked for;
//   - a session that sends nothing for AgentTimeout is ended, so the agent
//     reconnects (possibly elsewhere).
//
// Two goroutines: this one sends, a receiver reads. The receiver ends when
// the stream's context does, which returning from here guarantees.
func (a *Service) Attach(stream llmgwv1.AgentService_AttachServer) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil || hello.Node.GetId() == "" || hello.Epoch == 0 {
		return status.Error(codes.InvalidArgument, "attach: the first message must be a hello with node.id and a non-zero epoch")
	}
	nodeID := hello.Node.Id
	log := a.log.With("agent_node", nodeID, "epoch", hello.Epoch)
	if err := checkIdentity(ctx, nodeID); err != nil {
		a.metrics.hellosRefused.WithLabelValues("identity").Inc()
		log.Warn("agent hello refused", "err", err)
		return err
	}
	if err := checkEpoch(hello.Epoch, time.Now()); err != nil {
		a.metrics.hellosRefused.WithLabelValues("epoch_ahead").Inc()
		log.Warn("agent hello refused", "err", err)
		return err
	}
	if service.IsForwarded(ctx) {
		// A server older than ServerService.RegisterNode forwards an
		// agent's registration by replaying its hello: commit it here (the
		// leader) and confirm; the session stays on that server. Kept for
		// one release after RegisterNode, for such servers in a rolling
		// upgrade.
		if err := a.proposeRegister(ctx, hello.Node); err != nil {
			return service.ToStatus(fmt.Errorf("register node %s: %w", nodeID, err))
		}
		log.Info("node registered for a peer's agent session, forwarded as a hello (a server older than ServerService)")
		return stream.Send(&llmgwv1.ControlMessage{Body: &llmgwv1.ControlMessage_Welcome{Welcome: &llmgwv1.Welcome{ServerId: a.cfg.Self}}})
	}
	// A newer session holds the node: this one's updates would all be
	// stale, and it would be ended at its first heartbeat. Say so now,
	// with the epoch held, so the agent's next hello goes above it.
	if held, _, ok := a.reports.Held(nodeID); ok && held > hello.Epoch {
		a.metrics.hellosRefused.WithLabelValues("newer_session").Inc()
		log.Warn("agent hello refused: a newer session holds the node", "held_epoch", held)
		return supersededBy(stream, nodeID, held, hello.Epoch)
	}
	// The session counts from before registration: the leader must not see
	// the node re-activated yet still detached, and mark it down again.
	a.sessions.Started(nodeID)
	defer a.sessions.Ended(nodeID)
	// The other control nodes learn of the session (and its end) from the
	// ephemeral plane, so the leader counts the node attached (design §5.4).
	a.plane.SessionStarted(nodeID, hello.Epoch)
	defer a.plane.SessionEnded(nodeID, hello.Epoch)
	if err := a.registerNode(ctx, hello.Node); err != nil {
		log.Warn("agent hello refused: could not register node", "err", err)
		return service.ToStatus(fmt.Errorf("register node %s: %w", nodeID, err))
	}
	sessionID := fmt.Sprintf("%s/%s/%d", a.cfg.Self, nodeID, a.seq.Add(1))
	servers := a.peers.Servers()
	if err := stream.Send(&llmgwv1.ControlMessage{Body: &llmgwv1.ControlMessage_Welcome{Welcome: &llmgwv1.Welcome{
		SessionId: sessionID, ServerId: a.cfg.Self, Servers: servers, MaxChunkBytes: uint32(max(a.cfg.ChunkBytes, 0)),
	}}}); err != nil {
		return err
	}
	log.Info("agent attached", "session", sessionID)
	defer log.Info("agent detached", "session", sessionID)

	var lastHeard atomic.Int64
	lastHeard.Store(time.Now().UnixNano())
	askFull := make(chan string, 1)
	recvErr := make(chan error, 1)
	go func() {
		recvErr <- a.receive(ctx, stream, nodeID, hello.Epoch, &lastHeard, askFull)
	}()
	// Returning ends the stream's context, which ends the receiver's Recv;
	// it then exits without blocking (recvErr is buffered).
	return a.send(ctx, stream, nodeID, hello.Epoch, servers, &lastHeard, askFull, recvErr)
}

// checkIdentity refuses a hello for a node the caller's certificate does
// not name (design §11): an agent attaches only as its own node. A server
// may send any hello, but only marked forwarded (a follower forwarding a
// registration to the leader, after checking its own agent's certificate;
// the Authorizer has checked that the server is a member): it registers
// the node and holds no session. A session is held only by the agent whose
// certificate names the node, so no server certificate can speak for a
// node's replicas. On plain text nothing is known of the caller and the
// hello is taken as before identities existed. Other roles never get
// here: the Authorizer admits only agents and servers to Attach.
func checkIdentity(ctx context.Context, nodeID string) error {
	id, ok := mtls.FromContext(ctx)
	switch {
	case !ok:
		return nil
	case id.Role == mtls.RoleServer:
		if service.IsForwarded(ctx) {
			return nil
		}
		return status.Errorf(codes.PermissionDenied, "attach as node %s: a server forwards an agent's registration (marked forwarded) but never holds its session; a session needs the agent certificate of node %s; caller is %s", nodeID, nodeID, id)
	case id.Role != mtls.RoleAgent:
		return status.Errorf(codes.PermissionDenied, "attach as node %s needs the agent certificate of node %s; caller is %s", nodeID, nodeID, id)
	case id.Name != nodeID:
		return status.Errorf(codes.PermissionDenied, "agent certificate is for node %s; cannot attach as %s", id.Name, nodeID)
	}
	return nil
}

// maxEpochAhead is how far past this server's clock a session epoch may
// be. An agent's epoch is max(last persisted + 1, now in Unix ns) (design
// §5.4), so a legitimate one is near now: it leads this server's clock by
// the skew between the two clocks, which NTP keeps to milliseconds — or,
// once the agent has gone above a held epoch (heldEpochTrailer), by that
// epoch's lead, itself within this bound when it was taken. An epoch far
// beyond now would win over every later session of the node — the real
// agent's, whose clock cannot catch up — and lock it out until then: a
// day, the bound before, let one forged hello take a node for 23 h. Five
// minutes is far above any skew NTP leaves, and bounds both how far one
// session can lead the clock and how long an agent that cannot go above
// it (an older agent) waits. An agent whose persisted epoch is beyond it
// (its clock was far ahead, then put right) is refused with this message
// until its clock catches up or its epoch file is removed.
const maxEpochAhead = 5 * time.Minute

// checkEpoch refuses a hello epoch more than maxEpochAhead past now.
func checkEpoch(epoch uint64, now time.Time) error {
	limit := uint64(now.Add(maxEpochAhead).UnixNano())
	if epoch > limit {
		return status.Errorf(codes.InvalidArgument, "attach: session epoch %d is more than %s ahead of this server's clock (%d): a newer session could never replace it; fix the agent's clock or its persisted epoch",
			epoch, maxEpochAhead, now.UnixNano())
	}
	return nil
}

// heldEpochTrailer is the trailer in which a hello or session refused
// because a newer session holds its node carries that session's epoch
// (decimal). The agent persists it, so its next session's epoch is above
// it and wins at once, rather than being refused until its clock passes
// the other session's epoch (design §5.4): a session opened elsewhere with
// the node's certificate, or the agent's own from before its data dir was
// lost, never locks the real agent out. agent/session reads it by the same
// name. What it can say is bounded: an epoch is taken only within
// maxEpochAhead of the clock, so a held one is too.
const heldEpochTrailer = "llmgw-held-epoch"

// supersededBy is the ABORTED of a hello or session of epoch whose node a
// newer session (held) holds, with held in the trailer.
func supersededBy(stream llmgwv1.AgentService_AttachServer, nodeID string, held, epoch uint64) error {
	stream.SetTrailer(metadata.Pairs(heldEpochTrailer, strconv.FormatUint(held, 10)))
	return status.Errorf(codes.Aborted, "agent %s has a newer session (epoch %d) than this one (%d): the next session's epoch must be above it", nodeID, held, epoch)
}

func (a *Service) send(ctx context.Context, stream llmgwv1.AgentService_AttachServer, nodeID string, epoch uint64, servers []*llmgwv1.ControlServer, lastHeard *atomic.Int64, askFull <-chan string, recvErr <-chan error) error {
	hb := time.NewTicker(a.cfg.HeartbeatInterval)
	defer hb.Stop()
	var (
		lastSent []byte
		applied  <-chan struct{}
		// A node without a leader for three election timeouts ends its
		// sessions, so agents move to the majority side of a partition
		// (design §5.4). noLeaderSeen is when this session first saw no
		// leader (zero while there is one), lastLed the last time it saw
		// this node lead; leaderless fires at the deadline, so the close
		// does not wait for the next heartbeat tick.
		noLeaderSeen, lastLed time.Time
		leaderless            = time.NewTimer(time.Hour)
	)
	leaderless.Stop()
	defer leaderless.Stop()
	// checkLeader ends the session once the node has been without a
	// leader for three election timeouts, counted from its last contact
	// with one (leaderlessSince).
	checkLeader := func(now time.Time) error {
		switch {
		case a.raft.IsLeader():
			noLeaderSeen, lastLed = time.Time{}, now
			return nil
		case a.raft.HasLeader():
			noLeaderSeen = time.Time{}
			return nil
		case noLeaderSeen.IsZero():
			noLeaderSeen = now
		}
		since := leaderlessSince(a.raft.LastContact(), lastLed, noLeaderSeen)
		limit := 3 * a.cfg.ElectionTimeout
		if now.Sub(since) > limit {
			return status.Errorf(codes.Unavailable, "control node %s has had no leader for %s; attach elsewhere", a.cfg.Self, now.Sub(since).Round(time.Millisecond))
		}
		leaderless.Reset(since.Add(limit).Sub(now) + time.Millisecond)
		return nil
	}
	for recompute := true; ; {
		if recompute {
			_, applied = a.state.Applied()
			d := a.state.NodeDesired(nodeID)
			if key := desiredKey(d); lastSent == nil || string(key) != string(lastSent) {
				if err := stream.Send(&llmgwv1.ControlMessage{Body: &llmgwv1.ControlMessage_Desired{Desired: d}}); err != nil {
					return err
				}
				lastSent = key
			}
		}
		recompute = false
		select {
		case <-ctx.Done():
			return <-recvErr
		case err := <-recvErr:
			return err
		case reason := <-askFull:
			if err := stream.Send(&llmgwv1.ControlMessage{Body: &llmgwv1.ControlMessage_FullCopyRequest{FullCopyRequest: &llmgwv1.FullCopyRequest{Reason: reason}}}); err != nil {
				return err
			}
		case now := <-hb.C:
			if now.Sub(time.Unix(0, lastHeard.Load())) > a.cfg.AgentTimeout {
				return status.Errorf(codes.Unavailable, "agent %s sent nothing for %s", nodeID, a.cfg.AgentTimeout)
			}
			// The agent has a newer session elsewhere (it moved, and this
			// one is a leftover): end this one, so it never speaks for the
			// node again (design §5.4).
			if held, _, ok := a.reports.Held(nodeID); ok && held > epoch {
				return supersededBy(stream, nodeID, held, epoch)
			}
			if err := checkLeader(now); err != nil {
				return err
			}
			// The agent fails over along this list (design §5.6): keep it
			// current as servers and the leader change.
			if cur := a.peers.Servers(); !service.ServersEqual(cur, servers) {
				servers = cur
				if err := stream.Send(&llmgwv1.ControlMessage{Body: &llmgwv1.ControlMessage_Servers{Servers: &llmgwv1.ServerList{Servers: cur}}}); err != nil {
					return err
				}
			}
			if err := stream.Send(&llmgwv1.ControlMessage{Body: &llmgwv1.ControlMessage_Heartbeat{Heartbeat: &llmgwv1.Heartbeat{UnixNano: now.UnixNano()}}}); err != nil {
				return err
			}
		case now := <-leaderless.C:
			if err := checkLeader(now); err != nil {
				return err
			}
		case <-applied:
			recompute = true
		}
	}
}

// leaderlessSince is when this node lost its leader, for the rule that a
// node without one for three election timeouts closes its agent sessions
// (design §5.4). Raft's last contact with a leader is the true start: raft
// itself drops the leader only a heartbeat timeout (0.5–1 s) later, and the
// session sees that on its next tick. A node that led more recently than
// its last contact (raft does not count a leader's own contact) counts
// from when it was last seen leading. With neither (no contact since
// start), firstSeen — when the session first saw no leader — is all
// there is.
func leaderlessSince(lastContact, lastLed, firstSeen time.Time) time.Time {
	since := lastContact
	if lastLed.After(since) {
		since = lastLed
	}
	if since.IsZero() {
		return firstSeen
	}
	return since
}

// desiredKey is what makes two DesiredReplicas "the same set": everything
// but the revision they were read at.
func desiredKey(d *llmgwv1.DesiredReplicas) []byte {
	c := proto.Clone(d).(*llmgwv1.DesiredReplicas)
	c.Revision = 0
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	return b
}

func (a *Service) receive(ctx context.Context, stream llmgwv1.AgentService_AttachServer, nodeID string, epoch uint64, lastHeard *atomic.Int64, askFull chan<- string) error {
	budget := &sessionBudget{state: a.state, node: nodeID, bounds: a.cfg.Bounds, now: time.Now}
	// Chunks wait here until their update is whole; what they may hold is
	// bounded by the session's budget before any of it is applied.
	chunks := chunking.NewAssembler(0)
	for {
		msg, err := stream.Recv()
		if err != nil {
			// Before the context's check: gRPC refusing a message over
			// the limit also resets the stream.
			if recvTooLarge(err) {
				return a.cut(nodeID, epoch, "message_bytes", err, false)
			}
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		received := time.Now()
		lastHeard.Store(received.UnixNano())
		switch body := msg.Body.(type) {
		case *llmgwv1.AgentMessage_Heartbeat:
		case *llmgwv1.AgentMessage_Hello:
			return status.Error(codes.InvalidArgument, "attach: hello sent twice in one session")
		case *llmgwv1.AgentMessage_Update:
			u := body.Update
			// An agent reports only its own node (design §11), and only
			// for the session it said hello with.
			if u.GetNode() != nodeID || u.Epoch != epoch {
				a.metrics.ephemeralUpdates.WithLabelValues("foreign").Inc()
				a.log.Warn("agent update for another node or session dropped", "agent_node", nodeID, "update_node", u.GetNode(), "epoch", u.GetEpoch())
				continue
			}
			if chunking.IsChunk(u) {
				chunks.SetMax(budget.chunkBytes())
				whole, err := chunks.Add(u)
				if err != nil {
					return a.cut(nodeID, epoch, "chunks", err, false)
				}
				if whole == nil {
					continue // more chunks to come
				}
				u = whole
			}
			u = a.ownKV(u, nodeID)
			v, err := a.applyBounded(u, budget)
			a.metrics.ephemeralUpdates.WithLabelValues(v.String()).Inc()
			if fl, ok := errors.AsType[*errFlood](err); ok {
				return a.cut(nodeID, epoch, fl.reason, fl, v == ephemeral.OverBudget && fl.reason != "status_bytes")
			}
			if v == ephemeral.Accepted {
				a.plane.Forward(u, received)
			}
			if v == ephemeral.Gap {
				e, q, _ := a.reports.Held(nodeID)
				select {
				case askFull <- fmt.Sprintf("gap: held epoch %d seq %d, got seq %d", e, q, u.Seq):
				default: // one request in flight is enough
				}
			}
		default:
			a.log.Debug("unknown agent message ignored", "agent_node", nodeID)
		}
	}
}

// ownKV drops what the sending node may not report: statuses of other
// nodes' replicas (ownStatus, design §11), and KV entries of replicas whose
// leader shard is not on the sending node (design §7.5 step 3): only the
// node that runs a replica's engine knows its cache. Adapter statuses are kept only for replicas
// placed on the sending node (design §7.6: the agent that loads an adapter
// reports it). The update keeps its node, epoch and seq, so the acceptance
// rule is unchanged.
func (a *Service) ownKV(u *llmgwv1.EphemeralUpdate, nodeID string) *llmgwv1.EphemeralUpdate {
	var keepStatuses []*llmgwv1.ReplicaStatus
	for _, s := range u.Statuses {
		if a.ownStatus(s, nodeID) {
			keepStatuses = append(keepStatuses, s)
		}
	}
	var keep []*llmgwv1.KVBlocks
	for _, b := range u.Kv {
		if r, ok := a.state.Replica(b.GetReplicaId()); ok && leaderNode(r) == nodeID {
			keep = append(keep, b)
		}
	}
	var keepAdapters []*llmgwv1.AdapterStatus
	for _, s := range u.Adapters {
		if r, ok := a.state.Replica(s.GetReplicaId()); ok && r.Node == nodeID {
			keepAdapters = append(keepAdapters, s)
		}
	}
	if len(keep) == len(u.Kv) && len(keepAdapters) == len(u.Adapters) && len(keepStatuses) == len(u.Statuses) {
		return u
	}
	a.metrics.kvForeign.Add(float64(len(u.Kv) - len(keep)))
	a.metrics.adapterForeign.Add(float64(len(u.Adapters) - len(keepAdapters)))
	a.metrics.statusForeign.Add(float64(len(u.Statuses) - len(keepStatuses)))
	filtered := proto.Clone(u).(*llmgwv1.EphemeralUpdate)
	filtered.Kv, filtered.Adapters, filtered.Statuses = keep, keepAdapters, keepStatuses
	return filtered
}

// ownStatus reports whether a replica status may come from node (design
// §11: an agent reports only its own node's replicas): it must not name
// another node, and a replica this server knows must have its leader shard
// there. A replica not (yet) known here is kept — a lagging server may not
// have applied the placement its agent already runs — and no router reads
// a status from any node but the replica's own.
func (a *Service) ownStatus(s *llmgwv1.ReplicaStatus, node string) bool {
	if s.GetNode() != "" && s.GetNode() != node {
		return false
	}
	r, ok := a.state.Replica(s.GetReplicaId())
	return !ok || leaderNode(r) == node
}

// leaderNode is the node of a replica's rank-0 shard, which serves HTTP and
// publishes KV events.
func leaderNode(r *llmgwv1.Replica) string {
	for _, sh := range r.Shards {
		if sh.Rank == 0 {
			return sh.Node
		}
	}
	return r.Node
}

// registerNode commits the agent's view of its node when it differs from
// the state: new, changed capacity/labels/addresses/version, or down (a
// node that came back is active again). Draining is the operator's and is
// kept.
func (a *Service) registerNode(ctx context.Context, n *llmgwv1.Node) error {
	// Everything the agent reports is kept, so a field added to Node later
	// reaches the state without a change here; state and revision are the
	// control plane's.
	want := proto.Clone(n).(*llmgwv1.Node)
	want.State, want.Revision = llmgwv1.NodeState_NODE_STATE_UNSPECIFIED, 0
	if old, ok := a.state.Node(n.Id); ok {
		wasDown := old.State == llmgwv1.NodeState_NODE_STATE_DOWN
		old.State, old.Revision = llmgwv1.NodeState_NODE_STATE_UNSPECIFIED, 0
		if proto.Equal(old, want) && !wasDown {
			return nil
		}
		if wasDown {
			want.State = llmgwv1.NodeState_NODE_STATE_ACTIVE
		}
	}
	// A follower forwards it to the leader (design §5.3), holding while
	// there is none; the agent is refused only when that fails.
	return service.Hold(ctx, a.cfg.RPCHoldTimeout, func() error { return a.registerOnLeader(ctx, want) })
}

// proposeRegister commits a node registration; this server must lead.
func (a *Service) proposeRegister(ctx context.Context, n *llmgwv1.Node) error {
	_, _, err := a.propose.Propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_REGISTER_NODE, &llmgwv1.RegisterNodeCommand{Node: n})
	return err
}

// registerOnLeader commits the registration here when this server leads,
// or has the leader commit it with ServerService.RegisterNode. A leader
// older than that RPC answers UNIMPLEMENTED; the registration then goes as
// those releases sent it (forwardHello).
func (a *Service) registerOnLeader(ctx context.Context, n *llmgwv1.Node) error {
	if a.raft.IsLeader() {
		return a.proposeRegister(ctx, n)
	}
	_, addr, ok := a.peers.LeaderAddr()
	if !ok {
		return a.raft.NotLeader()
	}
	cctx, cancel := context.WithTimeout(service.ForwardedContext(ctx, a.cfg.Self), a.cfg.ApplyTimeout)
	defer cancel()
	if !a.cfg.HelloForwardOnly {
		_, err := llmgwv1.NewServerServiceClient(a.peers.Conn(addr)).RegisterNode(cctx, &llmgwv1.RegisterNodeRequest{Node: n, ServerId: a.cfg.Self})
		if status.Code(err) != codes.Unimplemented {
			if err != nil {
				return fmt.Errorf("register on the leader at %s: %w", addr, err)
			}
			return nil
		}
		a.log.Debug("the leader predates ServerService.RegisterNode: forwarding the registration as a hello", "agent_node", n.Id, "leader_addr", addr)
	}
	return a.forwardHello(cctx, addr, n)
}

// forwardHello forwards a registration on an Attach marked forwarded, as
// servers before ServerService did: the hello registers, the welcome
// confirms, and the leader keeps no session for it. Drop it one release
// after RegisterNode, with the leader's side in Attach.
func (a *Service) forwardHello(ctx context.Context, addr string, n *llmgwv1.Node) error {
	stream, err := llmgwv1.NewAgentServiceClient(a.peers.Conn(addr)).Attach(ctx)
	if err != nil {
		return fmt.Errorf("forward registration to the leader at %s: %w", addr, err)
	}
	if err := stream.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Hello{Hello: &llmgwv1.AgentHello{Node: n, Epoch: 1}}}); err != nil {
		return fmt.Errorf("forward registration to the leader at %s: %w", addr, err)
	}
	msg, err := stream.Recv()
	if err != nil {
		return fmt.Errorf("forward registration to the leader at %s: %w", addr, err)
	}
	if msg.GetWelcome() == nil {
		return errors.New("forward registration: the leader answered without a welcome")
	}
	stream.CloseSend()
	return nil
}
