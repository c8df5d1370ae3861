package controlplane

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
		{fmt.Errorf("write: %w", &NotLeaderError{}), codes.Unavailable},
		{errCatchingUp, codes.Unavailable},
		{fmt.Errorf("propose: %w", raft.ErrEnqueueTimeout), codes.Unavailable},
		{fmt.Errorf("propose: %w", errOutcomeUnknown), codes.Aborted},
		{fmt.Errorf("remove peer: %w", errNotPeer), codes.NotFound},
		{fmt.Errorf("leave: %w", errRefused), codes.FailedPrecondition},
		{fmt.Errorf("join: %w", errNoGossip), codes.FailedPrecondition},
		{fmt.Errorf("undrain: %w", errNodeDown), codes.FailedPrecondition},
		{fmt.Errorf("join: %w", errUnreachable), codes.Unavailable},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{status.Error(codes.Aborted, "as is"), codes.Aborted},
		{errors.New("boom"), codes.Internal},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.err), func(t *testing.T) {
			if got := status.Code(toStatus(tt.err)); got != tt.want {
				t.Fatalf("toStatus(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}
