package main

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// `llmgw sim` publishes KV events through a zmq4 PUB socket;
		// zmq4 v0.17.0 starts a writer goroutine per PUB socket that Close
		// never stops (as in package sim's tests).
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}
