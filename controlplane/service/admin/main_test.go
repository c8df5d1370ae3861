package admin

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives the tests: the keyring fan-out's calls to the other servers
// end with them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
