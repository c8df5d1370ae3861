package store

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"

	"github.com/llmgw/llmgw/controlplane/logadapt"
	"github.com/llmgw/llmgw/fsm"
	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/netlimit"
	"github.com/llmgw/llmgw/internal/ratelog"
)

// Config is what the store takes from the node's configuration.
type Config struct {
	// NodeID is this server's Raft id.
	NodeID string
	// DataDir holds raft/raft.db and raft/snapshots.
	DataDir string
	// RaftAddr is the TCP transport's address.
	RaftAddr string
	// TLS, when set, makes the transport mutual TLS in both directions,
	// with server certificates only (design §11): whoever holds none can
	// neither send this node Raft RPCs (votes, entries, snapshots) nor
	// receive its log. Nil is plain TCP.
	TLS *mtls.Source
	// Bootstrap starts a single-node cluster when there is no Raft state;
	// BootstrapExpect only shapes the log line of a node that waits.
	Bootstrap       bool
	BootstrapExpect int
	// Raft's timings (design §5.1).
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	// ApplyTimeout bounds a proposal, a configuration change, a restore
	// and the post-election Barrier.
	ApplyTimeout time.Duration
	// Version is this build's: an applied minimum version above it stops
	// the node (design §13.3).
	Version string
	// ClusterID, when set, is the cluster's identity as this server knows
	// it ("" before it knows one): the TLS transport carries it in its
	// handshake and refuses a peer that carries another (design §5.2
	// "Cluster identity"). Nil carries none.
	ClusterID func() string
	// ClientAddr, when set, returns where clients reach a server id (its
	// gRPC address, as gossip carries it), so NotLeaderError can send them
	// there. It is called only after Open has returned.
	ClientAddr func(serverID string) (addr string, ok bool)
	// Conns, when set, bounds the Raft listener: its connections, in total
	// and per address, and the time to a connection's first RPC (see
	// newTransport). Nil bounds nothing.
	Conns *netlimit.Limiter
}

// Store is the Raft member and the stores it owns, opened and closed
// together. Its methods are safe for concurrent use.
type Store struct {
	cfg       Config
	log       *slog.Logger
	metrics   *Metrics
	raft      *raft.Raft
	transport *guard
	bolt      *raftboltdb.BoltStore
	adapter   *fsmAdapter
	// existing is whether the node had Raft state when opened.
	existing bool
	// leaderReady is true while this node leads and has passed the
	// Barrier that applies everything committed before its term.
	leaderReady atomic.Bool
}

