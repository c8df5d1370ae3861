package cluster

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives the tests: the bootstrapper, autopilot and the verification listeners
// end with them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
