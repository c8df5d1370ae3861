package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// haCluster is a set of control servers on loopback, each with its own
// data dir, Raft and gossip port, formed by --bootstrap-expect.
type haCluster struct {
	t     *testing.T
	cfgs  map[string]Config
	nodes map[string]*running
}

// haConfig is a server with gossip and timings short enough for tests:
// failure detection in about a second, promotion after 300 ms healthy.
func haConfig(t *testing.T, id string, expect int) Config {
	c := testConfig(t, t.TempDir(), freeAddr(t))
	c.NodeID, c.Bootstrap, c.BootstrapExpect = id, false, expect
	c.GossipAddr = freeAddr(t)
	c.Gossip = GossipConfig{ProbeInterval: 100 * time.Millisecond, ProbeTimeout: 50 * time.Millisecond, GossipInterval: 50 * time.Millisecond, SuspicionMult: 2, PushPullInterval: time.Second}
	c.ServerStabilizationTime = 300 * time.Millisecond
	c.AutopilotInterval = 100 * time.Millisecond
	c.JoinRetryInterval = 100 * time.Millisecond
	c.RPCHoldTimeout = 5 * time.Second
	return c
}

// newHACluster starts servers ids with --bootstrap-expect expect, each
// joining all the others, and waits until every one is ready.
func newHACluster(t *testing.T, expect int, ids ...string) *haCluster {
	t.Helper()
	return newHAClusterWith(t, expect, nil, nil, ids...)
}

// newHAClusterWith is newHACluster with each server's config adjusted by
// tune and the server by hook before it runs (either may be nil).
func newHAClusterWith(t *testing.T, expect int, tune func(*Config), hook func(*Server), ids ...string) *haCluster {
	t.Helper()
	c := &haCluster{t: t, cfgs: map[string]Config{}, nodes: map[string]*running{}}
	for _, id := range ids {
		cfg := haConfig(t, id, expect)
		if tune != nil {
			tune(&cfg)
		}
		c.cfgs[id] = cfg
	}
	for _, id := range ids {
		cfg := c.cfgs[id]
		for _, o := range ids {
			if o != id {
				cfg.Join = append(cfg.Join, c.cfgs[o].GossipAddr)
			}
		}
		c.cfgs[id] = cfg
		c.nodes[id] = launch(t, cfg, hook)
	}
	// Wait for all of them at once: a server that failed to start (its
	// picked port taken meanwhile by another test's connection, which a
	// busy machine makes likely) is started again on fresh addresses — it
	// joins the others itself — instead of leaving the rest to wait for a
	// third server that never comes.
	pending := slices.Clone(ids)
	relaunched := 0
	testkit.WaitErr(t, 60*time.Second, "the servers ready", func() error {
		left := pending[:0]
		for _, id := range pending {
			r := c.nodes[id]
			select {
			case <-r.srv.Ready():
				r.awaitReady(t) // ready already: dials its client
				continue
			case err := <-r.done:
				if relaunched < 5 && addrInUse(err) {
					relaunched++
					cfg := haConfig(t, id, expect)
					if tune != nil {
						tune(&cfg)
					}
					cfg.Join = c.cfgs[id].Join
					c.cfgs[id] = cfg
					t.Logf("%s did not start (%v); again on fresh addresses", id, err)
					c.nodes[id] = launch(t, cfg, hook)
				} else {
					t.Fatalf("%s: Run returned before ready: %v\n%s", id, err, r.logs)
				}
			default:
			}
			left = append(left, id)
		}
		pending = left
		if len(pending) > 0 {
			return fmt.Errorf("servers %v not ready", pending)
		}
		return nil
	})
	t.Cleanup(func() {
		for _, r := range c.nodes {
			r.stopQuietly()
		}
	})
	return c
}

// stopQuietly stops a server that may have stopped already.
func (r *running) stopQuietly() {
	if r.conn != nil {
		r.conn.Close()
	}
	r.cancel()
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
	}
}

func (c *haCluster) admin(id string) llmgwv1.AdminServiceClient {
	return llmgwv1.NewAdminServiceClient(c.nodes[id].conn)
}

// stop stops a server and forgets it.
func (c *haCluster) stop(id string) {
	c.t.Helper()
	c.nodes[id].stop(c.t)
	delete(c.nodes, id)
}

// restart starts a stopped server again with its data dir and addresses.
func (c *haCluster) restart(id string) {
	c.t.Helper()
	r := launch(c.t, c.cfgs[id], nil)
	c.nodes[id] = r
	r.awaitReady(c.t)
}

