package main

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// envRunMain makes the test binary run as llmgw itself, for tests whose
// agent starts `llmgw sim` as a process (sleep_test.go).
const envRunMain = "LLMGW_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(envRunMain) == "1" {
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m,
		// `llmgw sim` publishes KV events through a zmq4 PUB socket;
		// zmq4 v0.17.0 starts a writer goroutine per PUB socket that Close
		// never stops (as in package sim's tests).
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}