// Open opens the stores in cfg.DataDir, starts Raft over f, and bootstraps
// a single-node cluster when asked and there is no existing state — a node
// that has state never bootstraps again (design §5.2). fatal is called (at
// most once that matters) with the error that froze the FSM; the node must
// stop.
func Open(cfg Config, f *fsm.FSM, m *Metrics, log *slog.Logger, fatal func(error)) (*Store, error) {
	dir := filepath.Join(cfg.DataDir, "raft")
	if err := os.MkdirAll(filepath.Join(dir, "snapshots"), 0o750); err != nil {
		return nil, fmt.Errorf("create raft dir: %w", err)
	}
	hlog := logadapt.NewHCLogger(log.With("subsystem", "raft"))
	bolt, err := raftboltdb.New(raftboltdb.Options{
		Path: filepath.Join(dir, "raft.db"),
		// The freelist is rewritten on every commit otherwise, and the log
		// store only grows (design §5.1; Consul and Nomad expose the same option).
		BoltOptions: &bbolt.Options{NoFreelistSync: true, FreelistType: bbolt.FreelistMapType, Timeout: time.Second},
	})
	if err != nil {
		return nil, fmt.Errorf("open raft log store: %w", err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, 2, hlog)
	if err != nil {
		bolt.Close()
		return nil, fmt.Errorf("open raft snapshot store: %w", err)
	}
	// A refusal is logged once a minute per sender, so a foreign server's
	// heartbeats (ten a second) cannot flood the log; the metric counts
	// every one.
	logLimit := ratelog.New(time.Minute, 1024, nil)
	refused := func(rpc, from, why string) {
		m.raftRefused.WithLabelValues(rpc).Inc()
		if logLimit.Allow(from) {
			log.Error("raft refused a server outside this cluster", "rpc", rpc, "from", from, "reason", why)
		}
	}
	nt, err := newTransport(cfg.RaftAddr, cfg.TLS, cfg.ClusterID, refused, cfg.Conns, hlog)
	if err != nil {
		bolt.Close()
		return nil, fmt.Errorf("raft transport on %s: %w", cfg.RaftAddr, err)
	}
	trans := newGuard(nt, refused)
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeID)
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	rc.Logger = hlog
	// Metrics come from raft's API and observer into our own registry; the
	// go-metrics global sink stays the library's no-op default.
	rc.NoLegacyTelemetry = true
	existing, err := raft.HasExistingState(bolt, bolt, snaps)
	if err != nil {
		trans.Close()
		bolt.Close()
		return nil, fmt.Errorf("check raft state: %w", err)
	}
	adapter := &fsmAdapter{fsm: f, fatal: fatal, metrics: m, version: cfg.Version}
	r, err := raft.NewRaft(rc, adapter, bolt, bolt, snaps, trans)
	if err != nil {
		trans.Close()
		bolt.Close()
		return nil, fmt.Errorf("start raft: %w", err)
	}
	cache := &configCache{now: time.Now, ttl: guardConfigTTL, read: func() (map[raft.ServerID]raft.ServerAddress, bool, error) {
		f := r.GetConfiguration()
		if err := f.Error(); err != nil {
			return nil, false, err
		}
		conf := map[raft.ServerID]raft.ServerAddress{}
		for _, srv := range f.Configuration().Servers {
			conf[srv.ID] = srv.Address
		}
		return conf, r.LastIndex() > 0, nil
	}}
	trans.setMembers(cache.get)
	s := &Store{cfg: cfg, log: log, metrics: m, raft: r, transport: trans, bolt: bolt, adapter: adapter, existing: existing}
	switch {
	case existing:
		log.Info("raft state found; not bootstrapping")
	case cfg.Bootstrap:
		boot := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: rc.LocalID, Address: trans.LocalAddr()}}}
		if err := r.BootstrapCluster(boot).Error(); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
			s.Close()
			return nil, fmt.Errorf("bootstrap: %w", err)
		}
		log.Info("bootstrapped a single-node cluster")
	case cfg.BootstrapExpect > 0:
		log.Info("no raft state: waiting for servers to bootstrap with", "bootstrap_expect", cfg.BootstrapExpect)
	default:
		log.Warn("no raft state and no --bootstrap: waiting to be joined")
	}
	return s, nil
}

// Close shuts Raft down, then the transport, then the store Raft wrote to.
func (s *Store) Close() {
	if err := s.raft.Shutdown().Error(); err != nil {
		s.log.Error("raft shutdown", "err", err)
	}
	if err := s.transport.Close(); err != nil {
		s.log.Error("raft transport close", "err", err)
	}
	// Close leaves pooled connections to peers open, and each holds a
	// reader goroutine on the peer; release them too.
	s.transport.CloseStreams()
	if err := s.bolt.Close(); err != nil {
		s.log.Error("raft store close", "err", err)
	}
}

// Existing is whether the node had Raft state when opened: such a node
// never bootstraps (design §5.2).
func (s *Store) Existing() bool { return s.existing }

// Raw is the raft member itself, for raft-autopilot (which drives it
// directly) and for tests. Nothing else should need it.
func (s *Store) Raw() *raft.Raft { return s.raft }

// RaftAddr is the transport's bound address.
func (s *Store) RaftAddr() string { return string(s.transport.LocalAddr()) }

// IsLeader reports whether this node leads now.
func (s *Store) IsLeader() bool { return s.raft.State() == raft.Leader }

// HasLeader reports whether this node knows a leader (itself included).
func (s *Store) HasLeader() bool { return s.LeaderID() != "" }

// LeaderID is the leader's server id, "" when none is known.
func (s *Store) LeaderID() string {
	_, id := s.raft.LeaderWithID()
	return string(id)
}

// LeaderReady is true while this node leads and has applied every entry
// committed before its term (see RunLeadership).
func (s *Store) LeaderReady() bool { return s.leaderReady.Load() }

