package kv

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if ep := os.Getenv(forgerEnv); ep != "" {
		os.Exit(forge(ep))
	}
	goleak.VerifyTestMain(m,
		// The tests stand in for engines with zmq4 PUB sockets; zmq4
		// v0.17.0 starts a writer goroutine per PUB socket that Close
		// never stops. The listener itself opens no PUB socket.
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}
