package admin

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/controlplane/cluster"
	"github.com/llmgw/llmgw/controlplane/service"
	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// requirer is a Proposer that can check a command's gate without
// proposing it (controlplane/gate.Gate).
type requirer interface {
	Require(ctx context.Context, t llmgwv1.CommandType) error
}

// Proposer commits commands on the leader through the minimum-version gate
// (package gate): the FSM's result and the revision it was applied at, or
// why not (a NotLeaderError on a follower, the FSM's validation or
// conflict error, the gate's refusal).
type Proposer interface {
	Propose(ctx context.Context, t llmgwv1.CommandType, payload proto.Message) (any, uint64, error)
}

// Desired is the replicated state as this server has applied it (package
// fsm). Every read returns a copy.
type Desired interface {
	State() *llmgwv1.State
	Config() *llmgwv1.ClusterConfig
	Node(id string) (*llmgwv1.Node, bool)
	Revision() uint64
	// Snapshot is the state encoded as an fsm snapshot body.
	Snapshot() ([]byte, error)
	// Tenant, Tenants and Usage read the tenants and the usage roll-up
	// (fsm/tenants.go) without copying the rest of the state: the
	// roll-up holds up to two months of hours.
	Tenant(name string) (*llmgwv1.Tenant, bool)
	Tenants() []*llmgwv1.Tenant
	Usage(tenant, model string, sinceUnix int64) []*llmgwv1.UsageRow
	// Aliases and Alias read the model aliases (fsm/aliases.go).
	Aliases() []*llmgwv1.Alias
	Alias(name string) (*llmgwv1.Alias, bool)
}

// Raft is this server's Raft member (package store).
type Raft interface {
	IsLeader() bool
	// LeaderReady is true while this server leads and has applied every
	// entry committed before its term.
	LeaderReady() bool
	// VerifyLeader confirms leadership with a quorum; a NotLeaderError
	// when this server no longer leads.
	VerifyLeader() error
	NotLeader() error
	LeaderID() string
	LastIndex() uint64
	// LocalStats is this server's last log index and term and how long ago
	// it heard from the leader: the figures ClusterStatus carries.
	LocalStats() (index, term uint64, lastContact time.Duration)
	// Restore replaces the cluster's state with body (an fsm snapshot the
	// FSM accepts) at revision index; a NotLeaderError when this server
	// does not lead.
	Restore(index uint64, body []byte) error
}

// Peers is what this server knows of the others (package cluster).
type Peers interface {
	// Servers is the control servers, this one first, with client
	// addresses where gossip knows them.
	Servers() []*llmgwv1.ControlServer
	// Figures is autopilot's health, failure tolerance and voter count.
	Figures() (healthy bool, tolerance, voters int)
	service.Peers
}

// Membership is the operators' verbs on servers (package cluster). Their
// errors are complete and mapped by service.ToStatus.
type Membership interface {
	Join(addrs []string) (joined int, err error)
	Members() []*llmgwv1.Member
	Peers() ([]*llmgwv1.RaftPeer, error)
	RemovePeer(ctx context.Context, id string) error
	TransferLeadership(ctx context.Context, to string) (leader string, err error)
	Leave(ctx context.Context) (newLeader string, err error)
}

// Reports are the agents' reports (package ephemeral): a replica's last
// status, as its own node reported it for its uid.
type Reports interface {
	StatusOf(r *llmgwv1.Replica) *llmgwv1.ReplicaStatus
	// AdaptersOf is the adapters' states its node reported for r's
	// placement, by adapter name.
	AdaptersOf(r *llmgwv1.Replica) map[string]*llmgwv1.AdapterStatus
	// KVOf is the KV state its node reported for r's placement; nil
	// without KV events.
	KVOf(r *llmgwv1.Replica) *llmgwv1.ReplicaKV
}

// Sessions is every node with an agent session on any server (package
// sessions).
type Sessions interface {
	Connected() map[string]bool
}

// Flows is the leader's table of the routers' flow-control reports
// (package flowview): in memory, so only the leader's is the fleet's.
type Flows interface {
	Status() *llmgwv1.FlowStatusResponse
}