// Servers is the latest Raft configuration as this node knows it; nil when
// it cannot be read (raft shut down).
func (s *Store) Servers() []raft.Server {
	f := s.raft.GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	return f.Configuration().Servers
}

// LastIndex is the index of the last entry in this node's log.
func (s *Store) LastIndex() uint64 { return s.raft.LastIndex() }

// LastContact is when this node last heard from a leader (zero on the
// leader's own clock and before any contact).
func (s *Store) LastContact() time.Time { return s.raft.LastContact() }

// LastContactSeconds is how long ago this follower heard from the leader;
// 0 on the leader and before any contact.
func (s *Store) LastContactSeconds() float64 {
	if s.IsLeader() {
		return 0
	}
	lc := s.raft.LastContact()
	if lc.IsZero() {
		return 0
	}
	return time.Since(lc).Seconds()
}

// LocalStats is this node's last log index and term, and how long ago it
// heard from the leader (0 on the leader or before any contact): the
// figures the leader's autopilot reads from every server.
func (s *Store) LocalStats() (index, term uint64, lastContact time.Duration) {
	st := s.raft.Stats()
	index, _ = strconv.ParseUint(st["last_log_index"], 10, 64)
	term, _ = strconv.ParseUint(st["last_log_term"], 10, 64)
	if !s.IsLeader() {
		if lc := s.raft.LastContact(); !lc.IsZero() {
			lastContact = time.Since(lc)
		}
	}
	return index, term, lastContact
}

// VerifyLeader asks a quorum whether this node still leads; a
// NotLeaderError when it does not.
func (s *Store) VerifyLeader() error {
	if err := s.raft.VerifyLeader().Error(); err != nil {
		return s.NotLeader()
	}
	return nil
}

// Bootstrap configures a new cluster of the given servers. It fails when
// this node already has state or a configuration.
func (s *Store) Bootstrap(servers []raft.Server) error {
	return s.raft.BootstrapCluster(raft.Configuration{Servers: servers}).Error()
}

// AddNonvoter adds a server to the configuration as a non-voter (on the
// leader); raft-autopilot promotes it once stable.
func (s *Store) AddNonvoter(id, raftAddr string) error {
	return s.configErr(s.raft.AddNonvoter(raft.ServerID(id), raft.ServerAddress(raftAddr), 0, s.cfg.ApplyTimeout).Error())
}

// RemoveServer removes a server from the configuration (on the leader). A
// refusal because this node does not lead is a NotLeaderError; a
// leadership lost while committing the change is ErrOutcomeUnknown.
func (s *Store) RemoveServer(id string) error {
	return s.configErr(s.raft.RemoveServer(raft.ServerID(id), 0, s.cfg.ApplyTimeout).Error())
}

// TransferLeadership asks raft to hand leadership to the server (id, Raft
// address), or to one raft picks when id is "". It returns once raft has
// started the transfer, not when a new leader is known.
func (s *Store) TransferLeadership(id, raftAddr string) error {
	if id == "" {
		return s.raft.LeadershipTransfer().Error()
	}
	return s.raft.LeadershipTransferToServer(raft.ServerID(id), raft.ServerAddress(raftAddr)).Error()
}

// Restore replaces the cluster's state with body (an fsm snapshot) through
// raft's user restore on the leader, labelled index: the leader installs it
// and every follower receives it as a snapshot. body must be one the FSM
// accepts (raft panics otherwise); the caller checks it first.
func (s *Store) Restore(index uint64, body []byte) error {
	meta := &raft.SnapshotMeta{Version: raft.SnapshotVersionMax, Index: index, Size: int64(len(body))}
	if err := s.raft.Restore(meta, bytes.NewReader(body), s.cfg.ApplyTimeout); err != nil {
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipTransferInProgress) || errors.Is(err, raft.ErrRaftShutdown) {
			return s.NotLeader()
		}
		return err
	}
	return nil
}

// configErr maps raft's refusals of configuration changes to ours.
func (s *Store) configErr(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipTransferInProgress) {
		return s.NotLeader()
	}
	if errors.Is(err, raft.ErrLeadershipLost) {
		return ErrOutcomeUnknown
	}
	return err
}
