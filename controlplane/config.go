package controlplane

import (
	"net"
	"time"

	"github.com/llmgw/llmgw/controlplane/cluster"
	"github.com/llmgw/llmgw/controlplane/console"
	"github.com/llmgw/llmgw/controlplane/gossip"
	"github.com/llmgw/llmgw/internal/configfile"
	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/tracing"
)

// GossipConfig tunes memberlist (package gossip); the zero value keeps its
// LAN defaults.
type GossipConfig = gossip.Config

// Config configures a control node. Its YAML keys (--config, design §2)
// are the flags' names with underscores. Validate's errors name the flag
// and the key ("--grpc-addr (grpc_addr): ...") or, for settings only the
// config file has, the key alone ("drain_timeout: ...").
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
	// GossipAddr is this server's memberlist address (design §5.4): the
	// address --join and `llmgwctl join` name. Empty runs without gossip: a
	// single server, or a cluster formed by hand, whose Raft membership
	// nothing reconciles.
	GossipAddr string `yaml:"gossip_addr"`
	// HTTPAddr serves /metrics, /healthz and /readyz, and the web console
	// under /ui/ (package console; over HTTPS with an admin certificate
	// when TLS is on, to loopback callers when not).
	HTTPAddr string `yaml:"http_addr"`
	// ConsoleRouters are routers' base URLs (http://host:port) whose
	// decision counters the console's routers page reads: routers report
	// nothing to the control plane, which does not know them otherwise.
	ConsoleRouters []string `yaml:"console_router"`
	// Bootstrap starts a single-node cluster when there is no Raft state.
	Bootstrap bool `yaml:"bootstrap"`
	// BootstrapExpect is the HA bootstrap (design §5.2): once this many
	// servers with the same expectation see each other over gossip and none
	// has Raft state, the lowest id bootstraps them all as voters. It is
	// also autopilot's MinQuorum: dead servers are never cleaned up below it.
	BootstrapExpect int `yaml:"bootstrap_expect"`
	// Join lists other servers' gossip addresses, joined in the background
	// until one answers: the first retry after JoinRetryInterval, backing
	// off with jitter to ten times it.
	Join              []string      `yaml:"join"`
	JoinRetryInterval time.Duration `yaml:"join_retry_interval"`
	// Gossip tunes memberlist (zero values keep its LAN defaults) and the
	// reconnect of failed servers (gossip.reconnect_interval, default 3s;
	// gossip.reconnect_timeout, default 72h; design §5.2).
	Gossip GossipConfig `yaml:"gossip"`
	// GossipKeyFile holds one base64 key (16, 24 or 32 bytes) that
	// encrypts and authenticates gossip (design §11). The keyring it starts
	// is persisted in the data dir and wins over the file from then on, so
	// a server restarted after a rotation (llmgwctl keyring) has the
	// current keys.
	GossipKeyFile string `yaml:"gossip_key_file"`
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

	// TLS is the CA, certificate and key (--tls-ca, --tls-cert, --tls-key;
	// tls_ca, tls_cert, tls_key) of mutual TLS on every gRPC service and the
	// Raft transport (design §11). The certificate must be a server's,
	// named as NodeID: it is the identity the other servers check before
	// letting this one into Raft. Without it every connection is plain text
	// and every caller may do anything, so the listeners must then be on
	// loopback unless Insecure.
	TLS mtls.Files `yaml:",inline"`
	// Insecure allows plain-text listeners beyond loopback (--insecure):
	// the operator's explicit acceptance that anyone who can reach them
	// may act as any server, agent or admin.
	Insecure bool `yaml:"insecure"`

	// Raft timings (design §5.1): the library's 1 s defaults measured p99
	// 2.6 s to a new leader on a LAN.
	HeartbeatTimeout   time.Duration `yaml:"heartbeat_timeout"`
	ElectionTimeout    time.Duration `yaml:"election_timeout"`
	LeaderLeaseTimeout time.Duration `yaml:"leader_lease_timeout"`

	// HeartbeatInterval is how often sessions and watch streams get an
	// application heartbeat (design §5.6: gRPC keepalive cannot go below
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
	// session's end and the leader's election (design §5.4: a failover never
	// reschedules replicas that are still serving).
	NodeDownAfter time.Duration `yaml:"node_down_after"`
	// RescheduleAfter is how long a node stays DOWN before its replicas are
	// placed elsewhere (design §5.5).
	RescheduleAfter time.Duration `yaml:"reschedule_after"`
	// DrainTimeout is how long a draining replica may take to stop before
	// it is removed anyway.
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// EphemeralTick is how often this node sends its agents' updates to the
	// other control nodes, one batch per peer (design §5.4).
	EphemeralTick time.Duration `yaml:"ephemeral_tick"`

	// LoRA adapters (design §7.6). AdapterWaitMax caps how long EnsureAdapter
	// waits for LOADED (and is the wait when the caller names none).
	// AdapterMinIdle is how long an adapter must have run nothing before
	// it may be evicted (0: as soon as nothing runs), so a freshly loaded
	// one is not evicted before its first request arrives.
	// AdapterRetryAfter is the retry-after EnsureAdapter answers when every
	// loaded adapter is busy or no replica is ready.
	AdapterWaitMax    time.Duration `yaml:"adapter_wait_max"`
	AdapterMinIdle    time.Duration `yaml:"adapter_min_idle"`
	AdapterRetryAfter time.Duration `yaml:"adapter_retry_after"`

	// The autoscaler's timings where a model's autoscale spec leaves them
	// at 0 (design §5.7): how long every recommendation must stay below
	// the count before a step down, and the least time between two steps.
	AutoscaleScaleDownAfter time.Duration `yaml:"autoscale_scale_down_after"`
	AutoscaleCooldown       time.Duration `yaml:"autoscale_cooldown"`
	// AutoscaleUpAfter is how long every recommendation must stay above
	// the count before a step up (scaling from zero excepted).
	AutoscaleUpAfter time.Duration `yaml:"autoscale_up_after"`

	// Limits bounds what peers can make this node hold (design §11).
	Limits LimitsConfig `yaml:",inline"`
	// Tracing traces the node's gRPC calls, served and made to its peers,
	// with otelgrpc (design §9 "Tracing"): --otlp-traces-endpoint,
	// --trace-sampling-ratio, --trace-insecure, --trace-ca. Off by default.
	Tracing tracing.Config `yaml:",inline"`
}

