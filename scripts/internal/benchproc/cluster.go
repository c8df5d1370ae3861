package benchproc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Cluster is a benchmark's llmgw processes: control servers, at most one
// agent and routers, their data and logs under Dir.
type Cluster struct {
	// Bin and Ctl are the llmgw and llmgwctl binaries.
	Bin, Ctl string
	Dir      string

	Servers []*Proc
	Agent   *Proc
	Routers []*Proc
}

// StartServers starts n control servers that bootstrap together and
// waits for a leader.
func (c *Cluster) StartServers(n int) error {
	var gossipAddrs []string
	for i := range n {
		id := fmt.Sprintf("s%d", i+1)
		g, gossip := FreeAddr(), FreeAddr()
		gossipAddrs = append(gossipAddrs, gossip)
		c.Servers = append(c.Servers, &Proc{Name: id, Log: filepath.Join(c.Dir, id+".log"), Addr: g,
			Args: []string{"control", "--node-id", id, "--data-dir", filepath.Join(c.Dir, id),
				"--grpc-addr", g, "--raft-addr", FreeAddr(), "--gossip-addr", gossip, "--http-addr", FreeAddr(),
				"--bootstrap-expect", fmt.Sprint(n)}})
	}
	for i, s := range c.Servers {
		var others []string
		for j, g := range gossipAddrs {
			if j != i {
				others = append(others, g)
			}
		}
		if len(others) > 0 {
			s.Args = append(s.Args, "--join", strings.Join(others, ","))
		}
		if err := s.Start(c.Bin); err != nil {
			return err
		}
	}
	return Until(60*time.Second, "a leader", func() bool { return c.Leader() != "" })
}

// Control is the servers' gRPC addresses, as --control takes them.
func (c *Cluster) Control() string {
	addrs := make([]string, len(c.Servers))
	for i, s := range c.Servers {
		addrs[i] = s.Addr
	}
	return strings.Join(addrs, ",")
}

// StartAgent starts the agent n1 with gpus simulated GPUs, its engines
// on ports of portRange ("lo-hi").
func (c *Cluster) StartAgent(gpus int, portRange string) error {
	c.Agent = &Proc{Name: "agent", Log: filepath.Join(c.Dir, "agent.log"),
		Args: []string{"agent", "--node-id", "n1", "--control", c.Control(), "--advertise-addr", "127.0.0.1",
			"--http-addr", FreeAddr(), "--grpc-addr", FreeAddr(), "--gpus", fmt.Sprint(gpus), "--port-range", portRange,
			"--data-dir", filepath.Join(c.Dir, "agent")}}
	return c.Agent.Start(c.Bin)
}

// StartRouter starts router id on free ports; extra goes after the
// standard flags (a --config, say).
func (c *Cluster) StartRouter(id string, extra ...string) (*Proc, error) {
	r := &Proc{Name: id, Log: filepath.Join(c.Dir, id+".log"), Addr: FreeAddr(), Ops: FreeAddr()}
	r.Args = append([]string{"router", "--id", id, "--control", c.Control(), "--ops-addr", r.Ops,
		"--data-dir", filepath.Join(c.Dir, id), "--http-addr", r.Addr}, extra...)
	if err := r.Start(c.Bin); err != nil {
		return nil, err
	}
	c.Routers = append(c.Routers, r)
	return r, nil
}

// ApplyModel writes spec (a model file's YAML) under Dir and applies it.
func (c *Cluster) ApplyModel(name, spec string) error {
	path := filepath.Join(c.Dir, name+".yaml")
	if err := os.WriteFile(path, []byte(spec), 0o644); err != nil {
		return fmt.Errorf("model file: %w", err)
	}
	_, err := c.CtlOut("model", "apply", "-f", path)
	return err
}

// DeleteModel deletes a model applied before.
func (c *Cluster) DeleteModel(name string) error {
	_, err := c.CtlOut("model", "delete", name)
	return err
}

// CtlOut runs llmgwctl against each running server in turn until one
// answers, and returns its standard output.
func (c *Cluster) CtlOut(args ...string) (string, error) {
	last := fmt.Errorf("llmgwctl %s: no server running", strings.Join(args, " "))
	for _, s := range c.Servers {
		if !s.Running() {
			continue
		}
		cmd := exec.Command(c.Ctl, append([]string{"--addr", s.Addr, "--timeout", "20s"}, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err == nil {
			return string(out), nil
		}
		last = fmt.Errorf("llmgwctl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return "", last
}

// Leader is the id of the leader the first answering server names ("" when
// none does).
func (c *Cluster) Leader() string {
	out, err := c.CtlOut("cluster", "status", "-o", "json")
	if err != nil {
		return ""
	}
	var st struct {
		Leader string `json:"leader"`
	}
	_ = json.Unmarshal([]byte(out), &st)
	return st.Leader
}

// StopAll stops the routers, the agent and its engines, then the servers.
func (c *Cluster) StopAll() {
	for _, r := range c.Routers {
		r.Stop()
	}
	if c.Agent != nil {
		c.Agent.Stop()
		// Engines outlive their agent on purpose (design §6); the
		// benchmark's do not.
		files, _ := filepath.Glob(filepath.Join(c.Dir, "agent", "engines", "*.json"))
		for _, f := range files {
			var rec struct {
				PID int `json:"pid"`
			}
			if raw, err := os.ReadFile(f); err == nil && json.Unmarshal(raw, &rec) == nil && rec.PID > 1 {
				_ = syscall.Kill(-rec.PID, syscall.SIGKILL)
				_ = syscall.Kill(rec.PID, syscall.SIGKILL)
			}
		}
	}
	for _, s := range c.Servers {
		s.Stop()
	}
}
