package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// The two failover tests of issue "Failover" that need more than a kill:
// a router whose watch server dies mid-write (design §5.3), and a control
// server partitioned from the majority with an agent and a router on it
// (design §5.4, §5.6).

// TestFailoverRouterResumesElsewhere: a router watching through the leader
// sees it killed -9 while a writer on another server applies and deletes
// models. The revisions the router applies (its llmgw_router_watch_revision,
// sampled every 15 ms) never go backwards; afterwards its desired state is
// the cluster's (its /v1/models lists exactly `llmgwctl model list`'s names,
// at a revision no older than the last write), and its ephemeral view is the
// cluster's: after a new agent and replica that only its new server can
// tell it about, every READY replica answers through it and nothing else
// does. Its chat load loses no request.
func TestFailoverRouterResumesElsewhere(t *testing.T) {
	c := startCluster(t, 3)
	c.waitLeader(c.servers, formTimeout)
	c.waitPeers(c.servers, ids(c.servers), formTimeout)
	var addrs []string
	for _, s := range c.servers {
		addrs = append(addrs, s.grpc)
	}
	startAgentProc(t, "n1", addrs)
	target := c.waitLeader(c.servers, formTimeout)
	writeVia := without(c.servers, target)[0]
	var order []string // the router starts on target: the first address it is given
	for _, s := range append([]*controlServer{target}, without(c.servers, target)...) {
		order = append(order, s.grpc)
	}
	r := startRouterProc(t, "r1", order...)
	applyModel(t, writeVia.grpc, "chat", 2)
	waitServing(t, writeVia.grpc, "chat", 2, r)
	if got := watchAddrs(r); len(got) == 0 || got[len(got)-1] != target.grpc {
		t.Fatalf("router watches through %v, want %s (%s) last", got, target.grpc, target.id)
	}

	samples := sampleRevision(r.ops, 15*time.Millisecond)
	l := startLoad("chat", 2, r)
	w := startWriter(t, writeVia.grpc)
	l.carry(t, time.Second, 20, "before the kill")
	if !eventually(10*time.Second, func() bool { return w.count() >= 5 }) {
		t.Fatalf("the writer committed %d changes before the kill within %v, want 5", w.count(), within(10*time.Second))
	}
	killed := time.Now()
	target.kill()
	// Writes go on through the new leader's term for 2 s or more, then stop.
	if !eventually(30*time.Second, func() bool { return time.Since(killed) > 2*time.Second && w.doneSince(killed) >= 20 }) {
		t.Fatalf("the writer committed %d changes after the kill within %v, want 20", w.doneSince(killed), within(30*time.Second))
	}
	lastRev := w.stop()
	live := without(c.servers, target)
	c.waitLeader(live, formTimeout)

	// (a) the desired state: same models, at least the last write's revision.
	var want, got []string
	if !eventually(30*time.Second, func() bool {
		want, got = clusterModels(writeVia.grpc), routerModels(r.http)
		rev, _ := testkit.Scrape(r.ops, "llmgw_router_watch_revision", nil)
		return want != nil && slices.Equal(want, got) && uint64(rev) >= lastRev
	}) {
		rev, _ := testkit.Scrape(r.ops, "llmgw_router_watch_revision", nil)
		t.Fatalf("router models %v at revision %v within %v; cluster %v, last write at revision %d", got, rev, within(30*time.Second), want, lastRev)
	}
	// Enough samples to have watched the router move, however slowly a
	// loaded machine scrapes.
	if !eventually(30*time.Second, func() bool { return samples.count() >= 50 }) {
		t.Errorf("only %d revision samples within %v", samples.count(), within(30*time.Second))
	}
	revs := samples.stop()
	for i := 1; i < len(revs); i++ {
		if revs[i] < revs[i-1] {
			t.Errorf("router revision went backwards: sample %d is %v after %v", i, revs[i], revs[i-1])
		}
	}
	if len(revs) < 50 || revs[len(revs)-1] <= revs[0] {
		t.Errorf("%d revision samples from %v to %v: the test did not watch the router move", len(revs), revs[0], revs[len(revs)-1])
	}
	if got := watchAddrs(r); got[len(got)-1] == target.grpc {
		t.Errorf("router still watches through the killed server %s: %v", target.id, got)
	}

	// (b) the ephemeral view. Replicas change after the kill, so the router
	// can learn of them only through its new server: a second agent joins
	// and chat grows to 3 replicas, the new one there. (Not a scale down:
	// a draining replica is stopped only at the drain timeout, 30 s.) Then
	// exactly the cluster's READY replicas answer through the router.
	t.Logf("router's desired state matched the cluster's %v after the kill", time.Since(killed).Round(time.Millisecond))
	// The writer's models go first, or they take the new agent's GPUs.
	for i := range 5 {
		if _, err := writeOrDelete(context.Background(), adminOnce(t, writeVia.grpc), 5+i); err != nil {
			t.Fatalf("deleting f%d: %v", i, err)
		}
	}
	var liveAddrs []string
	for _, s := range live {
		liveAddrs = append(liveAddrs, s.grpc)
	}
	startAgentProc(t, "n2", liveAddrs)
	applyModel(t, writeVia.grpc, "chat", 3)
	waitServing(t, writeVia.grpc, "chat", 3, r)
	list, err := clusterReplicas(writeVia.grpc)
	if err != nil {
		t.Fatal(err)
	}
	ready, other := map[string]bool{}, map[string]bool{}
	for _, rv := range list {
		if rv.Replica.Model == "chat" && rv.ready() {
			ready[rv.Replica.ID] = true
		} else {
			other[rv.Replica.ID] = true
		}
	}
	if len(ready) != 3 {
		t.Fatalf("cluster lists %d READY chat replicas after the kill, want 3: %+v", len(ready), list)
	}
	seen := answeringReplicas(t, r.http, "chat", ready, 400)
	for id := range seen {
		if !ready[id] {
			t.Errorf("router sent a request to %s, which the cluster does not list READY (other: %v)", id, other)
		}
	}
	l.checkNoFailures(t, 50)
	t.Logf("router failover: watch reopened %v after the kill; %d revision samples %v..%v, %d writes, last at revision %d; stream opens %v",
		lastWatchOpen(r).Sub(killed).Round(time.Millisecond), len(revs), revs[0], revs[len(revs)-1], w.count(), lastRev, watchAddrs(r))
}

