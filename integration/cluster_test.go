package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
)

// formTimeout covers gossip discovery, the bootstrap, the first election and
// autopilot's view of every server on a loaded 2-core machine.
const formTimeout = 45 * time.Second

// TestClusterForms: servers started with --bootstrap-expect N and --join one
// another form one cluster (design §5.2): exactly one leader, and every server
// agrees on the voters.
func TestClusterForms(t *testing.T) {
	for _, n := range []int{3, 5} {
		t.Run(fmt.Sprintf("%d servers", n), func(t *testing.T) {
			c := startCluster(t, n)
			leader := c.waitLeader(c.servers, formTimeout)
			peers := c.waitPeers(c.servers, ids(c.servers), formTimeout)
			leaders := 0
			for _, p := range peers {
				if p.Leader {
					leaders++
					if p.ID != leader.id {
						t.Errorf("list-peers says %s leads, cluster status says %s", p.ID, leader.id)
					}
				}
			}
			if leaders != 1 {
				t.Errorf("%d peers marked leader: %+v", leaders, peers)
			}
			// Autopilot needs a round or two to call every server healthy.
			if err := eventuallyErr(formTimeout, func() error {
				st, err := leader.status()
				if err == nil && (!st.Healthy || st.Voters != n || st.FailureTolerance != (n-1)/2) {
					return fmt.Errorf("healthy %t, voters %d, failure tolerance %d; want true, %d, %d", st.Healthy, st.Voters, st.FailureTolerance, n, (n-1)/2)
				}
				return err
			}); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestClusterGrowShrink: `llmgwctl join` grows 3 → 5; `llmgwctl leave`
// against the leader shrinks 5 → 4 with leadership handed over first and no
// write failing meanwhile; the server that left is not added back.
func TestClusterGrowShrink(t *testing.T) {
	c := startCluster(t, 3)
	c.waitLeader(c.servers, formTimeout)
	c.waitPeers(c.servers, ids(c.servers), formTimeout)

	// Two servers with gossip but no --join and no expectation: they wait
	// for an operator.
	for _, id := range []string{"c4", "c5"} {
		s := newServer(t, id, serverOpts{})
		c.servers = append(c.servers, s)
		s.start()
		if err := eventuallyErr(20*time.Second, func() error {
			out, err := s.ctl("join", c.servers[0].gossip)
			if err == nil && !strings.Contains(out, "joined through 1 of 1") {
				return fmt.Errorf("join printed %q", out)
			}
			return err
		}); err != nil {
			t.Fatalf("llmgwctl join %s: %v", id, err)
		}
	}
	c.waitPeers(c.servers, ids(c.servers), formTimeout)
	leader := c.waitLeader(c.servers, formTimeout)

	// A writer against a follower that stays, through the leave.
	follower := without(c.servers, leader)[0]
	a, closeConn := admin(t, follower.grpc)
	defer closeConn()
	ctx, cancel := context.WithCancel(context.Background())
	var writes, failures atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			if err := writeModel(ctx, a, i); err != nil {
				if ctx.Err() != nil {
					return
				}
				failures.Add(1)
				firstErr.CompareAndSwap(nil, err)
			} else {
				writes.Add(1)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()

	out, err := leader.ctl("leave")
	if err != nil {
		cancel()
		wg.Wait()
		t.Fatal(err)
	}
	if !strings.HasPrefix(out, "left the cluster; leadership transferred to ") {
		t.Errorf("leave printed %q", out)
	}
	rest := without(c.servers, leader)
	newLeader := c.waitLeader(rest, formTimeout)
	if !strings.Contains(out, newLeader.id) {
		t.Errorf("leave printed %q, the leader is %s", out, newLeader.id)
	}
	c.waitPeers(rest, ids(rest), formTimeout)
	// A few more writes after the change, then stop the writer.
	base := writes.Load()
	more := eventually(10*time.Second, func() bool { return writes.Load() >= base+10 })
	cancel()
	wg.Wait()
	if !more {
		t.Errorf("%d writes committed within %v after the new leader, want 10", writes.Load()-base, within(10*time.Second))
	}
	if n := failures.Load(); n > 0 {
		t.Errorf("%d of %d writes failed during the leave; first: %v", n, n+writes.Load(), firstErr.Load())
	}
	if writes.Load() < 10 {
		t.Errorf("only %d writes committed", writes.Load())
	}

	// The server that left keeps running but is not added back from gossip.
	if err, ok := leader.exited(0); ok {
		t.Logf("%s exited after leaving (%v)", leader.id, err)
	}
	c.neverPeer(rest, leader.id, 3*time.Second)
	c.waitPeers(rest, ids(rest), 5*time.Second)
}

// TestRemoveDeadPeer: a killed server is removed with `raft remove-peer`;
// restarted, it does not come back into the Raft configuration by itself.
func TestRemoveDeadPeer(t *testing.T) {
	c := startCluster(t, 3)
	leader := c.waitLeader(c.servers, formTimeout)
	c.waitPeers(c.servers, ids(c.servers), formTimeout)

	dead := without(c.servers, leader)[0]
	dead.kill()
	rest := without(c.servers, dead)
	out, err := leader.ctl("raft", "remove-peer", dead.id)
	if err != nil {
		t.Fatal(err)
	}
	if want := "removed peer " + dead.id + " from the Raft configuration\n"; out != want {
		t.Errorf("remove-peer printed %q, want %q", out, want)
	}
	c.waitPeers(rest, ids(rest), 10*time.Second)

	dead.start()
	// Once it answers, it gossips; then it has the time it would take to
	// be added back.
	if err := eventuallyErr(20*time.Second, func() error { _, err := dead.status(); return err }); err != nil {
		t.Fatalf("restarted %s does not answer within %v: %v", dead.id, within(20*time.Second), err)
	}
	c.neverPeer(rest, dead.id, 5*time.Second)
	c.waitPeers(rest, ids(rest), 5*time.Second)
}

// TestLeaderKilled: kill -9 the leader; the others elect a new one, which
// takes writes; the killed server, restarted, rejoins as a voter.
func TestLeaderKilled(t *testing.T) {
	c := startCluster(t, 3)
	leader := c.waitLeader(c.servers, formTimeout)
	c.waitPeers(c.servers, ids(c.servers), formTimeout)

	leader.kill()
	rest := without(c.servers, leader)
	newLeader := c.waitLeader(rest, 15*time.Second)
	if newLeader == leader {
		t.Fatalf("%s still leads after being killed", leader.id)
	}
	a, closeConn := admin(t, rest[0].grpc)
	defer closeConn()
	if err := eventuallyErr(10*time.Second, func() error { return writeModel(context.Background(), a, 1) }); err != nil {
		t.Fatalf("no write after the new leader: %v", err)
	}

	leader.start()
	c.waitPeers(c.servers, ids(c.servers), formTimeout)
	c.waitLeader(c.servers, formTimeout)
	if err := eventuallyErr(10*time.Second, func() error {
		st, err := leader.status()
		if err == nil && !st.Healthy {
			return fmt.Errorf("cluster not healthy after %s rejoined: %+v", leader.id, st)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// TestQuorum: five servers with two down keep committing; three with two
// down refuse writes with a clear error.
func TestQuorum(t *testing.T) {
	t.Run("5 with 2 down commit", func(t *testing.T) {
		c := startCluster(t, 5)
		leader := c.waitLeader(c.servers, formTimeout)
		c.waitPeers(c.servers, ids(c.servers), formTimeout)
		down := without(c.servers, leader)[:2]
		for _, s := range down {
			s.kill()
		}
		a, closeConn := admin(t, without(c.servers, append(down, leader)...)[0].grpc)
		defer closeConn()
		for i := range 5 {
			if err := writeModel(context.Background(), a, i); err != nil {
				t.Fatalf("write %d with 2 of 5 down: %v", i, err)
			}
		}
	})
	t.Run("3 with 2 down refuse", func(t *testing.T) {
		c := startCluster(t, 3)
		c.waitLeader(c.servers, formTimeout)
		c.waitPeers(c.servers, ids(c.servers), formTimeout)
		survivor := c.servers[0]
		for _, s := range c.servers[1:] {
			s.kill()
		}
		// The survivor may lead a little longer, until its lease runs out.
		var last error
		ok := eventually(20*time.Second, func() bool {
			out, err := survivor.ctl("model", "apply", "-f", "../deploy/examples/second.yaml")
			last = err
			return err != nil && !strings.Contains(out, "applied")
		})
		if !ok {
			t.Fatalf("a lone server of three still takes writes: %v", last)
		}
		if msg := last.Error(); !strings.Contains(strings.ToLower(msg), "leader") {
			t.Errorf("the refusal does not say there is no leader: %s", msg)
		}
	})
}

// TestClusterBadInput: an operator's mistakes are refused with a clear error
// and leave the cluster as it was.
func TestClusterBadInput(t *testing.T) {
	c := startCluster(t, 3)
	leader := c.waitLeader(c.servers, formTimeout)
	c.waitPeers(c.servers, ids(c.servers), formTimeout)

	tests := []struct {
		name string
		args []string
		want string // in the error, case-insensitive
	}{
		{"join an unreachable address", []string{"join", freeAddr(t)}, "join"},
		{"remove an unknown peer", []string{"raft", "remove-peer", "nope"}, "nope"},
		{"transfer leadership to an unknown server", []string{"raft", "transfer-leadership", "--to", "nope"}, "nope"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := leader.ctl(tt.args...)
			if err == nil {
				t.Fatalf("llmgwctl %s succeeded: %s", strings.Join(tt.args, " "), out)
			}
			if !strings.Contains(strings.ToLower(err.Error()), tt.want) {
				t.Errorf("error %q does not mention %q", err, tt.want)
			}
			t.Logf("%v", err)
			c.waitPeers(c.servers, ids(c.servers), 5*time.Second)
		})
	}
}

// TestLastVoterCannotLeave: `llmgwctl leave` against a one-server cluster is
// refused, and the server goes on leading.
func TestLastVoterCannotLeave(t *testing.T) {
	s := newServer(t, "c1", serverOpts{extra: []string{"--bootstrap"}})
	s.start()
	c := &cluster{t: t, servers: []*controlServer{s}}
	c.waitLeader(c.servers, formTimeout)
	out, err := s.ctl("leave")
	if err == nil || !strings.Contains(err.Error(), "last voter") {
		t.Fatalf("leave of the last voter: %v (%q)", err, out)
	}
	c.waitPeers(c.servers, []string{"c1"}, 5*time.Second)
	if l := c.waitLeader(c.servers, 5*time.Second); l != s {
		t.Errorf("leader %s", l.id)
	}
}

// TestBootstrapExpectMismatch: servers started with different
// --bootstrap-expect values refuse to bootstrap, say why on /readyz naming
// the flag, and no cluster forms.
func TestBootstrapExpectMismatch(t *testing.T) {
	a := newServer(t, "c1", serverOpts{})
	b := newServer(t, "c2", serverOpts{})
	odd := newServer(t, "c3", serverOpts{})
	a.args = append(a.args, "--bootstrap-expect", "3", "--join", b.gossip+","+odd.gossip)
	b.args = append(b.args, "--bootstrap-expect", "3", "--join", a.gossip+","+odd.gossip)
	odd.args = append(odd.args, "--bootstrap-expect", "2", "--join", a.gossip+","+b.gossip)
	all := []*controlServer{a, b, odd}
	for _, s := range all {
		s.start()
	}
	refused := map[string]string{}
	ok := eventually(20*time.Second, func() bool {
		for _, s := range all {
			code, body := get("http://" + s.http + "/readyz")
			if code == http.StatusServiceUnavailable && strings.Contains(body, "refusing to bootstrap") && strings.Contains(body, "--bootstrap-expect") {
				refused[s.id] = strings.TrimSpace(body)
			}
		}
		return len(refused) == len(all)
	})
	if !ok {
		t.Fatalf("not every server refuses to bootstrap on /readyz: %v", refused)
	}
	t.Logf("c3's /readyz: %s", refused["c3"])
	for _, s := range all {
		st, err := s.status()
		if err != nil {
			t.Fatal(err)
		}
		if st.Leader != "" || st.Voters != 0 {
			t.Errorf("%s: leader %q, %d voters despite the mismatch", s.id, st.Leader, st.Voters)
		}
	}
}

// get returns a GET's status code and body; 0 when it failed.
func get(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// eventuallyErr polls fn until it returns nil or within(timeout) passes,
// and returns its last error.
func eventuallyErr(timeout time.Duration, fn func() error) error {
	return testkit.EventuallyErr(within(timeout), fn)
}
