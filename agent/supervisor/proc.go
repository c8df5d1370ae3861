package supervisor

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is one started engine process, the leader of its own process group.
// It is reaped by polling so that no goroutine waits on it. An adopted proc
// (started by an earlier agent) is not our child: it has no cmd, and its
// exit is seen by polling kill(pid, 0) and /proc instead of wait4.
type proc struct {
	cmd    *exec.Cmd
	pid    int
	out    *os.File
	exited bool

	adopted   bool
	startTime uint64
}

// poll reaps the process if it has exited and reports why it did. Once the
// leader is gone, whatever it left in its group is killed: vLLM's worker
// processes must not outlive the engine that owned their GPU memory.
func (p *proc) poll() (bool, error) {
	if p.exited {
		return true, nil
	}
	if p.adopted {
		if SameProcess(p.pid, p.startTime) {
			return false, nil
		}
		p.finish()
		return true, errors.New("adopted engine exited")
	}
	var ws syscall.WaitStatus
	pid, err := syscall.Wait4(p.pid, &ws, syscall.WNOHANG, nil)
	if errors.Is(err, syscall.EINTR) {
		return false, nil
	}
	if err != nil {
		// ECHILD: someone else reaped it; it is gone either way.
		p.finish()
		return true, fmt.Errorf("wait: %w", err)
	}
	if pid == 0 {
		return false, nil
	}
	p.finish()
	return true, exitError(ws)
}

// waitBlocking reaps a process already sent SIGKILL. An adopted process is
// reaped by its new parent; it is waited for (bounded) by polling.
func (p *proc) waitBlocking() {
	if p.exited {
		return
	}
	if p.adopted {
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			if exited, _ := p.poll(); exited {
				return
			}
		}
		p.finish()
		return
	}
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(p.pid, &ws, 0, nil)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	p.finish()
}

func (p *proc) finish() {
	p.exited = true
	_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	if p.cmd != nil {
		_ = p.cmd.Process.Release()
	}
}

// closeLog closes the reading side of the engine's log once it is drained.
func (p *proc) closeLog() {
	if p.out != nil {
		p.out.Close()
		p.out = nil
	}
}

// release lets go of a process left running on purpose.
func (p *proc) release() {
	if p.cmd != nil {
		_ = p.cmd.Process.Release()
	}
	if p.out != nil {
		p.out.Close()
		p.out = nil
	}
}

func (p *proc) signalGroup(sig syscall.Signal) {
	if p.exited {
		return
	}
	_ = syscall.Kill(-p.pid, sig)
}

// exitError says how an engine ended, for the replica's status message and
// the agent's log: "exited with status 1", "killed by signal SIGKILL",
// "killed by signal SIGSEGV (core dumped)". A signal is named by its
// constant, which is what operators search for (SIGKILL is most often the
// kernel's OOM killer); syscall.Signal's String is its description
// ("killed"), which read "killed by killed".
func exitError(ws syscall.WaitStatus) error {
	switch {
	case ws.Exited():
		return fmt.Errorf("exited with status %d", ws.ExitStatus())
	case ws.Signaled():
		core := ""
		if ws.CoreDump() {
			core = " (core dumped)"
		}
		return fmt.Errorf("killed by signal %s%s", signalName(ws.Signal()), core)
	default:
		return fmt.Errorf("ended (wait status %#x)", uint32(ws))
	}
}

// signalNames are the signals an engine is likely to die of, by their
// Linux constants; another is named by its number.
var signalNames = map[syscall.Signal]string{
	syscall.SIGHUP: "SIGHUP", syscall.SIGINT: "SIGINT", syscall.SIGQUIT: "SIGQUIT",
	syscall.SIGILL: "SIGILL", syscall.SIGTRAP: "SIGTRAP", syscall.SIGABRT: "SIGABRT",
	syscall.SIGBUS: "SIGBUS", syscall.SIGFPE: "SIGFPE", syscall.SIGKILL: "SIGKILL",
	syscall.SIGUSR1: "SIGUSR1", syscall.SIGSEGV: "SIGSEGV", syscall.SIGUSR2: "SIGUSR2",
	syscall.SIGPIPE: "SIGPIPE", syscall.SIGALRM: "SIGALRM", syscall.SIGTERM: "SIGTERM",
	syscall.SIGXCPU: "SIGXCPU", syscall.SIGXFSZ: "SIGXFSZ", syscall.SIGSYS: "SIGSYS",
}

func signalName(sig syscall.Signal) string {
	if name, ok := signalNames[sig]; ok {
		return name
	}
	return strconv.Itoa(int(sig))
}

// groupRunning reports whether any process of group pgid still runs.
// Zombies do not count: in a container whose init does not reap, a killed
// grandchild may stay a zombie forever, and it holds nothing but a pid.
func groupRunning(pgid int) bool {
	if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return true
	}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// Fields after the parenthesised command: state, ppid, pgrp, ...
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) >= 3 && f[2] == strconv.Itoa(pgid) && f[0] != "Z" {
			return true
		}
	}
	return false
}
