package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/fsm"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// NotLeaderError is a write (or consistent read) sent to a node that is not
// the leader. It carries what the node knows of the leader so a client can
// go there (design §5.3).
type NotLeaderError struct {
	LeaderID       string
	LeaderRaftAddr string
	// LeaderGRPCAddr is where clients reach the leader, when gossip knows.
	LeaderGRPCAddr string
}

func (e *NotLeaderError) Error() string {
	switch {
	case e.LeaderID == "":
		return "no leader: this server is not the leader and knows none (an election, or this server is cut off from a quorum)"
	case e.LeaderGRPCAddr != "":
		return fmt.Sprintf("not the leader; the leader is %s at %s", e.LeaderID, e.LeaderGRPCAddr)
	}
	return fmt.Sprintf("not the leader; the leader is %s (raft %s)", e.LeaderID, e.LeaderRaftAddr)
}

// ErrOutcomeUnknown is a write whose leader lost office while committing
// it: it may or may not have been applied, so it is not retried blindly.
var ErrOutcomeUnknown = errors.New("leadership lost while committing; the write may or may not have been applied")

// NotLeader is the NotLeaderError this node answers with now.
func (s *Store) NotLeader() error {
	addr, id := s.raft.LeaderWithID()
	e := &NotLeaderError{LeaderID: string(id), LeaderRaftAddr: string(addr)}
	if id != "" && s.cfg.ClientAddr != nil {
		if g, ok := s.cfg.ClientAddr(string(id)); ok {
			e.LeaderGRPCAddr = g
		}
	}
	return e
}

// Propose commits one command through Raft on the leader and returns what
// the FSM made of it and the revision (log index) it was applied at. The
// FSM's refusal of a command (a validation or conflict error) comes back as
// the error, with the revision the entry still moved to. The timeout is
// ApplyTimeout, or ctx's deadline when sooner. Propose does not check the
// minimum-version gate: package gate wraps it.
func (s *Store) Propose(ctx context.Context, t llmgwv1.CommandType, payload proto.Message) (any, uint64, error) {
	if !s.IsLeader() {
		return nil, 0, s.NotLeader()
	}
	b, err := fsm.NewCommand(t, payload)
	if err != nil {
		return nil, 0, err
	}
	timeout := s.cfg.ApplyTimeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = max(time.Until(dl), time.Millisecond)
	}
	start := time.Now()
	f := s.raft.Apply(b, timeout)
	if err := f.Error(); err != nil {
		switch {
		case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress), errors.Is(err, raft.ErrRaftShutdown):
			// Refused before it entered the log: safe to retry elsewhere.
			return nil, 0, s.NotLeader()
		case errors.Is(err, raft.ErrLeadershipLost):
			return nil, 0, fmt.Errorf("propose %s: %w", t, ErrOutcomeUnknown)
		}
		return nil, 0, fmt.Errorf("propose %s: %w", t, err)
	}
	s.metrics.commitSeconds.Observe(time.Since(start).Seconds())
	res, _ := f.Response().(applyResult)
	return res.value, f.Index(), res.err
}
