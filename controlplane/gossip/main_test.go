package gossip

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives the tests: the TLS
// transport's accept loop and handshakes end with its Shutdown.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