// DefaultConfig returns the defaults for one node on loopback, as
// `llmgw dev` runs it.
func DefaultConfig() Config {
	return Config{
		Tracing:            tracing.DefaultConfig(),
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

		AutoscaleScaleDownAfter: 5 * time.Minute,
		AutoscaleCooldown:       30 * time.Second,
		AutoscaleUpAfter:        15 * time.Second,

		JoinRetryInterval:       time.Second,
		ServerStabilizationTime: 2 * time.Second,
		CleanupDeadServers:      true,
		AutopilotInterval:       500 * time.Millisecond,
		RPCHoldTimeout:          5 * time.Second,
		LeaveTimeout:            5 * time.Second,

		Limits: DefaultLimits(),
	}
}

// Validate reports every problem of c, joined (errors.Join), each naming
// the setting as the user wrote it.
func (c Config) Validate() error {
	var p configfile.Problems
	if c.NodeID == "" {
		p.Add(configfile.Flag("node-id"), "required")
	}
	if c.DataDir == "" {
		p.Add(configfile.Flag("data-dir"), "required")
	}
	for _, a := range []struct {
		setting string
		addr    string
	}{{configfile.Flag("grpc-addr"), c.GRPCAddr}, {configfile.Flag("raft-addr"), c.RaftAddr}, {configfile.Flag("http-addr"), c.HTTPAddr}} {
		if err := cluster.CheckAddr(a.addr); err != nil {
			p.Add(a.setting, "%w", err)
		}
	}
	if c.GossipAddr != "" {
		if err := cluster.CheckAddr(c.GossipAddr); err != nil {
			p.Add(configfile.Flag("gossip-addr"), "%w", err)
		}
	}
	if cluster.CheckAddr(c.RaftAddr) == nil {
		if host, _, _ := net.SplitHostPort(c.RaftAddr); host == "" || net.ParseIP(host).IsUnspecified() {
			p.Add(configfile.Flag("raft-addr"), "%q must name an address other servers can reach, not a wildcard", c.RaftAddr)
		}
	}
	if c.Bootstrap && c.BootstrapExpect != 0 {
		p.Add(configfile.Flag("bootstrap")+" and "+configfile.Flag("bootstrap-expect"), "give one (--bootstrap starts a single node; --bootstrap-expect N waits for N servers)")
	}
	if c.Bootstrap && len(c.Join) != 0 {
		p.Add(configfile.Flag("bootstrap")+" and "+configfile.Flag("join"), "give one: --bootstrap starts a cluster of its own, --join joins an existing one (a server started with both would found a second cluster beside the one it joins; design §5.2 \"Cluster identity\")")
	}
	if c.BootstrapExpect < 0 {
		p.Add(configfile.Flag("bootstrap-expect"), "must be at least 1, got %d", c.BootstrapExpect)
	}
	if c.GossipAddr == "" {
		if c.BootstrapExpect != 0 {
			p.Add(configfile.Flag("gossip-addr"), "required with --bootstrap-expect (servers find each other over gossip)")
		}
		if len(c.Join) != 0 {
			p.Add(configfile.Flag("gossip-addr"), "required with --join")
		}
	}
	if c.GossipKeyFile != "" {
		if c.GossipAddr == "" {
			p.Add(configfile.Flag("gossip-key-file"), "needs --gossip-addr (it encrypts gossip)")
		}
		if _, err := gossip.ReadKeyFile(c.GossipKeyFile); err != nil {
			p.Add(configfile.Flag("gossip-key-file"), "%w", err)
		}
	}
	for _, r := range c.ConsoleRouters {
		if err := console.CheckRouterURL(r); err != nil {
			p.Add(configfile.Flag("console-router"), "%w", err)
		}
	}
	for _, j := range c.Join {
		if err := cluster.CheckAddr(j); err != nil {
			p.Add(configfile.Flag("join"), "%w", err)
		}
	}
	for _, g := range []struct {
		key string
		v   time.Duration
	}{
		{"probe_interval", c.Gossip.ProbeInterval}, {"probe_timeout", c.Gossip.ProbeTimeout},
		{"gossip_interval", c.Gossip.GossipInterval}, {"push_pull_interval", c.Gossip.PushPullInterval},
		{"reconnect_interval", c.Gossip.ReconnectInterval}, {"reconnect_timeout", c.Gossip.ReconnectTimeout},
	} {
		if g.v < 0 {
			p.Add("gossip."+g.key, "must not be negative, got %s", g.v)
		}
	}
	if c.Gossip.SuspicionMult < 0 {
		p.Add("gossip.suspicion_mult", "must not be negative, got %d", c.Gossip.SuspicionMult)
	}
	for _, d := range []struct {
		setting string
		v       time.Duration
	}{
		{configfile.Flag("heartbeat-timeout"), c.HeartbeatTimeout}, {configfile.Flag("election-timeout"), c.ElectionTimeout},
		{"leader_lease_timeout", c.LeaderLeaseTimeout}, {"heartbeat_interval", c.HeartbeatInterval},
		{"agent_timeout", c.AgentTimeout}, {"watch_wait", c.WatchWait},
		{"reconcile_interval", c.ReconcileInterval}, {"apply_timeout", c.ApplyTimeout},
		{"node_down_after", c.NodeDownAfter}, {"reschedule_after", c.RescheduleAfter},
		{"drain_timeout", c.DrainTimeout}, {"ephemeral_tick", c.EphemeralTick},
		{"join_retry_interval", c.JoinRetryInterval}, {configfile.Flag("server-stabilization-time"), c.ServerStabilizationTime},
		{"autopilot_interval", c.AutopilotInterval}, {configfile.Flag("rpc-hold-timeout"), c.RPCHoldTimeout},
		{"leave_timeout", c.LeaveTimeout},
		{"adapter_wait_max", c.AdapterWaitMax}, {"adapter_retry_after", c.AdapterRetryAfter},
		{"autoscale_scale_down_after", c.AutoscaleScaleDownAfter}, {"autoscale_cooldown", c.AutoscaleCooldown},
		{"autoscale_up_after", c.AutoscaleUpAfter},
	} {
		if d.v <= 0 {
			p.Add(d.setting, "must be positive, got %s", d.v)
		}
	}
	if c.HeartbeatTimeout > 0 && c.LeaderLeaseTimeout > c.HeartbeatTimeout {
		p.Add("leader_lease_timeout", "%s must not exceed %s %s (raft refuses it)", c.LeaderLeaseTimeout, configfile.Flag("heartbeat-timeout"), c.HeartbeatTimeout)
	}
	if c.HeartbeatTimeout > 0 && c.ElectionTimeout > 0 && c.ElectionTimeout < c.HeartbeatTimeout {
		p.Add(configfile.Flag("election-timeout"), "%s must be at least %s %s (raft refuses it)", c.ElectionTimeout, configfile.Flag("heartbeat-timeout"), c.HeartbeatTimeout)
	}
	if c.AdapterMinIdle < 0 {
		p.Add("adapter_min_idle", "must not be negative, got %s", c.AdapterMinIdle)
	}
	if c.WatchQueue < 1 {
		p.Add("watch_queue", "must be at least 1, got %d", c.WatchQueue)
	}
	for _, m := range c.TLS.Missing() {
		p.Add(configfile.Flag(m), "required when any of --tls-ca, --tls-cert, --tls-key is given")
	}
	if !c.TLS.Enabled() && !c.Insecure {
		for _, a := range []struct{ flag, addr string }{{"grpc-addr", c.GRPCAddr}, {"raft-addr", c.RaftAddr}, {"gossip-addr", c.GossipAddr}} {
			if a.addr != "" && cluster.CheckAddr(a.addr) == nil && !mtls.IsLoopback(a.addr) {
				p.Add(configfile.Flag(a.flag), "%q is beyond loopback and there is no TLS: anyone who can reach it could act as any server, agent or admin; give --tls-ca, --tls-cert and --tls-key, bind 127.0.0.1, or pass --insecure to accept the risk", a.addr)
			}
		}
	}
	c.Limits.validate(&p)
	for _, tp := range c.Tracing.Validate() {
		p.Add(configfile.Flag(tp.Flag), "%w", tp.Err)
	}
	return p.Err()
}