// agreedLeader waits until every running server reports the same leader,
// one of them, and the same voters, and returns the leader.
func (c *haCluster) agreedLeader(ctx context.Context, voters int) string {
	c.t.Helper()
	var leader string
	testkit.WaitCtx(ctx, c.t, "one leader, agreed by all", func() error {
		leader = ""
		for id := range c.nodes {
			cs, err := c.admin(id).ClusterStatus(ctx, &llmgwv1.ClusterStatusRequest{})
			if err != nil {
				return err
			}
			if cs.Leader == "" || (leader != "" && cs.Leader != leader) {
				return fmt.Errorf("%s sees leader %q, another %q", id, cs.Leader, leader)
			}
			if int(cs.Voters) != voters {
				return fmt.Errorf("%s sees %d voters, want %d", id, cs.Voters, voters)
			}
			leader = cs.Leader
		}
		if _, ok := c.nodes[leader]; !ok {
			return fmt.Errorf("leader %s is not running", leader)
		}
		return nil
	})
	return leader
}

// peerIDs lists the Raft peers (asked through via; forwarded to the leader),
// voters marked with a '*'.
func (c *haCluster) peerIDs(ctx context.Context, via string) ([]string, error) {
	resp, err := c.admin(via).ListPeers(ctx, &llmgwv1.ListPeersRequest{})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range resp.Peers {
		id := p.Id
		if p.Voter {
			id += "*"
		}
		out = append(out, id)
	}
	return out, nil
}

func (c *haCluster) wantPeers(ctx context.Context, via string, want ...string) {
	c.t.Helper()
	testkit.WaitCtx(ctx, c.t, "raft peers "+strings.Join(want, ","), func() error {
		got, err := c.peerIDs(ctx, via)
		if err != nil {
			return err
		}
		if !slices.Equal(got, want) {
			return fmt.Errorf("peers %v", got)
		}
		return nil
	})
}

func (c *haCluster) follower(leader string) string {
	for id := range c.nodes {
		if id != leader {
			return id
		}
	}
	c.t.Fatal("no follower")
	return ""
}

