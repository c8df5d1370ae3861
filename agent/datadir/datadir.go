// Package datadir is what the agent keeps in its data dir across restarts
// (design §5.4, §6): the session epoch, which must only grow, and the port
// each replica's engine was given, so a restarted agent hands a replica the
// same port and re-adopts engines still listening on theirs. Every file is
// replaced through internal/atomicfile, so a crash leaves the old or the new
// content, never a torn file, and a write survives a power cut: the epoch
// must, to keep sessions ordered (design §5.4).
package datadir

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/llmgw/llmgw/internal/atomicfile"
)

// filePerm is the mode of the data dir's files: the agent's alone.
const filePerm = 0o600

// WriteFileAtomic replaces path with data so that a crash leaves either the
// old or the new content, never a torn file, with the data dir's mode: for
// the agent's own records kept beside the ones of this package.
func WriteFileAtomic(path string, data []byte) error {
	return atomicfile.Write(path, data, filePerm)
}

// ParseEpoch decodes the epoch file: one decimal, surrounding space allowed.
func ParseEpoch(b []byte) (uint64, error) {
	s := strings.TrimSpace(string(b))
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("epoch file: %w", err)
	}
	return v, nil
}

// NextEpoch picks and persists the epoch of a new session:
// max(last persisted + 1, now) (design §5.4). The clock term keeps epochs
// increasing even if the data dir is lost; the persisted term keeps them
// increasing when the clock steps back. A corrupt file is refused rather than
// guessed at: reusing an epoch would make control nodes drop live updates.
func NextEpoch(path string, nowNano int64) (uint64, error) {
	last, err := lastEpoch(path)
	if err != nil {
		return 0, err
	}
	next := last + 1
	if nowNano > 0 && uint64(nowNano) > next {
		next = uint64(nowNano)
	}
	if err := WriteFileAtomic(path, []byte(strconv.FormatUint(next, 10)+"\n")); err != nil {
		return 0, fmt.Errorf("persist epoch: %w", err)
	}
	return next, nil
}

// RaiseEpoch records that a session of this node with epoch held exists
// (a control node said so when it refused this agent's older one), so that
// the next NextEpoch is above it: it persists held when it is above the
// last persisted epoch, and reports whether it did. The caller bounds
// held first: an epoch only grows, so one taken far beyond the clock
// would outlive every later session. A corrupt file is refused, as in
// NextEpoch.
func RaiseEpoch(path string, held uint64) (bool, error) {
	last, err := lastEpoch(path)
	if err != nil {
		return false, err
	}
	if held <= last {
		return false, nil
	}
	if err := WriteFileAtomic(path, []byte(strconv.FormatUint(held, 10)+"\n")); err != nil {
		return false, fmt.Errorf("persist epoch: %w", err)
	}
	return true, nil
}

// lastEpoch is the persisted epoch, 0 when there is none yet.
func lastEpoch(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("read epoch: %w", err)
	}
	last, err := ParseEpoch(b)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return last, nil
}

// Ports hands out engine ports from the configured range and remembers
// them per key (replica id and purpose) in the data dir, so a replica gets
// the same port after an agent restart. It is safe for concurrent use: every
// replica's runner asks it for ports.
type Ports struct {
	mu         sync.Mutex
	path       string
	start, end int
	assigned   map[string]int
	// listenable checks that nothing else holds a port; replaced in tests.
	listenable func(host string, port int) bool
}

// LoadPorts reads the ports file at path (none yet is an empty store) and
// hands out ports from start..end inclusive.
func LoadPorts(path string, start, end int) (*Ports, error) {
	ps := &Ports{path: path, start: start, end: end, assigned: map[string]int{}, listenable: listenable}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return ps, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read ports: %w", err)
	}
	m, err := parsePorts(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	ps.assigned = m
	return ps, nil
}

// parsePorts decodes the ports file: a JSON object of key to port. Ports
// outside 1..65535 are refused.
func parsePorts(b []byte) (map[string]int, error) {
	m := map[string]int{}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("ports file: %w", err)
	}
	if m == nil {
		m = map[string]int{}
	}
	for k, p := range m {
		if p < 1 || p > 65535 {
			return nil, fmt.Errorf("ports file: %q has port %d", k, p)
		}
	}
	return m, nil
}

func listenable(host string, port int) bool {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// Get returns key's port, reusing the remembered one while it is free.
func (ps *Ports) Get(key, host string) (int, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if p, ok := ps.assigned[key]; ok && p >= ps.start && p <= ps.end && ps.listenable(host, p) {
		return p, nil
	}
	taken := make(map[int]bool, len(ps.assigned))
	for k, p := range ps.assigned {
		if k != key {
			taken[p] = true
		}
	}
	for p := ps.start; p <= ps.end; p++ {
		if taken[p] || !ps.listenable(host, p) {
			continue
		}
		ps.assigned[key] = p
		if err := ps.saveLocked(); err != nil {
			delete(ps.assigned, key)
			return 0, err
		}
		return p, nil
	}
	return 0, fmt.Errorf("port range %d-%d: no free port for %s", ps.start, ps.end, key)
}

// Hold records key's port as one an adopted engine already listens on
// (design §6): it is kept for key whether or not it is listenable, and Get
// never hands it to another key.
func (ps *Ports) Hold(key string, port int) error {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if port < 1 || port > 65535 {
		return fmt.Errorf("hold %s: port %d out of range", key, port)
	}
	for k, p := range ps.assigned {
		if p == port && k != key {
			return fmt.Errorf("hold %s: port %d is %s's", key, port, k)
		}
	}
	if ps.assigned[key] == port {
		return nil
	}
	ps.assigned[key] = port
	return ps.saveLocked()
}

// Held returns key's remembered port without checking it is free: the
// port of an engine that is still running.
func (ps *Ports) Held(key string) (int, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p, ok := ps.assigned[key]
	if !ok {
		return 0, fmt.Errorf("no port held for %s", key)
	}
	return p, nil
}

// Release forgets every port whose key starts with prefix.
func (ps *Ports) Release(prefix string) error {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	changed := false
	for k := range ps.assigned {
		if strings.HasPrefix(k, prefix) {
			delete(ps.assigned, k)
			changed = true
		}
	}
	if !changed {
		return nil
	}
	return ps.saveLocked()
}

func (ps *Ports) saveLocked() error {
	b, err := json.MarshalIndent(ps.assigned, "", "  ")
	if err != nil {
		return err
	}
	if err := WriteFileAtomic(ps.path, append(b, '\n')); err != nil {
		return fmt.Errorf("persist ports: %w", err)
	}
	return nil
}
