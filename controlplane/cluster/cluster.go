package cluster

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	autopilot "github.com/hashicorp/raft-autopilot"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/controlplane/gossip"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

var (
	// ErrNotPeer names a server that is not in the Raft configuration.
	ErrNotPeer = errors.New("no such raft peer")
	// ErrRefused is a membership change the cluster will not make (the
	// last voter, the leader itself, a non-voter as transfer target).
	ErrRefused = errors.New("refused")
	// ErrNoGossip is a membership verb on a server without gossip.
	ErrNoGossip = errors.New("this server runs without gossip (--gossip-addr is empty)")
	// ErrUnreachable is a join none of whose addresses answered.
	ErrUnreachable = errors.New("unreachable")
)

// Config is what membership takes from the node's configuration.
type Config struct {
	NodeID  string
	Version string
	// GRPCAddr and HTTPAddr are this server's bound client addresses;
	// GossipAddr the configured gossip address (the bound one is asked of
	// gossip when it runs).
	GRPCAddr, HTTPAddr, GossipAddr string
	BootstrapExpect                int
	// Bootstrap is --bootstrap: this server founded a single-server
	// cluster, so a server started with an expectation of its own is not
	// one of its members (design §5.2 "Cluster identity").
	Bootstrap               bool
	Join                    []string
	JoinRetryInterval       time.Duration
	ServerStabilizationTime time.Duration
	CleanupDeadServers      bool
	AutopilotInterval       time.Duration
	ReconcileInterval       time.Duration
	HeartbeatTimeout        time.Duration
	ApplyTimeout            time.Duration
	LeaveTimeout            time.Duration
	// Verify, when set (a TLS cluster), must succeed for a gossip member
	// before it is added to Raft or bootstrapped with (VerifyByTLS); nil
	// trusts gossip, as a plain-text cluster on loopback must.
	Verify VerifyServer
	// Started is when this server's process started: its own stable time
	// in Peers never exceeds its uptime. Zero: unknown.
	Started time.Time
}

// Raft is this server's Raft member (package store) as membership uses it.
// Configuration changes must be made on the leader; refusals because this
// node does not lead come back as the store's NotLeaderError.
type Raft interface {
	// Servers is the latest configuration; nil when it cannot be read.
	Servers() []raft.Server
	// LeaderID is the leader's id, "" when none is known.
	LeaderID() string
	IsLeader() bool
	HasLeader() bool
	// Existing is whether the node had Raft state when it started.
	Existing() bool
	// RaftAddr is this server's Raft transport address.
	RaftAddr() string
	// LocalStats is this node's last log index and term, and how long ago
	// it heard from the leader (0 on the leader).
	LocalStats() (index, term uint64, lastContact time.Duration)
	// NotLeader is the error naming the leader, for a verb only the
	// leader answers.
	NotLeader() error
	// Bootstrap configures a new cluster of these voters.
	Bootstrap(servers []raft.Server) error
	AddNonvoter(id, raftAddr string) error
	RemoveServer(id string) error
	// TransferLeadership starts a transfer to (id, raftAddr), or to raft's
	// choice when id is "".
	TransferLeadership(id, raftAddr string) error
}

// Gossip is this server's memberlist member (package gossip).
type Gossip interface {
	// Addr is the bound gossip address.
	Addr() string
	// Join contacts addrs and reports how many answered.
	Join(addrs []string) (int, error)
	// Leave announces a graceful leave, waiting up to timeout.
	Leave(timeout time.Duration) error
	// Changed is signalled on every membership change.
	Changed() <-chan struct{}
	// Snapshot is every server ever seen, by id; Member one of them.
	Snapshot() map[string]gossip.Member
	Member(id string) (gossip.Member, bool)
	// Tombstones is a copy of the removal records gossip spreads, by
	// server id; SetRemoved records (or clears) one here, spreads it and
	// returns its time (Unix ns).
	Tombstones() map[string]gossip.Tombstone
	SetRemoved(id string, removed bool) int64
	// Reconnect retries failed (not left) servers keep accepts until ctx
	// ends, and returns once its attempts have stopped.
	Reconnect(ctx context.Context, keep func(id string) bool)
}

// Desired is the replicated state membership reads: the cluster's
// committed minimum version (design §13.3) and the replicated removal
// records of servers (removals.go). Reads return copies.
type Desired interface {
	Config() *llmgwv1.ClusterConfig
	ServerRemoved(id string) (*llmgwv1.ServerRemoval, bool)
	ServerRemovals() []*llmgwv1.ServerRemoval
}

