package store

import (
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

var (
	// ErrStopped is every apply (and snapshot) after a fatal apply error:
	// the FSM stays at its last good revision while the node stops.
	ErrStopped = errors.New("fsm stopped after a fatal apply error")
	// ErrBelowMinVersion stops a server whose version is below the
	// cluster's committed minimum (design §13.3).
	ErrBelowMinVersion = errors.New("this server's version is below the cluster's minimum version")
)

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
	metrics *Metrics
	// version is this build's; a committed min_version above it stops
	// the node (design §13.3).
	version string
	// stopped is set by a fatal error: from then on nothing more is
	// applied, so this node stays at its last good revision rather than
	// diverge, while the node shuts it down.
	stopped atomic.Bool
}

func (a *fsmAdapter) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil // raft's own entries carry no command
	}
	if a.stopped.Load() {
		return applyResult{err: ErrStopped}
	}
	start := time.Now()
	// AppendedAt is the leader's clock when it appended the entry, stored
	// in the log, so every node applies the same time.
	var at int64
	if !l.AppendedAt.IsZero() {
		at = l.AppendedAt.Unix()
	}
	v, err := a.fsm.ApplyAt(l.Index, at, l.Data)
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
		return nil, ErrStopped
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

// checkMinVersion stops this server when the state it applied says the
// cluster needs a newer release than it runs: it cannot be trusted with
// the entries that follow (design §13.3).
func (a *fsmAdapter) checkMinVersion() {
	min := a.fsm.Config().GetMinVersion()
	if fsm.AtLeast(a.version, min) {
		return
	}
	a.stopped.Store(true)
	a.fatal(fmt.Errorf("%w: it runs %s, the cluster requires %s or newer (committed at revision %d); downgrading is not possible once a newer command is in use: %w",
		ErrBelowMinVersion, a.version, min, a.fsm.Revision(), fsm.ErrUnknownCommand))
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
