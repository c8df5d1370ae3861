package controlplane

import (
	"errors"
	"fmt"
	"net"
	"time"
)

// Config configures a control node. Validate's errors name the flag
// ("--grpc-addr: ...") or, for settings only the config file has, its key
// ("drain_timeout: ...").
type Config struct {
	// NodeID names this server in Raft and to clients; stable across
	// restarts.
	NodeID string `yaml:"node_id"`
	// DataDir holds the Raft log, stable store and snapshots.
	DataDir string `yaml:"data_dir"`
	// GRPCAddr serves AgentService, WatchService and AdminService.
	GRPCAddr string `yaml:"grpc_addr"`
	// RaftAddr is Raft's TCP transport; it must be reachable by the other
	// servers (not a wildcard address).
	RaftAddr string `yaml:"raft_addr"`
	// GossipAddr is this server's memberlist address (plan §5.4): the
	// address --join and `llmgwctl join` name. Empty runs without gossip: a
	// single server, or a cluster formed by hand, whose Raft membership
	// nothing reconciles.
	GossipAddr string `yaml:"gossip_addr"`
	// HTTPAddr serves /metrics, /healthz and /readyz.
	HTTPAddr string `yaml:"http_addr"`
	// Bootstrap starts a single-node cluster when there is no Raft state.
	Bootstrap bool `yaml:"bootstrap"`
	// BootstrapExpect is the HA bootstrap (plan §5.2): once this many
	// servers with the same expectation see each other over gossip and none
	// has Raft state, the lowest id bootstraps them all as voters. It is
	// also autopilot's MinQuorum: dead servers are never cleaned up below it.
	BootstrapExpect int `yaml:"bootstrap_expect"`
	// Join lists other servers' gossip addresses, joined in the background
	// (every JoinRetryInterval) until one answers.
	Join              []string      `yaml:"join"`
	JoinRetryInterval time.Duration `yaml:"join_retry_interval"`
	// Gossip tunes memberlist (zero values keep its LAN defaults).
	Gossip GossipConfig `yaml:"gossip"`
	// ServerStabilizationTime is how long a new server must be healthy
	// before autopilot promotes it from non-voter to voter.
	ServerStabilizationTime time.Duration `yaml:"server_stabilization_time"`
	// CleanupDeadServers lets autopilot remove servers gossip reports dead,
	// never below BootstrapExpect voters.
	CleanupDeadServers bool `yaml:"cleanup_dead_servers"`
	// AutopilotInterval is how often the leader refreshes autopilot's view
	// of every server's health; it reconciles (promotes, cleans up) at
	// ReconcileInterval.
	AutopilotInterval time.Duration `yaml:"autopilot_interval"`
	// RPCHoldTimeout is how long a server holds a write (or consistent
	// read) while there is no leader or the leader changes, retrying,
	// before answering UNAVAILABLE (Consul's rpc_hold_timeout).
	RPCHoldTimeout time.Duration `yaml:"rpc_hold_timeout"`
	// LeaveTimeout bounds each step of a graceful leave (leadership
	// transfer, removal from Raft, the gossip leave).
	LeaveTimeout time.Duration `yaml:"leave_timeout"`
	// Version is this build's version, reported to clients.
	Version string `yaml:"-"`

	// Raft timings (plan §5.1): the library's 1 s defaults measured p99
	// 2.6 s to a new leader on a LAN.
	HeartbeatTimeout   time.Duration `yaml:"heartbeat_timeout"`
	ElectionTimeout    time.Duration `yaml:"election_timeout"`
	LeaderLeaseTimeout time.Duration `yaml:"leader_lease_timeout"`

	// HeartbeatInterval is how often sessions and watch streams get an
	// application heartbeat (plan §5.6: gRPC keepalive cannot go below
	// 10 s). AgentTimeout ends an agent session that sent nothing for that
	// long (default three heartbeats).
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`
	AgentTimeout      time.Duration `yaml:"agent_timeout"`
	// WatchWait is how long Watch waits for its from_revision to be applied
	// before answering UNAVAILABLE.
	WatchWait time.Duration `yaml:"watch_wait"`
	// WatchQueue bounds each watcher's queue of ephemeral updates; a
	// watcher that fills it is disconnected and resumes.
	WatchQueue int `yaml:"watch_queue"`
	// ReconcileInterval is how often the leader re-runs placement without a
	// state change (to retry what did not fit).
	ReconcileInterval time.Duration `yaml:"reconcile_interval"`
	// ApplyTimeout bounds one Raft proposal.
	ApplyTimeout time.Duration `yaml:"apply_timeout"`

	// NodeDownAfter is how long an ACTIVE node may have no agent session
	// before the leader marks it DOWN; counted from the later of the
	// session's end and the leader's election (plan §5.4: a failover never
	// reschedules replicas that are still serving).
	NodeDownAfter time.Duration `yaml:"node_down_after"`
	// RescheduleAfter is how long a node stays DOWN before its replicas are
	// placed elsewhere (plan §5.5).
	RescheduleAfter time.Duration `yaml:"reschedule_after"`
	// DrainTimeout is how long a draining replica may take to stop before
	// it is removed anyway.
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// EphemeralTick is how often this node sends its agents' updates to the
	// other control nodes, one batch per peer (plan §5.4).
	EphemeralTick time.Duration `yaml:"ephemeral_tick"`

	// LoRA adapters (plan §7.6). AdapterWaitMax caps how long EnsureAdapter
	// waits for LOADED (and is the wait when the caller names none).
	// AdapterMinIdle is how long an adapter must have run nothing before
	// it may be evicted (0: as soon as nothing runs), so a freshly loaded
	// one is not evicted before its first request arrives.
	// AdapterRetryAfter is the retry-after EnsureAdapter answers when every
	// loaded adapter is busy or no replica is ready.
	AdapterWaitMax    time.Duration `yaml:"adapter_wait_max"`
	AdapterMinIdle    time.Duration `yaml:"adapter_min_idle"`
	AdapterRetryAfter time.Duration `yaml:"adapter_retry_after"`
}

// DefaultConfig returns the defaults for one node on loopback, as
// `llmgw dev` runs it.
func DefaultConfig() Config {
	return Config{
		DataDir:            "data/control",
		GRPCAddr:           "127.0.0.1:7400",
		RaftAddr:           "127.0.0.1:7401",
		GossipAddr:         "127.0.0.1:7402",
		HTTPAddr:           "127.0.0.1:7403",
		Version:            "dev",
		HeartbeatTimeout:   500 * time.Millisecond,
		ElectionTimeout:    500 * time.Millisecond,
		LeaderLeaseTimeout: 250 * time.Millisecond,
		HeartbeatInterval:  500 * time.Millisecond,
		AgentTimeout:       1500 * time.Millisecond,
		WatchWait:          2 * time.Second,
		WatchQueue:         1024,
		ReconcileInterval:  5 * time.Second,
		ApplyTimeout:       5 * time.Second,
		NodeDownAfter:      15 * time.Second,
		RescheduleAfter:    60 * time.Second,
		DrainTimeout:       30 * time.Second,
		EphemeralTick:      50 * time.Millisecond,
		AdapterWaitMax:     60 * time.Second,
		AdapterMinIdle:     2 * time.Second,
		AdapterRetryAfter:  time.Second,

		JoinRetryInterval:       time.Second,
		ServerStabilizationTime: 2 * time.Second,
		CleanupDeadServers:      true,
		AutopilotInterval:       500 * time.Millisecond,
		RPCHoldTimeout:          5 * time.Second,
		LeaveTimeout:            5 * time.Second,
	}
}

// Validate returns the first problem, naming the flag.
func (c Config) Validate() error {
	if c.NodeID == "" {
		return errors.New("--node-id: required")
	}
	if c.DataDir == "" {
		return errors.New("--data-dir: required")
	}
	for _, a := range []struct{ flag, addr string }{{"--grpc-addr", c.GRPCAddr}, {"--raft-addr", c.RaftAddr}, {"--http-addr", c.HTTPAddr}} {
		if err := checkAddr(a.addr); err != nil {
			return fmt.Errorf("%s: %w", a.flag, err)
		}
	}
	if c.GossipAddr != "" {
		if err := checkAddr(c.GossipAddr); err != nil {
			return fmt.Errorf("--gossip-addr: %w", err)
		}
	}
	if host, _, _ := net.SplitHostPort(c.RaftAddr); host == "" || net.ParseIP(host).IsUnspecified() {
		return fmt.Errorf("--raft-addr: %q must name an address other servers can reach, not a wildcard", c.RaftAddr)
	}
	if c.Bootstrap && c.BootstrapExpect != 0 {
		return errors.New("--bootstrap and --bootstrap-expect: give one (--bootstrap starts a single node; --bootstrap-expect N waits for N servers)")
	}
	if c.BootstrapExpect < 0 {
		return fmt.Errorf("--bootstrap-expect: must be at least 1, got %d", c.BootstrapExpect)
	}
	if c.GossipAddr == "" {
		switch {
		case c.BootstrapExpect != 0:
			return errors.New("--gossip-addr: required with --bootstrap-expect (servers find each other over gossip)")
		case len(c.Join) != 0:
			return errors.New("--gossip-addr: required with --join")
		}
	}
	for _, j := range c.Join {
		if err := checkAddr(j); err != nil {
			return fmt.Errorf("--join: %w", err)
		}
	}
	if c.Gossip.ProbeInterval < 0 || c.Gossip.ProbeTimeout < 0 || c.Gossip.GossipInterval < 0 || c.Gossip.PushPullInterval < 0 || c.Gossip.SuspicionMult < 0 {
		return errors.New("gossip: timings must not be negative")
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{
		{"--heartbeat-timeout", c.HeartbeatTimeout}, {"--election-timeout", c.ElectionTimeout},
		{"leader_lease_timeout", c.LeaderLeaseTimeout}, {"heartbeat_interval", c.HeartbeatInterval},
		{"agent_timeout", c.AgentTimeout}, {"watch_wait", c.WatchWait},
		{"reconcile_interval", c.ReconcileInterval}, {"apply_timeout", c.ApplyTimeout},
		{"node_down_after", c.NodeDownAfter}, {"reschedule_after", c.RescheduleAfter}, {"drain_timeout", c.DrainTimeout}, {"ephemeral_tick", c.EphemeralTick},
		{"join_retry_interval", c.JoinRetryInterval}, {"--server-stabilization-time", c.ServerStabilizationTime},
		{"autopilot_interval", c.AutopilotInterval}, {"rpc_hold_timeout", c.RPCHoldTimeout}, {"leave_timeout", c.LeaveTimeout},
		{"adapter_wait_max", c.AdapterWaitMax}, {"adapter_retry_after", c.AdapterRetryAfter},
	} {
		if d.v <= 0 {
			return fmt.Errorf("%s: must be positive, got %s", d.flag, d.v)
		}
	}
	if c.LeaderLeaseTimeout > c.HeartbeatTimeout {
		return fmt.Errorf("leader_lease_timeout: %s must not exceed --heartbeat-timeout %s (raft refuses it)", c.LeaderLeaseTimeout, c.HeartbeatTimeout)
	}
	if c.ElectionTimeout < c.HeartbeatTimeout {
		return fmt.Errorf("--election-timeout: %s must be at least --heartbeat-timeout %s (raft refuses it)", c.ElectionTimeout, c.HeartbeatTimeout)
	}
	if c.AdapterMinIdle < 0 {
		return fmt.Errorf("adapter_min_idle: must not be negative, got %s", c.AdapterMinIdle)
	}
	if c.WatchQueue < 1 {
		return fmt.Errorf("watch_queue: must be at least 1, got %d", c.WatchQueue)
	}
	return nil
}

func checkAddr(addr string) error {
	if addr == "" {
		return errors.New("required (host:port)")
	}
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		return fmt.Errorf("%q is not host:port", addr)
	}
	return nil
}
