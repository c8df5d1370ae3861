package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// controlServer is one `llmgw control` process of an HA cluster (design §5.2),
// on its own loopback ports. It can be killed, stopped and started again
// with the same data directory and flags, as an operator's server would be.
type controlServer struct {
	t                        *testing.T
	id                       string
	grpc, raft, gossip, http string
	ops                      string // a router's operations port (--ops-addr)
	dataDir, logPath         string
	args                     []string
	ctlArgs                  []string // llmgwctl's extra flags (its certificate)
	cmd                      *exec.Cmd
	done                     chan error
}

// serverOpts says how a server starts: expect is --bootstrap-expect (0 for
// none), join the gossip addresses for --join; ctl are the flags llmgwctl
// needs to talk to it (a TLS server's: an admin certificate).
type serverOpts struct {
	expect int
	join   []string
	extra  []string
	ctl    []string
}

// newServer allocates ports and a data directory; start runs it.
func newServer(t *testing.T, id string, o serverOpts) *controlServer {
	t.Helper()
	dir := t.TempDir()
	s := &controlServer{t: t, id: id, grpc: freeAddr(t), raft: freeAddr(t), gossip: freeAddr(t), http: freeAddr(t),
		dataDir: filepath.Join(dir, "data"), logPath: filepath.Join(dir, id+".log"), ctlArgs: o.ctl}
	s.args = []string{"control", "--node-id", id, "--data-dir", s.dataDir,
		"--grpc-addr", s.grpc, "--raft-addr", s.raft, "--gossip-addr", s.gossip, "--http-addr", s.http}
	if o.expect > 0 {
		s.args = append(s.args, "--bootstrap-expect", strconv.Itoa(o.expect))
	}
	if len(o.join) > 0 {
		s.args = append(s.args, "--join", strings.Join(o.join, ","))
	}
	s.args = append(s.args, o.extra...)
	t.Cleanup(func() {
		s.stop()
		if t.Failed() {
			b, _ := os.ReadFile(s.logPath)
			t.Logf("%s output:\n%s", s.id, tail(string(b), 40))
		}
	})
	return s
}

// start runs the server. Its output goes to a file, appended across
// restarts, so no goroutine copies it.
func (s *controlServer) start() {
	s.t.Helper()
	if s.running() {
		s.t.Fatalf("%s is already running", s.id)
	}
	f, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		s.t.Fatal(err)
	}
	defer f.Close()
	fmt.Fprintf(f, "--- start %s\n", strings.Join(s.args, " "))
	s.cmd = exec.Command(bins.llmgw, s.args...)
	s.cmd.Stdout, s.cmd.Stderr = f, f
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.done = make(chan error, 1)
	go func(cmd *exec.Cmd, done chan<- error) { done <- cmd.Wait() }(s.cmd, s.done)
}

func (s *controlServer) running() bool {
	if s.cmd == nil {
		return false
	}
	select {
	case err := <-s.done:
		s.done <- err // keep it for whoever waits next
		return false
	default:
		return true
	}
}

// kill is kill -9: no leave, no leadership transfer.
func (s *controlServer) kill() {
	if !s.running() {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
	s.cmd = nil
}

// stop is Ctrl-C, with a kill after a grace.
func (s *controlServer) stop() {
	if !s.running() {
		s.cmd = nil
		return
	}
	_ = s.cmd.Process.Signal(os.Interrupt)
	grace := within(20 * time.Second)
	select {
	case <-s.done:
	case <-time.After(grace):
		s.t.Errorf("%s did not stop within %v of SIGINT", s.id, grace)
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	s.cmd = nil
}

// exited waits up to within(timeout) for the process to end by itself and
// returns its error (nil for exit status 0); ok is false if it is still
// running.
func (s *controlServer) exited(timeout time.Duration) (err error, ok bool) {
	if s.cmd == nil {
		return nil, true
	}
	select {
	case err = <-s.done:
		s.cmd = nil
		return err, true
	case <-time.After(within(timeout)):
		return nil, false
	}
}

func (s *controlServer) output() string {
	b, _ := os.ReadFile(s.logPath)
	return string(b)
}

// ctl runs llmgwctl against this server.
func (s *controlServer) ctl(args ...string) (string, error) {
	return ctlAt(s.grpc, append(append([]string(nil), s.ctlArgs...), args...)...)
}

func ctlAt(addr string, args ...string) (string, error) {
	cmd := exec.Command(bins.llmgwctl, append([]string{"--addr", addr, "--timeout", within(15 * time.Second).String()}, args...)...)
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return string(out), fmt.Errorf("llmgwctl %s: %s", strings.Join(args, " "), strings.TrimSpace(string(ee.Stderr)))
		}
		return string(out), err
	}
	return string(out), nil
}

