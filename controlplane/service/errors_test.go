package service

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/controlplane/cluster"
	"github.com/llmgw/llmgw/controlplane/flowview"
	"github.com/llmgw/llmgw/controlplane/quota"
	"github.com/llmgw/llmgw/controlplane/store"
	"github.com/llmgw/llmgw/fsm"
)

func TestToStatus(t *testing.T) {
	tests := []struct {
		err  error
		want codes.Code
	}{
		{nil, codes.OK},
		{fmt.Errorf("apply: %w", &fsm.ValidationError{Field: "replicas", Reason: "must be at least 1"}), codes.InvalidArgument},
		{fmt.Errorf("delete: %w", fsm.ErrNotFound), codes.NotFound},
		{fmt.Errorf("place: %w", fsm.ErrConflict), codes.FailedPrecondition},
		{fmt.Errorf("write: %w", &store.NotLeaderError{}), codes.Unavailable},
		{ErrCatchingUp, codes.Unavailable},
		{fmt.Errorf("propose: %w", raft.ErrEnqueueTimeout), codes.Unavailable},
		{fmt.Errorf("propose: %w", store.ErrOutcomeUnknown), codes.Aborted},
		{fmt.Errorf("remove peer: %w", cluster.ErrNotPeer), codes.NotFound},
		{fmt.Errorf("leave: %w", cluster.ErrRefused), codes.FailedPrecondition},
		{fmt.Errorf("join: %w", cluster.ErrNoGossip), codes.FailedPrecondition},
		{fmt.Errorf("undrain: %w", ErrNodeDown), codes.FailedPrecondition},
		{fmt.Errorf("join: %w", cluster.ErrUnreachable), codes.Unavailable},
		{fmt.Errorf("router r1: %w", quota.ErrFull), codes.ResourceExhausted},
		{fmt.Errorf("flow report of router r1: %w", flowview.ErrFull), codes.ResourceExhausted},
		{fmt.Errorf("%w: session: required", flowview.ErrInvalid), codes.InvalidArgument},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{status.Error(codes.Aborted, "as is"), codes.Aborted},
		{errors.New("boom"), codes.Internal},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.err), func(t *testing.T) {
			if got := status.Code(ToStatus(tt.err)); got != tt.want {
				t.Fatalf("ToStatus(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

// TestNotFoundNamesTheObject: a NOT_FOUND says what is missing, as the FSM
// named it, without the operation and log index wrapped around it.
func TestNotFoundNamesTheObject(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{fmt.Errorf("delete model nope: %w", fmt.Errorf("apply index 4 COMMAND_TYPE_DELETE_MODEL: %w", fmt.Errorf("model %q: %w", "nope", fsm.ErrNotFound))), `model "nope" not found`},
		{fmt.Errorf("revoke api key k: %w", fmt.Errorf("api key %q: %w", "k", fsm.ErrNotFound)), `api key "k" not found`},
		{fmt.Errorf("replica %q: %w (omit the id to place a new one)", "r1", fsm.ErrNotFound), `replica "r1" not found (omit the id to place a new one)`},
		{fsm.ErrNotFound, "not found"},
	}
	for _, tt := range tests {
		if got := status.Convert(ToStatus(tt.err)).Message(); got != tt.want {
			t.Errorf("ToStatus(%v) says %q, want %q", tt.err, got, tt.want)
		}
	}
}