// Scaling is the leader's memory of its placement and autoscaling (package
// leader): why a model's replicas are missing, and the autoscaler's
// decisions, newest first, with the demand the last one saw.
type Scaling interface {
	Unplaced(model string) string
	ScaleStatus(model string) ([]*llmgwv1.ScaleEvent, *llmgwv1.ModelDemand)
}

// Deps are the Service's dependencies; all are required but Keyring,
// Flows and Scaling.
type Deps struct {
	Propose    Proposer
	State      Desired
	Raft       Raft
	Peers      Peers
	Membership Membership
	Reports    Reports
	Sessions   Sessions
	// RestoreMaxBytes bounds a restored snapshot's body (0: the file
	// format's snapfile.MaxBody).
	RestoreMaxBytes uint64
	// Keyring is this server's own keyring operation; nil reports this
	// server as not serving them.
	Keyring LocalKeyring
	// Flows is the routers' flow-control reports as this server holds
	// them when it leads; nil answers FlowStatus UNIMPLEMENTED.
	Flows Flows
	// Scaling is the leader's placement and autoscaling memory; nil
	// answers ModelStatus from the state alone.
	Scaling Scaling
	// Started is when this server's process started (ClusterStatus's
	// started_unix_ms); zero leaves it unset.
	Started time.Time
	// Now is the clock of creation times (a key's, a tenant's); nil is
	// time.Now.
	Now func() time.Time
}

// Service is the AdminService of server self.
type Service struct {
	llmgwv1.UnimplementedAdminServiceServer
	self     string
	propose  Proposer
	state    Desired
	raft     Raft
	peers    Peers
	members  Membership
	reports  Reports
	sessions Sessions
	// restoreMax bounds a restored snapshot's body (snapshot.go).
	restoreMax uint64
	keyring    LocalKeyring
	flows      Flows
	scaling    Scaling
	started    time.Time
	now        func() time.Time
	log        *slog.Logger
}

// New returns the AdminService of server self.
func New(self string, d Deps, log *slog.Logger) *Service {
	now := d.Now
	if now == nil {
		now = time.Now
	}
	return &Service{self: self, propose: d.Propose, state: d.State, raft: d.Raft, peers: d.Peers,
		members: d.Membership, reports: d.Reports, sessions: d.Sessions, restoreMax: d.RestoreMaxBytes, keyring: d.Keyring, flows: d.Flows, scaling: d.Scaling, started: d.Started,
		now: now, log: log}
}

func errValidation(field, reason string) error {
	return &fsm.ValidationError{Field: field, Reason: reason}
}

func (a *Service) ApplyModel(ctx context.Context, req *llmgwv1.ApplyModelRequest) (*llmgwv1.ApplyModelResponse, error) {
	// The same pure validation llmgwctl ran, so a bad model is refused
	// before it costs a log entry; the FSM checks again when applying.
	// What is proposed is the model as given: the FSM fills the cluster's
	// defaults, then the built-in ones, at the revision it applies.
	m := req.GetModel()
	if m == nil {
		return nil, service.ToStatus(&fsm.ValidationError{Field: "model", Reason: "required"})
	}
	if err := fsm.ValidateModel(fsm.ModelDefaults(fsm.ClusterDefaults(m, a.state.Config()))); err != nil {
		return nil, service.ToStatus(err)
	}
	// A spec with elastic-capacity fields is applied alike only by servers
	// of the release that brought them (NeedsRestart ignores them there).
	if r, ok := a.propose.(requirer); ok && (m.Autoscale != nil || m.Priority != 0 || m.Pinned) {
		if err := r.Require(ctx, llmgwv1.CommandType_COMMAND_TYPE_SET_MODEL_SCALE); err != nil {
			return nil, service.ToStatus(fmt.Errorf("apply model %s: %w", m.Name, err))
		}
	}
	res, rev, err := a.propose.Propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_UPSERT_MODEL, &llmgwv1.UpsertModelCommand{Model: m})
	if err != nil {
		return nil, service.ToStatus(fmt.Errorf("apply model %s: %w", m.Name, err))
	}
	stored, _ := res.(*llmgwv1.Model)
	a.log.Info("model applied", "model", m.Name, "revision", rev)
	return &llmgwv1.ApplyModelResponse{Revision: rev, Model: stored}, nil
}

