package service

import (
	"context"
	"errors"
	"strings"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/controlplane/cluster"
	"github.com/llmgw/llmgw/controlplane/flowview"
	"github.com/llmgw/llmgw/controlplane/gate"
	"github.com/llmgw/llmgw/controlplane/leader"
	"github.com/llmgw/llmgw/controlplane/quota"
	"github.com/llmgw/llmgw/controlplane/store"
	"github.com/llmgw/llmgw/fsm"
)

var (
	// ErrCatchingUp is a consistent read on a leader that has not yet
	// applied every entry committed before its term; the client retries.
	ErrCatchingUp = errors.New("the leader is still applying entries of earlier terms")
	// ErrNodeDown refuses an undrain of a node the leader marked down: its
	// agent's return makes it active, an operator's word does not.
	ErrNodeDown = errors.New("the node is down; it becomes active when its agent attaches again")
)

// ToStatus maps an error to its gRPC status: the one place that does it
// (design §5.3). An error that already is a status passes unchanged.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var ve *fsm.ValidationError
	var nl *store.NotLeaderError
	switch {
	case errors.As(err, &ve):
		return status.Error(codes.InvalidArgument, ve.Error())
	case errors.Is(err, fsm.ErrNotFound):
		return status.Error(codes.NotFound, notFound(err))
	case errors.Is(err, leader.ErrUnknownAdapter):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, fsm.ErrConflict):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.As(err, &nl), errors.Is(err, store.ErrStopped), errors.Is(err, ErrCatchingUp), errors.Is(err, raft.ErrEnqueueTimeout):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, store.ErrOutcomeUnknown):
		return status.Error(codes.Aborted, err.Error())
	case errors.Is(err, cluster.ErrNotPeer):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, cluster.ErrRefused), errors.Is(err, ErrNodeDown), errors.Is(err, gate.ErrGate), errors.Is(err, store.ErrBelowMinVersion):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, cluster.ErrNoGossip):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, cluster.ErrUnreachable):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, quota.ErrFull), errors.Is(err, flowview.ErrFull):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, flowview.ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// notFound is the message of an fsm.ErrNotFound chain for an operator:
// what the FSM said was missing — the error that wraps the sentinel,
// `model "x": not found` — as `model "x" not found`, without the
// operation and log index wrapped around it on the way out.
func notFound(err error) string {
	wrapper := err
	for e := err; e != nil; e = errors.Unwrap(e) {
		if u := errors.Unwrap(e); u != nil && errors.Is(u, fsm.ErrNotFound) {
			wrapper = e
		}
	}
	return strings.Replace(wrapper.Error(), ": "+fsm.ErrNotFound.Error(), " "+fsm.ErrNotFound.Error(), 1)
}
