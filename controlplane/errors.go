package controlplane

import (
	"context"
	"errors"
	"fmt"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/fsm"
)

// NotLeaderError is a write (or consistent read) sent to a node that is not
// the leader. It carries what the node knows of the leader so a client can
// go there; forwarding writes to the leader comes with HA (plan §5.3).
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

// errOutcomeUnknown is a write whose leader lost office while committing
// it: it may or may not have been applied, so it is not retried blindly.
var errOutcomeUnknown = errors.New("leadership lost while committing; the write may or may not have been applied")

// errCatchingUp is a consistent read on a leader that has not yet applied
// every entry committed before its term; the client retries.
var errCatchingUp = errors.New("the leader is still applying entries of earlier terms")

// errNodeDown refuses an undrain of a node the leader marked down: its
// agent's return makes it active, an operator's word does not.
var errNodeDown = errors.New("the node is down; it becomes active when its agent attaches again")

// errUnknownAdapter is an EnsureAdapter for a name no model's catalog
// lists (the router's 404).
var errUnknownAdapter = errors.New("unknown adapter")

// toStatus maps an error to its gRPC status: the one place that does it
// (plan §5.3).
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var ve *fsm.ValidationError
	var nl *NotLeaderError
	switch {
	case errors.As(err, &ve):
		return status.Error(codes.InvalidArgument, ve.Error())
	case errors.Is(err, fsm.ErrNotFound), errors.Is(err, errUnknownAdapter):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, fsm.ErrConflict):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.As(err, &nl), errors.Is(err, errStopped), errors.Is(err, errCatchingUp), errors.Is(err, raft.ErrEnqueueTimeout):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, errOutcomeUnknown):
		return status.Error(codes.Aborted, err.Error())
	case errors.Is(err, errNotPeer):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, errRefused), errors.Is(err, errNodeDown), errors.Is(err, errGate), errors.Is(err, errBelowMinVersion):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, errNoGossip):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, errUnreachable):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}