// Proposer commits a command on the leader through the minimum-version
// gate (package gate): what the FSM made of it and its revision, or why
// not — the gate's refusal while a server of the configuration runs an
// older release, a NotLeaderError on a follower, the FSM's validation
// error.
type Proposer interface {
	Propose(ctx context.Context, t llmgwv1.CommandType, payload proto.Message) (any, uint64, error)
}

// Cluster is this server's membership. Create it with New once the client
// addresses are bound; run its background loops with Run and, while this
// server leads, WhileLeading.
type Cluster struct {
	cfg   Config
	log   *slog.Logger
	raft  Raft
	ap    autopilot.Raft
	g     Gossip // nil without gossip
	state Desired
	// propose records removals in the replicated state (nil: gossip only).
	propose Proposer
	pool    *Pool
	now     func() time.Time

	// bootstrapProblem is why --bootstrap-expect refuses to bootstrap (a
	// mismatched expectation), shown by /readyz; "" when none.
	bootstrapProblem atomic.Value
	// versionProblem is why the cluster refuses this server (its version
	// is below the cluster's minimum), shown by /readyz.
	versionProblem atomic.Value
	// autopilotState is autopilot's last judgement while this node leads.
	autopilotState atomic.Pointer[autopilot.State]
	// removals tracks autopilot's removals of failed servers while leading.
	removalsMu sync.Mutex
	removals   *sync.WaitGroup
	// leaving is closed by a graceful Leave once this server is out of the
	// cluster: the node then stops, and the process exits.
	leaving   chan struct{}
	leaveOnce sync.Once
	leaveMu   sync.Mutex // one Leave at a time

	// certifiedMu guards certifiedAt: the Raft address each server id was
	// last verified at (Config.Verify), so a server is dialed once, not at
	// every reconcile, and again when it advertises another address.
	certifiedMu sync.Mutex
	certifiedAt map[string]string
	// notCertified is why each member's last verification failed, for
	// Members (deleted once one succeeds).
	notCertified map[string]string
	// unverified counts failed verifications (a member kept out of Raft).
	unverified atomic.Uint64

	// heardMu guards heard: when this leader's autopilot last had an
	// answer from each server, and what it said (Peers' last contact and
	// uptime). Cleared when leadership is taken, so a figure is never a
	// previous term's.
	heardMu sync.Mutex
	heard   map[raft.ServerID]heardFrom
}

// heardFrom is one server's last answer to autopilot's stats call.
type heardFrom struct {
	at          time.Time
	lastContact time.Duration
	started     time.Time // zero: the server did not say
}

// New returns the membership of this server. ap is the raft member
// autopilot drives (store.Raw); g is nil without gossip; p records
// removals in the replicated state (nil keeps them in gossip only); pool
// reaches the other servers.
func New(cfg Config, r Raft, ap autopilot.Raft, g Gossip, state Desired, p Proposer, pool *Pool, log *slog.Logger, now func() time.Time) *Cluster {
	c := &Cluster{cfg: cfg, log: log, raft: r, ap: ap, g: g, state: state, propose: p, pool: pool, now: now, leaving: make(chan struct{}),
		certifiedAt: map[string]string{}, notCertified: map[string]string{}}
	c.bootstrapProblem.Store("")
	c.versionProblem.Store("")
	return c
}

// BootstrapProblem is why this server refuses to bootstrap, "" when it
// does not.
func (c *Cluster) BootstrapProblem() string { return c.bootstrapProblem.Load().(string) }

// VersionProblem is why the cluster refuses this server, "" when it does
// not.
func (c *Cluster) VersionProblem() string { return c.versionProblem.Load().(string) }

// Left is closed once a graceful Leave has taken this server out.
func (c *Cluster) Left() <-chan struct{} { return c.leaving }

// Conn is the pooled connection to a peer's gRPC address.
func (c *Cluster) Conn(addr string) grpc.ClientConnInterface { return c.pool.Conn(addr) }

// ClientAddr is where clients reach server id: its gRPC address as gossip
// carries it.
func (c *Cluster) ClientAddr(id string) (string, bool) {
	if c.g == nil || id == "" {
		return "", false
	}
	m, ok := c.g.Member(id)
	if !ok || m.Meta.GRPC == "" {
		return "", false
	}
	return m.Meta.GRPC, true
}