var streamOpenRE = regexp.MustCompile(`time=(\S+) .*msg="watch: stream open" .*?\baddr=(\S+)`)

// watchAddrs lists the servers the router opened its watch stream on, from
// its log, oldest first.
func watchAddrs(r *controlServer) []string {
	var out []string
	for _, m := range streamOpenRE.FindAllStringSubmatch(r.output(), -1) {
		out = append(out, m[2])
	}
	return out
}

// lastWatchOpen is when the router last opened its watch stream, from its
// log (zero if it never did).
func lastWatchOpen(r *controlServer) time.Time {
	m := streamOpenRE.FindAllStringSubmatch(r.output(), -1)
	if len(m) == 0 {
		return time.Time{}
	}
	at, _ := time.Parse(time.RFC3339Nano, m[len(m)-1][1])
	return at
}

// revisionSampler polls a router's llmgw_router_watch_revision.
type revisionSampler struct {
	stopc chan struct{}
	done  chan []float64
	n     atomic.Int64 // samples so far
}

func sampleRevision(addr string, every time.Duration) *revisionSampler {
	s := &revisionSampler{stopc: make(chan struct{}), done: make(chan []float64, 1)}
	go func() {
		var revs []float64
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-s.stopc:
				s.done <- revs
				return
			case <-tick.C:
				if v, ok := testkit.Scrape(addr, "llmgw_router_watch_revision", nil); ok {
					revs = append(revs, v)
					s.n.Add(1)
				}
			}
		}
	}()
	return s
}