// TestHAFormJoinLeave: three servers form with --bootstrap-expect; writes
// and consistent reads are forwarded from a follower; a fourth server joins
// and is promoted; the leader leaves (transferring leadership first) while
// a writer through a follower sees no failed write.
func TestHAFormJoinLeave(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := newHACluster(t, 3, "c1", "c2", "c3")
	leader := c.agreedLeader(ctx, 3)
	c.wantPeers(ctx, leader, "c1*", "c2*", "c3*")
	f := c.follower(leader)

	model := &llmgwv1.Model{Name: "demo", Engine: "sim", Model: "m", Replicas: 1}
	applied, err := c.admin(f).ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: model})
	if err != nil {
		t.Fatalf("write through a follower: %v", err)
	}
	list, err := c.admin(f).ListModels(ctx, &llmgwv1.ListRequest{Consistent: true})
	if err != nil || list.Revision < applied.Revision || len(list.Models) != 1 {
		t.Fatalf("consistent read through a follower: %v, %v (applied at %d)", list, err, applied.Revision)
	}
	cs, err := c.admin(f).ClusterStatus(ctx, &llmgwv1.ClusterStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, srv := range cs.Servers {
		if srv.GrpcAddr == "" || srv.GossipAddr == "" {
			t.Fatalf("servers list lacks client addresses: %v", srv)
		}
	}

	// An agent attached to a follower is registered through the leader,
	// and its welcome lists every server for failover (design §5.6).
	actx, acancel := context.WithCancel(ctx)
	agent, err := llmgwv1.NewAgentServiceClient(c.nodes[f].conn).Attach(actx)
	if err != nil {
		t.Fatal(err)
	}
	if err := agent.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Hello{Hello: &llmgwv1.AgentHello{
		Node: &llmgwv1.Node{Id: "n1", Address: "127.0.0.1", Gpus: 1}, Epoch: 7,
	}}}); err != nil {
		t.Fatal(err)
	}
	welcome := recvAgent(t, agent).GetWelcome()
	if welcome == nil || len(welcome.Servers) != 3 {
		t.Fatalf("welcome through a follower: %v", welcome)
	}
	for _, srv := range welcome.Servers {
		if srv.GrpcAddr == "" {
			t.Fatalf("welcome's server without a gRPC address: %v", srv)
		}
	}
	nodes, err := c.admin(leader).ListNodes(ctx, &llmgwv1.ListRequest{Consistent: true})
	if err != nil || len(nodes.Nodes) != 1 || nodes.Nodes[0].Id != "n1" {
		t.Fatalf("node registered through a follower: %v %v", nodes, err)
	}
	acancel()

	members, err := c.admin(f).Members(ctx, &llmgwv1.MembersRequest{})
	if err != nil || len(members.Members) != 3 {
		t.Fatalf("members: %v %v", members, err)
	}
	for _, m := range members.Members {
		if m.Status != "alive" || m.BootstrapExpect != 3 {
			t.Fatalf("member %v", m)
		}
	}

	// A fourth server, started without an expectation, joins through the
	// Join RPC of an existing server; it is added and promoted.
	cfg4 := haConfig(t, "c4", 0)
	c.cfgs["c4"] = cfg4
	c.nodes["c4"] = launch(t, cfg4, nil)
	testkit.WaitCtx(ctx, t, "join c4", func() error {
		_, err := c.admin(f).Join(ctx, &llmgwv1.JoinRequest{GossipAddrs: []string{cfg4.GossipAddr}})
		return err
	})
	c.nodes["c4"].awaitReady(t)
	c.wantPeers(ctx, f, "c1*", "c2*", "c3*", "c4*")

	// The leader leaves while a writer goes through a follower.
	writer := c.follower(leader)
	wc := c.admin(writer)
	var wg sync.WaitGroup
	stopWriting := make(chan struct{})
	var writes, failed []string
	var mu sync.Mutex
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stopWriting:
				return
			default:
			}
			m := &llmgwv1.Model{Name: fmt.Sprintf("w%d", i), Engine: "sim", Model: "m", Replicas: 1}
			_, err := wc.ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: m})
			mu.Lock()
			writes = append(writes, m.Name)
			if err != nil {
				failed = append(failed, fmt.Sprintf("%s: %v", m.Name, err))
			}
			mu.Unlock()
		}
	})
	time.Sleep(100 * time.Millisecond) // let some writes go first; not a timing assertion
	left, err := c.admin(leader).Leave(ctx, &llmgwv1.LeaveRequest{})
	if err != nil {
		t.Fatalf("leave the leader: %v", err)
	}
	if left.NewLeader == "" || left.NewLeader == leader {
		t.Fatalf("leave: new leader %q", left.NewLeader)
	}
	select {
	case err := <-c.nodes[leader].done:
		if err != nil {
			t.Fatalf("Run after leave: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the server that left did not stop")
	}
	c.nodes[leader].conn.Close()
	delete(c.nodes, leader)
	time.Sleep(200 * time.Millisecond) // writes after the leave; not a timing assertion
	close(stopWriting)
	wg.Wait()
	if len(failed) > 0 || len(writes) == 0 {
		t.Fatalf("%d of %d writes failed during the leader's leave: %v", len(failed), len(writes), failed)
	}
	var rest []string
	for id := range c.nodes {
		rest = append(rest, id+"*")
	}
	slices.Sort(rest)
	newLeader := c.agreedLeader(ctx, 3)
	c.wantPeers(ctx, newLeader, rest...)
	t.Logf("%d writes through %s, none failed, while %s left; new leader %s", len(writes), writer, leader, newLeader)
}

// TestHAKillRestartRemove: the leader stops and another takes over; it
// restarts and rejoins; a dead follower removed by an operator is not added
// back when it comes back alive, until an explicit join.
func TestHAKillRestartRemove(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := newHACluster(t, 3, "c1", "c2", "c3")
	leader := c.agreedLeader(ctx, 3)

	c.stop(leader)
	newLeader := c.agreedLeader(ctx, 3)
	if newLeader == leader {
		t.Fatalf("leader %s stopped but still leads", leader)
	}
	if _, err := c.admin(c.follower(newLeader)).ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: &llmgwv1.Model{Name: "after", Engine: "sim", Model: "m", Replicas: 1}}); err != nil {
		t.Fatalf("write after the leader stopped: %v", err)
	}
	c.restart(leader)
	if got := c.agreedLeader(ctx, 3); got != newLeader {
		t.Logf("leadership moved again to %s after the restart", got)
	}

	// Remove a dead follower; it stays out when it comes back.
	cur := c.agreedLeader(ctx, 3)
	victim := c.follower(cur)
	c.stop(victim)
	if _, err := c.admin(cur).RemovePeer(ctx, &llmgwv1.RemovePeerRequest{Id: "nope"}); status.Code(err) != codes.NotFound {
		t.Fatalf("remove an unknown peer: %v", err)
	}
	if _, err := c.admin(cur).RemovePeer(ctx, &llmgwv1.RemovePeerRequest{Id: cur}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("remove the leader: %v", err)
	}
	via := c.follower(cur)
	if _, err := c.admin(via).RemovePeer(ctx, &llmgwv1.RemovePeerRequest{Id: victim}); err != nil {
		t.Fatalf("remove a dead peer through a follower: %v", err)
	}
	var remaining []string
	for id := range c.nodes {
		remaining = append(remaining, id+"*")
	}
	slices.Sort(remaining)
	c.wantPeers(ctx, cur, remaining...)

	r := launch(t, c.cfgs[victim], nil)
	c.nodes[victim] = r
	c.staysOut(ctx, cur, victim, remaining, "removed server came back by itself")
	// An explicit join brings it back (as a non-voter, then promoted).
	if _, err := c.admin(cur).Join(ctx, &llmgwv1.JoinRequest{GossipAddrs: []string{c.cfgs[victim].GossipAddr}}); err != nil {
		t.Fatalf("explicit join: %v", err)
	}
	r.awaitReady(t)
	all := append(remaining, victim+"*")
	slices.Sort(all)
	c.wantPeers(ctx, cur, all...)
}

