package agent

import "os"

func init() {
	if os.Getenv("AGENT_TEST_LOG") != "" {
		testLogOut = os.Stderr
	}
}
