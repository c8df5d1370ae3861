package zmtp

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The tests publish through zmq4 PUB sockets; zmq4 v0.17.0 starts
		// a writer goroutine per PUB socket that Close never stops.
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}
