package supervisor

import (
	"errors"
	"os/exec"
	"syscall"
	"testing"
)

// TestExitError: how an engine ended reads correctly in the replica's
// status and the agent's log. The wait statuses come from real processes
// where the outcome can be forced portably; the rest are Linux's encoding
// (a core dump depends on the machine's ulimit, a real-time signal on
// nothing we run).
func TestExitError(t *testing.T) {
	ran := func(script string) func(t *testing.T) syscall.WaitStatus {
		return func(t *testing.T) syscall.WaitStatus {
			cmd := exec.Command("/bin/sh", "-c", script)
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) {
				t.Fatalf("sh -c %q: %v, want it to fail", script, err)
			}
			return ee.Sys().(syscall.WaitStatus)
		}
	}
	encoded := func(ws uint32) func(*testing.T) syscall.WaitStatus {
		return func(*testing.T) syscall.WaitStatus { return syscall.WaitStatus(ws) }
	}
	tests := []struct {
		name   string
		status func(*testing.T) syscall.WaitStatus
		want   string
	}{
		{"exit status", ran("exit 3"), "exited with status 3"},
		{"SIGKILL (the OOM killer's)", ran("kill -KILL $$"), "killed by signal SIGKILL"},
		{"SIGTERM", ran("kill -TERM $$"), "killed by signal SIGTERM"},
		{"SIGSEGV with a core dump", encoded(0x80 | uint32(syscall.SIGSEGV)), "killed by signal SIGSEGV (core dumped)"},
		{"SIGABRT", encoded(uint32(syscall.SIGABRT)), "killed by signal SIGABRT"},
		{"a signal without a name here", encoded(40), "killed by signal 40"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := exitError(tt.status(t)).Error(); got != tt.want {
				t.Errorf("exitError = %q, want %q", got, tt.want)
			}
		})
	}
}
