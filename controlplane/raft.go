package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"

	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// raftNode is the Raft member and the stores it owns, opened and closed
// together.
type raftNode struct {
	raft      *raft.Raft
	transport *raft.NetworkTransport
	store     *raftboltdb.BoltStore
	adapter   *fsmAdapter
	// existing is whether the node had Raft state when opened: such a node
	// never bootstraps again (plan §5.2).
	existing bool
}

// openRaft opens the stores in cfg.DataDir, starts Raft, and bootstraps a
// single-node cluster when asked and there is no existing state — a node
// that has state never bootstraps again (plan §5.2).
func openRaft(cfg Config, f *fsm.FSM, log *slog.Logger, m *metrics, fatal func(error)) (*raftNode, error) {
	dir := filepath.Join(cfg.DataDir, "raft")
	if err := os.MkdirAll(filepath.Join(dir, "snapshots"), 0o750); err != nil {
		return nil, fmt.Errorf("create raft dir: %w", err)
	}
	hlog := newHCLogger(log.With("subsystem", "raft"))
	store, err := raftboltdb.New(raftboltdb.Options{
		Path: filepath.Join(dir, "raft.db"),
		// The freelist is rewritten on every commit otherwise, and the log
		// store only grows (plan §5.1, anchors §0.9).
		BoltOptions: &bbolt.Options{NoFreelistSync: true, FreelistType: bbolt.FreelistMapType, Timeout: time.Second},
	})
	if err != nil {
		return nil, fmt.Errorf("open raft log store: %w", err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, 2, hlog)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("open raft snapshot store: %w", err)
	}
	trans, err := raft.NewTCPTransportWithLogger(cfg.RaftAddr, nil, 3, 10*time.Second, hlog)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("raft transport on %s: %w", cfg.RaftAddr, err)
	}
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeID)
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	rc.Logger = hlog
	// Metrics come from raft's API and observer into our own registry; the
	// go-metrics global sink stays the library's no-op default.
	rc.NoLegacyTelemetry = true
	existing, err := raft.HasExistingState(store, store, snaps)
	if err != nil {
		trans.Close()
		store.Close()
		return nil, fmt.Errorf("check raft state: %w", err)
	}
	adapter := &fsmAdapter{fsm: f, fatal: fatal, metrics: m, version: cfg.Version}
	r, err := raft.NewRaft(rc, adapter, store, store, snaps, trans)
	if err != nil {
		trans.Close()
		store.Close()
		return nil, fmt.Errorf("start raft: %w", err)
	}
	n := &raftNode{raft: r, transport: trans, store: store, adapter: adapter, existing: existing}
	switch {
	case existing:
		log.Info("raft state found; not bootstrapping")
	case cfg.Bootstrap:
		boot := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: rc.LocalID, Address: trans.LocalAddr()}}}
		if err := r.BootstrapCluster(boot).Error(); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
			n.close(log)
			return nil, fmt.Errorf("bootstrap: %w", err)
		}
		log.Info("bootstrapped a single-node cluster")
	case cfg.BootstrapExpect > 0:
		log.Info("no raft state: waiting for servers to bootstrap with", "bootstrap_expect", cfg.BootstrapExpect)
	default:
		log.Warn("no raft state and no --bootstrap: waiting to be joined")
	}
	return n, nil
}

// close shuts Raft down, then the transport, then the store Raft wrote to.
func (n *raftNode) close(log *slog.Logger) {
	if err := n.raft.Shutdown().Error(); err != nil {
		log.Error("raft shutdown", "err", err)
	}
	if err := n.transport.Close(); err != nil {
		log.Error("raft transport close", "err", err)
	}
	// Close leaves pooled connections to peers open, and each holds a
	// reader goroutine on the peer; release them too.
	n.transport.CloseStreams()
	if err := n.store.Close(); err != nil {
		log.Error("raft store close", "err", err)
	}
}

// applyResult is what the adapter returns through ApplyFuture.Response.
type applyResult struct {
	value any
	err   error
}

// fsmAdapter is the raft.FSM around fsm.FSM: the entry's index passes
// through as the revision.
type fsmAdapter struct {
	fsm     *fsm.FSM
	fatal   func(error)
	metrics *metrics
	// version is this build's; a committed min_version above it stops
	// the node (plan §13.3).
	version string
	// stopped is set by a fatal error: from then on nothing more is
	// applied, so this node stays at its last good revision rather than
	// diverge, while Run shuts it down.
	stopped atomic.Bool
}

var errStopped = errors.New("fsm stopped after a fatal apply error")

func (a *fsmAdapter) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil // raft's own entries carry no command
	}
	if a.stopped.Load() {
		return applyResult{err: errStopped}
	}
	start := time.Now()
	v, err := a.fsm.Apply(l.Index, l.Data)
	a.metrics.applySeconds.Observe(time.Since(start).Seconds())
	if fsm.IsFatal(err) {
		a.stopped.Store(true)
		a.fatal(fmt.Errorf("raft entry %d: %w", l.Index, err))
	}
	if _, ok := v.(*llmgwv1.ClusterConfig); ok {
		a.checkMinVersion()
	}
	return applyResult{value: v, err: err}
}

func (a *fsmAdapter) Snapshot() (raft.FSMSnapshot, error) {
	if a.stopped.Load() {
		// Raft would label the frozen state with its later index; an
		// upgraded build must replay the entries this one could not.
		return nil, errStopped
	}
	b, err := a.fsm.Snapshot()
	if err != nil {
		return nil, err
	}
	return snapshotBytes(b), nil
}

func (a *fsmAdapter) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return fmt.Errorf("read snapshot: %w", err)
	}
	if err := a.fsm.Restore(b); err != nil {
		return err
	}
	a.checkMinVersion()
	return nil
}

type snapshotBytes []byte

func (s snapshotBytes) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s); err != nil {
		sink.Cancel()
		return fmt.Errorf("write snapshot: %w", err)
	}
	return sink.Close()
}

func (snapshotBytes) Release() {}

// newHCLogger adapts hashicorp/raft's hclog output to our slog logger: hclog
// writes one JSON object per entry, which is re-logged with its level and
// fields, so raft's lines share the process's format and keys.
func newHCLogger(log *slog.Logger) hclog.Logger {
	level := hclog.Info
	if log.Enabled(context.Background(), slog.LevelDebug) {
		level = hclog.Debug
	}
	return hclog.New(&hclog.LoggerOptions{
		Name:       "raft",
		Level:      level,
		JSONFormat: true,
		Output:     &hclogWriter{log: log},
	})
}

type hclogWriter struct{ log *slog.Logger }

func (w *hclogWriter) Write(p []byte) (int, error) {
	for _, line := range bytes.Split(p, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var entry map[string]any
		if err := json.Unmarshal(line, &entry); err != nil {
			w.log.Info(string(line))
			continue
		}
		level := slog.LevelInfo
		switch entry["@level"] {
		case "trace", "debug":
			level = slog.LevelDebug
		case "warn":
			level = slog.LevelWarn
		case "error":
			level = slog.LevelError
		}
		msg, _ := entry["@message"].(string)
		attrs := make([]any, 0, 2*len(entry))
		for k, v := range entry {
			if k == "@level" || k == "@message" || k == "@timestamp" || k == "@module" {
				continue
			}
			switch k {
			case "error":
				k = "err"
			case "node", "replica", "model", "request_id":
				// Our stable keys mean our objects; raft's "node" is a
				// Raft peer.
				k = "raft_" + k
			}
			attrs = append(attrs, k, v)
		}
		w.log.Log(context.Background(), level, msg, attrs...)
	}
	return len(p), nil
}