func (a *Service) DeleteModel(ctx context.Context, req *llmgwv1.DeleteModelRequest) (*llmgwv1.DeleteModelResponse, error) {
	_, rev, err := a.propose.Propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_DELETE_MODEL, &llmgwv1.DeleteModelCommand{Name: req.GetName()})
	if err != nil {
		return nil, service.ToStatus(fmt.Errorf("delete model %s: %w", req.GetName(), err))
	}
	a.log.Info("model deleted", "model", req.GetName(), "revision", rev)
	return &llmgwv1.DeleteModelResponse{Revision: rev}, nil
}

// read returns the state to answer a read from. A consistent read needs
// this server to be the leader, past its post-election Barrier (so its FSM
// holds every committed entry of earlier terms), and still the leader when
// it asks a quorum (VerifyLeader): hashicorp/raft has no ReadIndex.
func (a *Service) read(req *llmgwv1.ListRequest) (*llmgwv1.State, error) {
	if err := a.readable(req); err != nil {
		return nil, err
	}
	return a.state.State(), nil
}

// readable is read's check alone, for a read of one part of the state
// (the tenants) rather than a copy of all of it.
func (a *Service) readable(req *llmgwv1.ListRequest) error {
	if req.GetConsistent() {
		if !a.raft.IsLeader() {
			return service.ToStatus(fmt.Errorf("consistent read: %w", a.raft.NotLeader()))
		}
		if !a.raft.LeaderReady() {
			return service.ToStatus(fmt.Errorf("consistent read: %w", service.ErrCatchingUp))
		}
		if err := a.raft.VerifyLeader(); err != nil {
			return service.ToStatus(fmt.Errorf("consistent read: %w", err))
		}
	}
	return nil
}

func (a *Service) ListModels(_ context.Context, req *llmgwv1.ListRequest) (*llmgwv1.ListModelsResponse, error) {
	st, err := a.read(req)
	if err != nil {
		return nil, err
	}
	return &llmgwv1.ListModelsResponse{Revision: st.Revision, Models: st.Models}, nil
}

func (a *Service) ListNodes(_ context.Context, req *llmgwv1.ListRequest) (*llmgwv1.ListNodesResponse, error) {
	st, err := a.read(req)
	if err != nil {
		return nil, err
	}
	return &llmgwv1.ListNodesResponse{Revision: st.Revision, Nodes: st.Nodes, Connected: a.sessions.Connected()}, nil
}

// ListReplicas joins each desired replica with its last status, as its own
// node reported it for the same placement (uid).
func (a *Service) ListReplicas(_ context.Context, req *llmgwv1.ListRequest) (*llmgwv1.ListReplicasResponse, error) {
	st, err := a.read(req)
	if err != nil {
		return nil, err
	}
	out := &llmgwv1.ListReplicasResponse{Revision: st.Revision}
	for _, r := range st.Replicas {
		out.Replicas = append(out.Replicas, &llmgwv1.ReplicaView{Replica: r, Status: a.reports.StatusOf(r), Kv: a.reports.KVOf(r)})
	}
	return out, nil
}

// ClusterStatus is this server's view of the cluster, with autopilot's
// figures (the leader's own judgement on the leader, an estimate from
// gossip elsewhere), and this server's Raft log position and last contact,
// which the leader's autopilot and `llmgwctl upgrade` read. Those are sent
// twice for this release: as the raft_last_* fields, and as the headers
// servers before the fields sent, which an older leader in a rolling
// upgrade still reads. Drop the headers one release after the fields.
func (a *Service) ClusterStatus(ctx context.Context, _ *llmgwv1.ClusterStatusRequest) (*llmgwv1.ClusterStatusResponse, error) {
	idx, term, lc := a.raft.LocalStats()
	_ = grpc.SetHeader(ctx, metadata.Pairs(
		cluster.HeaderLastIndex, strconv.FormatUint(idx, 10),
		cluster.HeaderLastTerm, strconv.FormatUint(term, 10),
		cluster.HeaderLastContact, strconv.FormatInt(lc.Milliseconds(), 10)))
	healthy, tolerance, voters := a.peers.Figures()
	return &llmgwv1.ClusterStatusResponse{
		Leader:            a.raft.LeaderID(),
		Servers:           a.peers.Servers(),
		Revision:          a.state.Revision(),
		ServerId:          a.self,
		Healthy:           healthy,
		FailureTolerance:  int32(tolerance),
		Voters:            int32(voters),
		MinVersion:        a.state.Config().GetMinVersion(),
		ClusterId:         a.state.Config().GetClusterId(),
		RaftLastIndex:     proto.Uint64(idx),
		RaftLastTerm:      proto.Uint64(term),
		RaftLastContactMs: proto.Int64(lc.Milliseconds()),
		StartedUnixMs:     startedMs(a.started),
	}, nil
}

