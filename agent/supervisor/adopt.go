package supervisor

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
)

// Adoption describes an engine an earlier agent started and left running
// (design §6 "Engines outlive the agent"). The supervisor watches it instead
// of starting one: it is not the agent's child, so it is watched by polling
// kill(pid, 0) and /proc rather than wait4, and it keeps its incarnation —
// the process is the same one routers and KV mirrors already know by
// (uid, incarnation), so counting up would make them drop a live engine's
// state for nothing. A restart after it exits counts up from there.
type Adoption struct {
	Pid int
	// StartTime is the process's start time from /proc/PID/stat (clock
	// ticks after boot): with the pid, it names one process, so a pid the
	// kernel reused for something else is never adopted or signalled.
	StartTime   uint64
	Incarnation uint64
	Restarts    uint32
	// Started is when the engine was started, for the restart backoff.
	Started time.Time
}

// ProcStartTime reads a process's start time from /proc/PID/stat, the
// guard against pid reuse that Adoption.StartTime carries. A zombie has
// ended: it is reported as not found.
func ProcStartTime(pid int) (uint64, error) {
	if pid <= 0 {
		return 0, fmt.Errorf("pid %d: %w", pid, os.ErrNotExist)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("pid %d: %w", pid, err)
	}
	state, start, err := parseStat(b)
	if err != nil {
		return 0, fmt.Errorf("pid %d: %w", pid, err)
	}
	if state == "Z" || state == "X" {
		return 0, fmt.Errorf("pid %d has exited: %w", pid, os.ErrNotExist)
	}
	return start, nil
}

// parseStat returns the state and start time fields of /proc/PID/stat.
// The command name is parenthesised and may itself hold spaces and ')',
// so fields are counted from the last ')'.
func parseStat(b []byte) (state string, start uint64, err error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return "", 0, errors.New("stat: no command name")
	}
	f := bytes.Fields(b[i+1:])
	// Field 3 (state) is f[0]; field 22 (starttime) is f[19].
	if len(f) < 20 {
		return "", 0, fmt.Errorf("stat: %d fields after the command name, want at least 20", len(f))
	}
	start, err = strconv.ParseUint(string(f[19]), 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("stat: starttime: %w", err)
	}
	return string(f[0]), start, nil
}

// SameProcess reports whether pid still runs and is the process that
// started at start (not a zombie, not a reused pid).
func SameProcess(pid int, start uint64) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	got, err := ProcStartTime(pid)
	return err == nil && got == start
}

// adopted wraps an adoption as a proc whose exit is found by polling. Its
// log is read from the end of the file the engine still appends to.
func (s *Supervisor) adopted(a *Adoption) (*proc, bool) {
	if !SameProcess(a.Pid, a.StartTime) {
		return nil, false
	}
	p := &proc{pid: a.Pid, startTime: a.StartTime, adopted: true}
	if s.cfg.LogPath != "" {
		if r, err := os.Open(s.cfg.LogPath); err == nil {
			if _, err := r.Seek(0, 2); err == nil {
				p.out = r
			} else {
				r.Close()
			}
		}
	}
	return p, true
}

// StopAdopted stops an engine that is not to be adopted after all (it
// failed its health check, or nothing wants it): SIGTERM to its process
// group, SIGKILL after grace, and it returns once the engine is gone. A
// process that is no longer the one described is left alone.
func StopAdopted(a Adoption, grace time.Duration) {
	p := &proc{pid: a.Pid, startTime: a.StartTime, adopted: true}
	if exited, _ := p.poll(); exited {
		return
	}
	p.signalGroup(syscall.SIGTERM)
	for end := time.Now().Add(grace); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if exited, _ := p.poll(); exited {
			return
		}
	}
	p.signalGroup(syscall.SIGKILL)
	p.waitBlocking()
}
