package leader

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives the tests: Place runs until
// its context ends, and EnsureAdapter's timers stop with the call.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