// count is how many samples were taken so far.
func (s *revisionSampler) count() int64 { return s.n.Load() }

// stop ends the sampling and returns the samples in order (at least one).
func (s *revisionSampler) stop() []float64 {
	close(s.stopc)
	revs := <-s.done
	if len(revs) == 0 {
		revs = []float64{0}
	}
	return revs
}

// writer applies and deletes models f0..f4 one change after another
// through one server: five applies, then five deletes, and again. A write
// that fails is retried until it is committed (a delete that finds the
// model gone was committed by an earlier try that answered ABORTED).
type writer struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	n      atomic.Int64
	rev    atomic.Uint64

	mu    sync.Mutex
	times []time.Time // commit time of each change
}

func startWriter(t *testing.T, addr string) *writer {
	a, closeConn := admin(t, addr)
	ctx, cancel := context.WithCancel(context.Background())
	w := &writer{cancel: cancel}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer closeConn()
		for i := 0; ctx.Err() == nil; {
			rev, err := writeOrDelete(ctx, a, i)
			if err != nil {
				if ctx.Err() == nil {
					time.Sleep(50 * time.Millisecond)
				}
				continue
			}
			if rev > w.rev.Load() {
				w.rev.Store(rev)
			}
			w.mu.Lock()
			w.times = append(w.times, time.Now())
			w.mu.Unlock()
			w.n.Add(1)
			i++
		}
	}()
	return w
}

func writeOrDelete(ctx context.Context, a llmgwv1.AdminServiceClient, i int) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, within(10*time.Second))
	defer cancel()
	name := fmt.Sprintf("f%d", i%5)
	if (i/5)%2 == 0 {
		resp, err := a.ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: &llmgwv1.Model{
			Name: name, Engine: "sim", Model: "llmgw/writer", Replicas: 1, GpusPerReplica: 1}})
		return resp.GetRevision(), err
	}
	resp, err := a.DeleteModel(ctx, &llmgwv1.DeleteModelRequest{Name: name})
	if status.Code(err) == codes.NotFound {
		return 0, nil
	}
	return resp.GetRevision(), err
}

func (w *writer) count() int64 { return w.n.Load() }

// doneSince counts the changes committed after t.
func (w *writer) doneSince(t time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, at := range w.times {
		if at.After(t) {
			n++
		}
	}
	return n
}

// stop ends the writer and returns the highest revision a write answered.
func (w *writer) stop() uint64 {
	w.cancel()
	w.wg.Wait()
	return w.rev.Load()
}

// adminOnce is an AdminService client closed at the end of the test.
func adminOnce(t *testing.T, addr string) llmgwv1.AdminServiceClient {
	a, closeConn := admin(t, addr)
	t.Cleanup(closeConn)
	return a
}

// clusterModels is the sorted names of `llmgwctl model list -o json`; nil
// if it could not be read.
func clusterModels(addr string) []string {
	out, err := ctlAt(addr, "model", "list", "-o", "json")
	if err != nil {
		return nil
	}
	var list []struct {
		Name string `json:"name"`
	}
	if json.Unmarshal([]byte(out), &list) != nil {
		return nil
	}
	names := []string{}
	for _, m := range list {
		names = append(names, m.Name)
	}
	sort.Strings(names)
	return names
}

// routerModels is the sorted ids of a router's /v1/models.
func routerModels(addr string) []string {
	resp, err := http.Get("http://" + addr + "/v1/models")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var body struct {
		Data []struct{ ID string } `json:"data"`
	}
	if json.NewDecoder(resp.Body).Decode(&body) != nil {
		return nil
	}
	names := []string{}
	for _, m := range body.Data {
		names = append(names, m.ID)
	}
	sort.Strings(names)
	return names
}