// LeaderAddr returns the leader's id and gRPC address as gossip carries
// it; ok is false when either is unknown.
func (c *Cluster) LeaderAddr() (id, addr string, ok bool) {
	id = c.raft.LeaderID()
	addr, ok = c.ClientAddr(id)
	return id, addr, ok
}

// Servers is the list of control servers in the Raft configuration, with
// the client addresses gossip carries, for clients' failover (design
// §5.6); this server first. Without gossip only this server's client
// addresses are known.
func (c *Cluster) Servers() []*llmgwv1.ControlServer {
	leader := c.raft.LeaderID()
	self := &llmgwv1.ControlServer{
		Id: c.cfg.NodeID, GrpcAddr: c.cfg.GRPCAddr, RaftAddr: c.raft.RaftAddr(),
		GossipAddr: c.cfg.GossipAddr, HttpAddr: c.cfg.HTTPAddr, Version: c.cfg.Version,
		Leader: leader == c.cfg.NodeID,
	}
	if c.g != nil {
		self.GossipAddr = c.g.Addr()
	}
	out := []*llmgwv1.ControlServer{self}
	for _, srv := range c.raft.Servers() {
		if string(srv.ID) == c.cfg.NodeID {
			self.Voter = srv.Suffrage == raft.Voter
			continue
		}
		cs := &llmgwv1.ControlServer{Id: string(srv.ID), RaftAddr: string(srv.Address), Leader: string(srv.ID) == leader, Voter: srv.Suffrage == raft.Voter}
		if c.g != nil {
			if m, ok := c.g.Member(string(srv.ID)); ok {
				cs.GrpcAddr, cs.HttpAddr, cs.GossipAddr, cs.Version = m.Meta.GRPC, m.Meta.HTTP, m.GossipAddr, m.Meta.Version
			}
		}
		out = append(out, cs)
	}
	return out
}

// SessionsVisible reports whether this server can see the agent sessions
// held on every server: with gossip the ephemeral plane announces them;
// without it only a lone server sees them all. A leader judges a node down
// only when it can.
func (c *Cluster) SessionsVisible() bool {
	return c.g != nil || len(c.Servers()) == 1
}

// ConfigVersions is the version of every server of the Raft configuration,
// voters and non-voters, as this node knows it: its own, and the others'
// from gossip ("" when unknown). The minimum-version gate reads it.
func (c *Cluster) ConfigVersions() map[string]string {
	out := map[string]string{}
	for _, srv := range c.raft.Servers() {
		id := string(srv.ID)
		switch {
		case id == c.cfg.NodeID:
			out[id] = c.cfg.Version
		case c.g != nil:
			m, _ := c.g.Member(id)
			out[id] = m.Meta.Version
		default:
			out[id] = ""
		}
	}
	return out
}

// Figures are autopilot's health, failure tolerance and voter count
// (design §5.2). The leader has autopilot's judgement; any other server
// estimates from gossip: healthy while a leader is known and every voter
// is alive, tolerating the alive voters beyond a quorum.
func (c *Cluster) Figures() (healthy bool, tolerance, voters int) {
	if st := c.autopilotState.Load(); st != nil && c.raft.IsLeader() {
		return st.Healthy, st.FailureTolerance, len(st.Voters)
	}
	alive := 0
	for _, srv := range c.raft.Servers() {
		if srv.Suffrage != raft.Voter {
			continue
		}
		voters++
		if string(srv.ID) == c.cfg.NodeID {
			alive++
			continue
		}
		if c.g == nil {
			continue
		}
		if m, ok := c.g.Member(string(srv.ID)); ok && m.Status == gossip.StatusAlive {
			alive++
		}
	}
	if voters == 0 {
		return false, 0, 0
	}
	tolerance = max(0, alive-(voters/2+1))
	return c.raft.HasLeader() && alive == voters, tolerance, voters
}

// GossipRaftMismatch is how many servers of the Raft configuration, other
// than this one, this server's gossip does not see live
// (llmgw_control_gossip_raft_mismatch): a server that is down, or one
// gossip has not healed with since a partition. With no gossip, or no
// configuration, it is 0.
func (c *Cluster) GossipRaftMismatch() int {
	if c.g == nil {
		return 0
	}
	n := 0
	for _, srv := range c.raft.Servers() {
		id := string(srv.ID)
		if id == c.cfg.NodeID {
			continue
		}
		if m, ok := c.g.Member(id); !ok || !m.Status.Live() {
			n++
		}
	}
	return n
}
