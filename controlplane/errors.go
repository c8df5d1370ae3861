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
}

func (e *NotLeaderError) Error() string {
	if e.LeaderID == "" {
		return "not the leader, and no leader is known"
	}
	return fmt.Sprintf("not the leader; the leader is %s (raft %s)", e.LeaderID, e.LeaderRaftAddr)
}

// errCatchingUp is a consistent read on a leader that has not yet applied
// every entry committed before its term; the client retries.
var errCatchingUp = errors.New("the leader is still applying entries of earlier terms")

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
	case errors.Is(err, fsm.ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, fsm.ErrConflict):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.As(err, &nl), errors.Is(err, errStopped), errors.Is(err, errCatchingUp), errors.Is(err, raft.ErrEnqueueTimeout):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}
