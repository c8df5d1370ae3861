package sim

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// zmq4 v0.17.0 starts one writer goroutine per PUB socket that
		// Close never stops (pubSocket.Close does not close its
		// pubMWriter). It holds nothing but an empty queue; there is no
		// way to end it from outside the library.
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}