// DrainNode marks a node DRAINING — placement then moves its replicas off
// one at a time, each replacement ready before the old one drains (design
// §5.5) — or, with undrain, ACTIVE again. Undrain refuses a node that is
// DOWN: that is the leader's judgement, which its agent's return clears.
func (a *Service) DrainNode(ctx context.Context, req *llmgwv1.DrainNodeRequest) (*llmgwv1.DrainNodeResponse, error) {
	if req.GetId() == "" {
		return nil, service.ToStatus(errValidation("id", "required"))
	}
	n, ok := a.state.Node(req.Id)
	if !ok {
		return nil, service.ToStatus(fmt.Errorf("node %q: %w", req.Id, fsm.ErrNotFound))
	}
	want, verb := llmgwv1.NodeState_NODE_STATE_DRAINING, "drain"
	if req.Undrain {
		want, verb = llmgwv1.NodeState_NODE_STATE_ACTIVE, "undrain"
		if n.State == llmgwv1.NodeState_NODE_STATE_DOWN {
			return nil, service.ToStatus(fmt.Errorf("undrain node %s: %w", req.Id, service.ErrNodeDown))
		}
	}
	if n.State == want {
		return &llmgwv1.DrainNodeResponse{Revision: a.state.Revision()}, nil
	}
	_, rev, err := a.propose.Propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_SET_NODE_STATE, &llmgwv1.SetNodeStateCommand{Id: req.Id, State: want})
	if err != nil {
		return nil, service.ToStatus(fmt.Errorf("%s node %s: %w", verb, req.Id, err))
	}
	a.log.Info("node state set by operator", "target_node", req.Id, "state", want.String(), "revision", rev)
	return &llmgwv1.DrainNodeResponse{Revision: rev}, nil
}

// SetNodeLabels is AdminService.SetNodeLabels (answered by the leader):
// the gated command of design §13.3.
func (a *Service) SetNodeLabels(ctx context.Context, req *llmgwv1.SetNodeLabelsRequest) (*llmgwv1.SetNodeLabelsResponse, error) {
	if err := fsm.ValidateNodeLabels(req.GetId(), req.GetSet(), req.GetRemove()); err != nil {
		return nil, service.ToStatus(fmt.Errorf("set node labels: %w", err))
	}
	if _, ok := a.state.Node(req.Id); !ok {
		return nil, service.ToStatus(fmt.Errorf("node %q: %w", req.Id, fsm.ErrNotFound))
	}
	res, rev, err := a.propose.Propose(ctx, llmgwv1.CommandType_COMMAND_TYPE_SET_NODE_LABELS, &llmgwv1.SetNodeLabelsCommand{Id: req.Id, Set: req.Set, Remove: req.Remove})
	if err != nil {
		return nil, service.ToStatus(fmt.Errorf("set node labels %s: %w", req.Id, err))
	}
	n, _ := res.(*llmgwv1.Node)
	a.log.Info("node relabeled by operator", "target_node", req.Id, "revision", rev)
	return &llmgwv1.SetNodeLabelsResponse{Revision: rev, Node: n}, nil
}

// startedMs is t in Unix milliseconds; nil (unset) for the zero time.
func startedMs(t time.Time) *int64 {
	if t.IsZero() {
		return nil
	}
	return proto.Int64(t.UnixMilli())
}