// TestBootstrapExpectMismatch: servers started with different expectations
// never bootstrap, say why in the log and /readyz, and show it in Members.
func TestBootstrapExpectMismatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The two join each other by the addresses picked here, so a server
	// whose port another test's socket took meanwhile cannot be started
	// again alone: the pair is started again on fresh addresses.
	var ra, rb *running
	for attempt := 1; ; attempt++ {
		a, b := haConfig(t, "m1", 2), haConfig(t, "m2", 3)
		a.Join, b.Join = []string{b.GossipAddr}, []string{a.GossipAddr}
		ra, rb = launch(t, a, nil), launch(t, b, nil)
		err := awaitPairServing(ctx, ra, rb)
		if err == nil {
			break
		}
		if attempt == 5 || !addrInUse(err) {
			t.Fatalf("the pair did not start: %v\n%s\n%s", err, ra.logs, rb.logs)
		}
		t.Logf("the pair did not start (%v); again on fresh addresses", err)
	}
	defer ra.stopQuietly()
	defer rb.stopQuietly()
	testkit.WaitCtx(ctx, t, "mismatch reported", func() error {
		for _, r := range []*running{ra, rb} {
			if p := r.srv.members.BootstrapProblem(); !strings.Contains(p, "--bootstrap-expect") {
				return fmt.Errorf("%s: problem %q", r.srv.cfg.NodeID, p)
			}
		}
		return nil
	})
	for _, r := range []*running{ra, rb} {
		if r.srv.store.HasLeader() || len(r.srv.store.Servers()) != 0 {
			t.Fatalf("%s bootstrapped despite the mismatch", r.srv.cfg.NodeID)
		}
		resp, err := http.Get("http://" + r.srv.HTTPAddr() + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "bootstrap refused") {
			t.Fatalf("readyz: %d %s", resp.StatusCode, body)
		}
		if !strings.Contains(r.logs.String(), "bootstrap refused") {
			t.Fatalf("%s logged no refusal", r.srv.cfg.NodeID)
		}
	}
}

// awaitPairServing waits until both servers serve. If either's Run returns
// first, it stops the other and returns that error; both are then stopped.
func awaitPairServing(ctx context.Context, rs ...*running) error {
	for {
		serving := 0
		for _, r := range rs {
			select {
			case err := <-r.done:
				r.done <- err // stopQuietly reads it again
				for _, o := range rs {
					o.stopQuietly()
				}
				return fmt.Errorf("%s: %w", r.srv.cfg.NodeID, err)
			default:
			}
			if r.srv.serving.Load() {
				serving++
			}
		}
		if serving == len(rs) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("servers not serving: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// addrInUse reports whether err is a listen on an address another socket
// took: raft's transport does not wrap the error, so its text counts too.
func addrInUse(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE) || (err != nil && strings.Contains(err.Error(), "address already in use"))
}

// staysOut waits until victim is alive in leader's gossip, then checks over
// several reconcile rounds that leader's Raft peers stay want: a removed
// server showing up alive is not added back by itself.
func (c *haCluster) staysOut(ctx context.Context, leader, victim string, want []string, cameBack string) {
	t := c.t
	t.Helper()
	testkit.WaitCtx(ctx, t, "the removed server alive in the leader's gossip", func() error {
		ms, err := c.admin(leader).Members(ctx, &llmgwv1.MembersRequest{})
		if err != nil {
			return err
		}
		for _, m := range ms.Members {
			if m.Id == victim && m.Status == "alive" {
				return nil
			}
		}
		return fmt.Errorf("members %v", ms.Members)
	})
	for range 10 {
		got, err := c.peerIDs(ctx, leader)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%s: peers %v", cameBack, got)
		}
		time.Sleep(100 * time.Millisecond) // spacing the checks; not a timing assertion
	}
}
