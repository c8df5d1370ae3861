package store

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives the tests: Raft, its transport and the leadership and proposal loops
// end with them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
