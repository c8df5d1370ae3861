package agent

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives the tests: each session's send and receive loops, and the fake leader's gRPC server
// end with them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