// statusView is the part of `llmgwctl cluster status -o json` tests read.
type statusView struct {
	Leader           string `json:"leader"`
	ServerID         string `json:"server_id"`
	Healthy          bool   `json:"healthy"`
	FailureTolerance int    `json:"failure_tolerance"`
	Voters           int    `json:"voters"`
	MinVersion       string `json:"min_version"`
	Servers          []struct {
		ID     string `json:"id"`
		Leader bool   `json:"leader"`
		Voter  bool   `json:"voter"`
	} `json:"servers"`
}

func (s *controlServer) status() (statusView, error) {
	var v statusView
	out, err := s.ctl("cluster", "status", "-o", "json")
	if err != nil {
		return v, err
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		return v, fmt.Errorf("decode cluster status: %w: %s", err, out)
	}
	return v, nil
}

// peerView is one entry of `llmgwctl raft list-peers -o json`.
type peerView struct {
	ID      string `json:"id"`
	Address string `json:"address"`
	Voter   bool   `json:"voter"`
	Leader  bool   `json:"leader"`
	Healthy bool   `json:"healthy"`
}

func (s *controlServer) peers() ([]peerView, error) {
	out, err := s.ctl("raft", "list-peers", "-o", "json")
	if err != nil {
		return nil, err
	}
	var v []peerView // one item per peer (docs/operations.md, "-o json")
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		return nil, fmt.Errorf("decode list-peers: %w: %s", err, out)
	}
	sort.Slice(v, func(i, j int) bool { return v[i].ID < v[j].ID })
	return v, nil
}

// cluster is the servers a test started, in start order.
type cluster struct {
	t       *testing.T
	servers []*controlServer
}

// startCluster starts n servers, each with --bootstrap-expect n and --join
// every other one's gossip address, as the plan's operator does (§5.2).
func startCluster(t *testing.T, n int) *cluster {
	t.Helper()
	c := &cluster{t: t}
	for i := 1; i <= n; i++ {
		c.servers = append(c.servers, newServer(t, fmt.Sprintf("c%d", i), serverOpts{}))
	}
	c.startJoined()
	return c
}

// startJoined starts c's servers, each with --bootstrap-expect as many
// and --join every other one's gossip address.
func (c *cluster) startJoined() {
	for _, s := range c.servers {
		var join []string
		for _, o := range c.servers {
			if o != s {
				join = append(join, o.gossip)
			}
		}
		s.args = append(s.args, "--bootstrap-expect", strconv.Itoa(len(c.servers)), "--join", strings.Join(join, ","))
	}
	for _, s := range c.servers {
		s.start()
	}
}

func (c *cluster) server(id string) *controlServer {
	for _, s := range c.servers {
		if s.id == id {
			return s
		}
	}
	c.t.Fatalf("no server %s", id)
	return nil
}

func (c *cluster) live() []*controlServer {
	var out []*controlServer
	for _, s := range c.servers {
		if s.running() {
			out = append(out, s)
		}
	}
	return out
}