// answeringReplicas sends varied chats through a router, four at a time,
// until every replica in want has answered (X-Llmgw-Replica) or max
// requests were sent, and returns every replica that answered. A request
// that fails fails the test.
func answeringReplicas(t *testing.T, addr, model string, want map[string]bool, max int) map[string]int {
	t.Helper()
	seen := map[string]int{}
	var mu sync.Mutex
	all := func() bool {
		for id := range want {
			if seen[id] == 0 {
				return false
			}
		}
		return true
	}
	for sent := 0; sent < max; sent += 4 {
		var wg sync.WaitGroup
		for j := range 4 {
			wg.Add(1)
			go func(k int) {
				defer wg.Done()
				// A different first word each time, so no prefix keeps the
				// requests on one replica.
				body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"q%d tell me"}],"max_tokens":2}`, model, k)
				resp, err := chatClient.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					t.Errorf("chat through %s: %v", addr, err)
					return
				}
				defer resp.Body.Close()
				_, _ = io.Copy(io.Discard, resp.Body)
				if resp.StatusCode != http.StatusOK {
					t.Errorf("chat through %s: %s", addr, resp.Status)
					return
				}
				mu.Lock()
				seen[resp.Header.Get("X-Llmgw-Replica")]++
				mu.Unlock()
			}(sent + j)
		}
		wg.Wait()
		if t.Failed() || all() {
			break
		}
	}
	if !all() {
		t.Errorf("after %d requests only %v answered through %s, want every one of %v", max, seen, addr, want)
	}
	return seen
}

// TestFailoverPartitionAgentServer cuts the control server an agent and a
// router are attached to off from the other two (design §5.4): the cut
// server has no leader, closes its agent sessions after three election
// timeouts, and the agent moves to the majority; its replicas keep serving
// under the same uids (no node is counted down, nothing is rescheduled),
// and a router on each side routes every request through the partition
// and after it heals.
//
// The servers run on 127.X.Y.11-13 (partitionHosts). The cut is made by
// process, not by address: a connection dialled to 127.X.Y.z leaves with
// source 127.0.0.1 (the preferred source of the local 127.0.0.0/8 route),
// so a rule like `-s 127.X.Y.13 -d 127.X.Y.11` would catch memberlist's
// UDP (sent from its bound socket) but not Raft's or memberlist's TCP
// dials. Each server runs as root with a group id of its own (serverGID,
// unique to this run like the addresses), and iptables' owner match on
// OUTPUT (lo) drops what the cut server sends to the others' addresses
// and what they send to its address. The agent, the routers, llmgwctl and
// the engines keep group 0 and reach every server: only server-to-server
// traffic is cut, as in a partition between control nodes' racks.
func TestFailoverPartitionAgentServer(t *testing.T) {
	iptablesOrSkip(t)
	hosts := partitionHosts()
	for _, h := range hosts {
		l, err := net.Listen("tcp", h+":0")
		if err != nil {
			t.Skipf("loopback address %s is not usable: %v", h, err)
		}
		l.Close()
	}
	// Only the rule under test may end the agent's sessions: the liveness
	// windows that also could on a loaded machine (an agent silent for
	// 1.5 s, a server silent for three 500 ms heartbeats: a process
	// unscheduled for a second) are widened, the server's to 10 s and the
	// agent's to 3 × 2 s. The leaderless rule (three 500 ms election
	// timeouts) keeps the defaults.
	liveness := filepath.Join(t.TempDir(), "control.yaml")
	writeFile(t, liveness, "agent_timeout: 10s\n")
	c := startClusterOn(t, hosts, "--config", liveness)
	c.waitLeader(c.servers, formTimeout)
	c.waitPeers(c.servers, ids(c.servers), formTimeout)
	minority := c.servers[2] // 127.X.Y.13
	majority := without(c.servers, minority)
	if ld := c.waitLeader(c.servers, formTimeout); ld == minority {
		if _, err := minority.ctl("raft", "transfer-leadership", "--to", majority[0].id); err != nil {
			t.Fatal(err)
		}
		if c.waitLeader(c.servers, formTimeout) == minority {
			t.Fatalf("%s still leads after the transfer", minority.id)
		}
	}
	order := func(first *controlServer) []string {
		out := []string{first.grpc}
		for _, s := range without(c.servers, first) {
			out = append(out, s.grpc)
		}
		return out
	}
	agent := startAgentProc(t, "n1", order(minority), "--heartbeat-interval", "2s")
	routers := []*controlServer{
		startRouterProc(t, "rmin", order(minority)...),
		startRouterProc(t, "rmaj", order(majority[0])...),
	}
	applyModel(t, majority[0].grpc, "chat", 2)
	before := waitServing(t, majority[0].grpc, "chat", 2, routers...)
	if got := attachedTo(agent); got != minority.grpc {
		t.Fatalf("agent is attached to %q, want %s (%s), the first address it was given", got, minority.grpc, minority.id)
	}

	// A second session on the cut server, the test's own, records the
	// status the server ends its sessions with (see sessionWitness).
	witness := startWitness(t, minority.grpc, "witness")

	l := startLoad("chat", 2, routers...)
	l.carry(t, time.Second, 20, "before the cut")
	sessions, _ := testkit.Scrape(agent.http, "llmgw_agent_sessions_total", nil)
	p := cut(t, c, minority)
	var moved time.Duration
	if !eventually(30*time.Second, func() bool {
		n, ok := testkit.Scrape(agent.http, "llmgw_agent_sessions_total", nil)
		s := serverByGRPC(c, attachedTo(agent))
		if ok && n > sessions && s != nil && s != minority {
			moved = time.Since(p.at)
			return true
		}
		return false
	}) {
		t.Fatalf("agent did not move to the majority within %v of the cut; its log:\n%s", within(30*time.Second), tail(agent.output(), 20))
	}
	// It left because the cut server, leaderless, closed the session. The
	// server's word for it is the witness's status; the agent's log gives
	// the same status, or — when a send of the agent met the closed stream
	// before its receive read the status (reported: the agent does not then
	// read the status) — "send <addr>: EOF", which with the widened
	// windows above only the server's close can cause. Its own dead-server
	// timer ("missed three heartbeats") or anything else is a failure.
	wend, werr := witness.wait(t, 10*time.Second)
	if werr == nil || !strings.Contains(werr.Error(), "has had no leader") {
		t.Errorf("the cut server ended the witness's session with %v, want it to have had no leader", werr)
	}
	t.Logf("the cut server ended its sessions %v after the cut: %v", wend.Sub(p.at).Round(time.Millisecond), werr)
	switch end := sessionEnd(agent, minority.grpc); {
	case strings.Contains(end, "has had no leader"):
	case strings.Contains(end, "send "+minority.grpc+": EOF"):
		t.Logf("the agent's log lost the server's status to a send (agent defect, reported): %s", end)
	default:
		t.Errorf("the agent's session on %s did not end for want of a leader: %q; its log:\n%s", minority.id, end, tail(agent.output(), 20))
	}
	// The partition lasts a while longer, with the agent on the majority.
	l.carry(t, 4*time.Second, 100, "the partition")
	during := waitServing(t, majority[0].grpc, "chat", 2)
	if st, err := minority.status(); err != nil {
		t.Logf("cluster status on the cut server %s: %v", minority.id, err)
	} else if st.Leader != "" {
		t.Errorf("the cut server %s still sees leader %q", minority.id, st.Leader)
	}
	nodeUp(t, majority[0].grpc, "n1")

	p.heal()
	c.waitLeader(c.servers, formTimeout)
	c.waitPeers(c.servers, ids(c.servers), formTimeout)
	after := waitServing(t, minority.grpc, "chat", 2, routers...)
	l.carry(t, 2*time.Second, 40, "after the heal")
	l.checkNoFailures(t, 100)
	for name, list := range map[string][]replicaView{"during the partition": during, "after the heal": after} {
		if d := uidDiff(before, list); d != "" {
			t.Errorf("replicas rescheduled %s: %s", name, d)
		}
	}
	t.Logf("partition of %s: the agent moved to %s %v after the cut", minority.id, attachedTo(agent), moved.Round(time.Millisecond))
}

var sessionEndRE = regexp.MustCompile(`msg="control session ended" .*?\baddr=(\S+) err="((?:[^"\\]|\\.)*)"`)

