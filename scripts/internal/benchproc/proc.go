// Package benchproc runs the llmgw processes of the cluster benchmarks
// (scripts/tenantbench, scripts/flowbench): control servers, an agent with
// simulated engines and routers, each a separate process on loopback, so
// a benchmark measures what a deployment would run, its CPU read from
// /proc. It waits on conditions with deadlines, never fixed sleeps.
package benchproc

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Proc is one llmgw process, restartable with the same arguments.
type Proc struct {
	Name string
	// Log is the file its standard output and error are appended to.
	Log  string
	Args []string
	// Addr is a router's API address or a control server's gRPC address.
	Addr string
	// Ops is a router's operations port (/metrics).
	Ops string

	cmd  *exec.Cmd
	done chan struct{}
}

// Start runs bin with p.Args.
func (p *Proc) Start(bin string) error {
	f, err := os.OpenFile(p.Log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("log of %s: %w", p.Name, err)
	}
	defer f.Close()
	p.cmd = exec.Command(bin, p.Args...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	// A process group of its own, so Kill reaches what it started; and
	// it dies with the benchmark, even one that could not stop it (a
	// panic, a kill -9): left over, it would load the next run's machine.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	p.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(p.cmd, p.done)
	return nil
}

// Running reports whether p was started and not stopped or killed since.
func (p *Proc) Running() bool { return p.cmd != nil }

// Stop is SIGTERM, waited for (then SIGKILL to the group after 20 s).
func (p *Proc) Stop() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
	p.cmd = nil
}

// Kill is SIGKILL to p's process group, waited for.
func (p *Proc) Kill() {
	if p.cmd == nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
	p.cmd = nil
}

// CPU is the process's user + system CPU so far (0 when it is not
// running or /proc cannot be read).
func (p *Proc) CPU() time.Duration {
	if p.cmd == nil {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	d, err := ParseStatCPU(b)
	if err != nil {
		return 0
	}
	return d
}

// ParseStatCPU reads utime + stime from the text of /proc/PID/stat. The
// command name in parentheses may hold spaces, so fields count from the
// last ')'.
func ParseStatCPU(stat []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 > len(stat) {
		return 0, fmt.Errorf("stat: no command name: %q", stat)
	}
	f := strings.Fields(string(stat[i+2:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("stat: %d fields after the command name", len(f))
	}
	ut, err := strconv.ParseInt(f[11], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stat utime: %w", err)
	}
	st, err := strconv.ParseInt(f[12], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stat stime: %w", err)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil // USER_HZ 100
}

// FreeAddr is a loopback address with a port free now. It panics when
// no port can be had: the machine is out of ports or descriptors and no
// benchmark can go on.
func FreeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(fmt.Sprintf("benchproc: a free loopback port: %v", err))
	}
	defer ln.Close()
	return ln.Addr().String()
}

// Until polls cond every 200 ms up to d, saying what did not happen.
func Until(d time.Duration, what string, cond func() bool) error {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if cond() {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("%s: not within %v", what, d)
}