// waitLeader waits until every server in among reports the same non-empty
// leader, which is one of them, and returns it.
func (c *cluster) waitLeader(among []*controlServer, timeout time.Duration) *controlServer {
	c.t.Helper()
	var leader string
	var last []string
	ok := eventually(timeout, func() bool {
		leader, last = "", last[:0]
		for _, s := range among {
			st, err := s.status()
			if err != nil {
				last = append(last, fmt.Sprintf("%s: %v", s.id, err))
				return false
			}
			last = append(last, fmt.Sprintf("%s: leader %q", s.id, st.Leader))
			if st.Leader == "" || (leader != "" && st.Leader != leader) {
				return false
			}
			leader = st.Leader
		}
		return slices.ContainsFunc(among, func(s *controlServer) bool { return s.id == leader })
	})
	if !ok {
		c.t.Fatalf("no agreed leader within %v: %s", within(timeout), strings.Join(last, "; "))
	}
	return c.server(leader)
}

// waitPeers waits until every server in among lists exactly the voters
// wantVoters (ids, any order) and no other peer, and returns the peers.
func (c *cluster) waitPeers(among []*controlServer, wantVoters []string, timeout time.Duration) []peerView {
	c.t.Helper()
	want := append([]string(nil), wantVoters...)
	sort.Strings(want)
	var got []peerView
	var why string
	ok := eventually(timeout, func() bool {
		for _, s := range among {
			p, err := s.peers()
			if err != nil {
				why = fmt.Sprintf("%s: %v", s.id, err)
				return false
			}
			got = p
			var ids []string
			for _, x := range p {
				if !x.Voter {
					why = fmt.Sprintf("%s lists %s as a non-voter", s.id, x.ID)
					return false
				}
				ids = append(ids, x.ID)
			}
			if !slices.Equal(ids, want) {
				why = fmt.Sprintf("%s lists %v", s.id, ids)
				return false
			}
		}
		return true
	})
	if !ok {
		c.t.Fatalf("peers are not the voters %v within %v: %s", want, within(timeout), why)
	}
	return got
}

// neverPeer checks, for d, that no server in among lists id as a Raft
// peer: what it takes to show a thing does not happen is the time it would
// take to happen (gossip adds a member it sees within a few rounds), so
// this watches that long, sampling every 100 ms. Failed reads are skipped,
// but some must succeed. d is a length, not a deadline: it is not scaled,
// since a passing run pays all of it (a loaded machine can only make the
// check weaker, never fail it falsely).
func (c *cluster) neverPeer(among []*controlServer, id string, d time.Duration) {
	c.t.Helper()
	read := 0
	var lastErr error
	if err := testkit.Throughout(d, 100*time.Millisecond, func() error {
		for _, s := range among {
			p, err := s.peers()
			if err != nil {
				lastErr = err
				continue
			}
			read++
			if slices.ContainsFunc(p, func(x peerView) bool { return x.ID == id }) {
				return fmt.Errorf("%s lists %s as a Raft peer again: %+v", s.id, id, p)
			}
		}
		return nil
	}); err != nil {
		c.t.Fatal(err)
	}
	if read == 0 {
		c.t.Fatalf("could not read the peers of %v for %v to see that %s stays out: %v", ids(among), d, id, lastErr)
	}
}

func ids(list []*controlServer) []string {
	out := make([]string, len(list))
	for i, s := range list {
		out[i] = s.id
	}
	return out
}

func without(list []*controlServer, drop ...*controlServer) []*controlServer {
	var out []*controlServer
	for _, s := range list {
		if !slices.Contains(drop, s) {
			out = append(out, s)
		}
	}
	return out
}

// admin is a gRPC AdminService client for writers that run many calls; the
// caller closes the connection.
func admin(t *testing.T, addr string) (llmgwv1.AdminServiceClient, func()) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	return llmgwv1.NewAdminServiceClient(conn), func() { conn.Close() }
}

// writeModel commits one change: model w<i mod 20>, whose replica count
// alternates every 20 writes so each write is a real change.
func writeModel(ctx context.Context, a llmgwv1.AdminServiceClient, i int) error {
	ctx, cancel := context.WithTimeout(ctx, within(10*time.Second))
	defer cancel()
	_, err := a.ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: &llmgwv1.Model{
		Name: fmt.Sprintf("w%d", i%20), Engine: "sim", Model: "llmgw/writer",
		Replicas: uint32(1 + (i/20)%2), GpusPerReplica: 1,
	}})
	return err
}