// sessionEnd is the error of the agent's first session on addr that
// ended, from its log ("" if none did).
func sessionEnd(a *controlServer, addr string) string {
	for _, m := range sessionEndRE.FindAllStringSubmatch(a.output(), -1) {
		if m[1] == addr {
			return m[2]
		}
	}
	return ""
}

// sessionWitness is one session of the agent protocol the test holds on a
// server, as a node with no GPUs (nothing is placed on it), heartbeating
// every 100 ms: it keeps the status the server ended the session with. A
// send that meets the closed stream answers io.EOF, and the status is
// then read from the receive side; `llmgw agent` logs the EOF instead
// (reported), so its log is not always the server's word.
type sessionWitness struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed chan struct{} // closed when the server ended the session
	at     time.Time     // then
	err    error         // with this status
}

// startWitness attaches to addr as node and waits for the welcome; the
// session lasts until the server ends it or the test does.
func startWitness(t *testing.T, addr, node string) *sessionWitness {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &sessionWitness{cancel: cancel, closed: make(chan struct{})}
	t.Cleanup(func() {
		w.cancel()
		w.wg.Wait()
		conn.Close()
	})
	stream, err := llmgwv1.NewAgentServiceClient(conn).Attach(ctx)
	if err != nil {
		t.Fatalf("witness attach to %s: %v", addr, err)
	}
	if err := stream.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Hello{Hello: &llmgwv1.AgentHello{
		Node: &llmgwv1.Node{Id: node, Address: "127.0.0.1"}, Epoch: uint64(time.Now().UnixNano())}}}); err != nil {
		t.Fatalf("witness hello to %s: %v", addr, err)
	}
	welcomed := make(chan struct{})
	w.wg.Go(func() {
		for first := true; ; {
			m, err := stream.Recv()
			if err != nil {
				w.at, w.err = time.Now(), err
				close(w.closed)
				return
			}
			if first && m.GetWelcome() != nil {
				first = false
				close(welcomed)
			}
		}
	})
	w.wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-w.closed:
				return
			case <-tick.C:
			}
			if stream.Send(&llmgwv1.AgentMessage{Body: &llmgwv1.AgentMessage_Heartbeat{
				Heartbeat: &llmgwv1.Heartbeat{UnixNano: time.Now().UnixNano()}}}) != nil {
				return // the receive side reads why
			}
		}
	})
	select {
	case <-welcomed:
	case <-w.closed:
		t.Fatalf("%s refused the witness's session: %v", addr, w.err)
	case <-time.After(within(20 * time.Second)):
		t.Fatalf("%s did not welcome the witness within %v", addr, within(20*time.Second))
	}
	return w
}

// wait is when and with what status the server ended the session; it
// fails the test if the server did not within(timeout).
func (w *sessionWitness) wait(t *testing.T, timeout time.Duration) (time.Time, error) {
	t.Helper()
	select {
	case <-w.closed:
		return w.at, w.err
	case <-time.After(within(timeout)):
		t.Fatalf("the server did not end the witness's session within %v", within(timeout))
		return time.Time{}, nil
	}
}

// uidDiff says how two READY lists differ in replica ids and uids; "" if
// they do not.
func uidDiff(a, b []replicaView) string {
	key := func(l []replicaView) []string {
		var out []string
		for _, r := range l {
			out = append(out, r.Replica.ID+"/"+string(r.Replica.UID))
		}
		sort.Strings(out)
		return out
	}
	if ka, kb := key(a), key(b); !slices.Equal(ka, kb) {
		return fmt.Sprintf("%v before, %v now", ka, kb)
	}
	return ""
}

// nodeUp fails the test unless the cluster lists node ACTIVE.
func nodeUp(t *testing.T, addr, node string) {
	t.Helper()
	out, err := ctlAt(addr, "node", "list", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var v []struct {
		ID    string `json:"id"`
		State string `json:"state"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("decode node list: %v: %s", err, out)
	}
	for _, n := range v {
		if n.ID == node {
			if n.State != "active" {
				t.Errorf("node %s is %s during the partition, want ACTIVE", node, n.State)
			}
			return
		}
	}
	t.Errorf("node %s is not listed: %s", node, out)
}

// The iptables rules of a partition are the machine's, not this
// process's: a second run of this test at the same time (another checkout's
// `make test` on a shared CI machine) whose rules named the same groups and
// addresses would cut this run's servers too, at a moment of its choosing
// (seen: a server cut before the test's own cut, so the agent's hello timed
// out and it attached elsewhere). So the groups and addresses are this
// process's own, derived from its pid, which no other live process has.

// partitionGIDBase is this run's first group id: 1,000,000 + 4·pid (pids
// are below 2^22), with serverGID(i) = base+1+i and base itself for the
// probe rule.
func partitionGIDBase() uint32 { return 1_000_000 + 4*uint32(os.Getpid()) }

// serverGID is the group a server of startClusterOn runs as, so iptables
// can tell its packets from everyone else's.
func serverGID(i int) uint32 { return partitionGIDBase() + uint32(i) + 1 }

// partitionHosts are this run's three loopback addresses for the cut
// servers, 127.X.Y.11-13 with X.Y the low 16 bits of the pid (all of
// 127/8 is loopback on Linux).
func partitionHosts() []string {
	pid := os.Getpid()
	var out []string
	for i := 11; i <= 13; i++ {
		out = append(out, fmt.Sprintf("127.%d.%d.%d", byte(pid>>8), byte(pid), i))
	}
	return out
}

// startClusterOn is startCluster with server i on hosts[i] (all its ports
// there) and running as group serverGID(i); extra flags go to every server.
func startClusterOn(t *testing.T, hosts []string, extra ...string) *cluster {
	t.Helper()
	return startClusterOnAs(t, hosts, nil, extra...)
}

// startClusterOnAs is startClusterOn with each server's own flags from
// own (nil: none), such as the certificate that names it.
func startClusterOnAs(t *testing.T, hosts []string, own func(s *controlServer) []string, extra ...string) *cluster {
	t.Helper()
	c := &cluster{t: t}
	for i, h := range hosts {
		s := newServerOn(t, fmt.Sprintf("c%d", i+1), h)
		if own != nil {
			s.args = append(s.args, own(s)...)
		}
		c.servers = append(c.servers, s)
	}
	for _, s := range c.servers {
		var join []string
		for _, o := range c.servers {
			if o != s {
				join = append(join, o.gossip)
			}
		}
		s.args = append(s.args, "--bootstrap-expect", strconv.Itoa(len(hosts)), "--join", strings.Join(join, ","))
		s.args = append(s.args, extra...)
	}
	for i, s := range c.servers {
		startAs(s, serverGID(i))
	}
	return c
}

// newServerOn is newServer with every address on host.
func newServerOn(t *testing.T, id, host string) *controlServer {
	t.Helper()
	dir := t.TempDir()
	s := &controlServer{t: t, id: id, grpc: freeAddrOn(t, host), raft: freeAddrOn(t, host), gossip: freeAddrOn(t, host), http: freeAddrOn(t, host),
		dataDir: filepath.Join(dir, "data"), logPath: filepath.Join(dir, id+".log")}
	s.args = []string{"control", "--node-id", id, "--data-dir", s.dataDir,
		"--grpc-addr", s.grpc, "--raft-addr", s.raft, "--gossip-addr", s.gossip, "--http-addr", s.http}
	t.Cleanup(func() {
		s.stop()
		if t.Failed() {
			b, _ := os.ReadFile(s.logPath)
			t.Logf("%s output:\n%s", s.id, tail(string(b), 40))
		}
	})
	return s
}

// startAs is controlServer.start with the process in group gid (still
// root, so files are no matter).
func startAs(s *controlServer, gid uint32) {
	s.t.Helper()
	f, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		s.t.Fatal(err)
	}
	defer f.Close()
	fmt.Fprintf(f, "--- start (gid %d) %s\n", gid, strings.Join(s.args, " "))
	s.cmd = exec.Command(bins.llmgw, s.args...)
	s.cmd.Stdout, s.cmd.Stderr = f, f
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 0, Gid: gid, Groups: []uint32{}}}
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.done = make(chan error, 1)
	go func(cmd *exec.Cmd, done chan<- error) { done <- cmd.Wait() }(s.cmd, s.done)
}

// iptablesOrSkip skips the test unless this process may add an owner-match
// rule on lo (root, iptables installed, a working owner match).
func iptablesOrSkip(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("partitioning loopback needs root (iptables)")
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Skip("partitioning loopback needs the iptables command (Debian package iptables)")
	}
	probe := []string{"OUTPUT", "-o", "lo", "-d", strings.TrimSuffix(partitionHosts()[0], ".11") + ".19",
		"-m", "owner", "--gid-owner", strconv.Itoa(int(partitionGIDBase())), "-j", "DROP"}
	if err := iptables("-I", probe...); err != nil {
		t.Skipf("iptables cannot add an owner-match rule here: %v", err)
	}
	if err := iptables("-D", probe...); err != nil {
		t.Fatalf("removing the probe rule: %v", err)
	}
}

func iptables(op string, rule ...string) error {
	// -w: wait for the xtables lock another process may hold.
	wait := strconv.Itoa(int(within(5*time.Second) / time.Second))
	out, err := exec.Command("iptables", append([]string{"-w", wait, op}, rule...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("iptables %s %s: %w: %s", op, strings.Join(rule, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// partition is a set of iptables rules in force; heal removes them (also
// run by t.Cleanup, so no rule outlives the test).
type partition struct {
	t     *testing.T
	at    time.Time
	rules [][]string
}

// cut drops every packet between server s and the rest of c, in both
// directions, by process group (see TestFailoverPartitionAgentServer).
func cut(t *testing.T, c *cluster, s *controlServer) *partition {
	t.Helper()
	host := func(x *controlServer) string { h, _, _ := net.SplitHostPort(x.grpc); return h }
	gid := func(x *controlServer) string { return strconv.Itoa(int(serverGID(slices.Index(c.servers, x)))) }
	p := &partition{t: t}
	t.Cleanup(p.heal)
	for _, o := range without(c.servers, s) {
		for _, r := range [][]string{
			{"OUTPUT", "-o", "lo", "-d", host(o), "-m", "owner", "--gid-owner", gid(s), "-j", "DROP"},
			{"OUTPUT", "-o", "lo", "-d", host(s), "-m", "owner", "--gid-owner", gid(o), "-j", "DROP"},
		} {
			if err := iptables("-I", r...); err != nil {
				t.Fatal(err)
			}
			p.rules = append(p.rules, r)
		}
	}
	p.at = time.Now()
	return p
}

func (p *partition) heal() {
	var errs []error
	for _, r := range p.rules {
		errs = append(errs, iptables("-D", r...))
	}
	p.rules = nil
	if err := errors.Join(errs...); err != nil {
		p.t.Errorf("healing the partition: %v", err)
	}
}
