package integration

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/testkit"
)

// Bounded listeners (issue 26, design §11 "Limits"), with real processes.
// Before, no listener of a control server had a handshake deadline or a
// connection cap: 1,500 silent sockets each on a server's Raft and gRPC
// ports were all still open after 70 s (and at a 1,024-fd limit llmgwctl
// and /healthz failed with "too many open files"), and 64 silent sockets
// on a gossip port kept every gossip stream to that server out — a new
// replica stayed unknown there — while it logged a line for each.

const (
	// floodPerPort is how many silent sockets each port gets, the issue's
	// figure; floodAddrs how many loopback addresses (127.0.0.2 on) they
	// come from, 50 each, so that the caps in total matter as well as
	// those per address.
	floodPerPort = 2000
	floodAddrs   = 40
	// handshakeDeadline is handshake_timeout's default (gRPC, Raft and
	// gossip) and the agent's LoadService's; a control server's HTTP port
	// closes a silent socket at 5 s (its ReadHeaderTimeout, and the
	// console's sniff), the agent's at 10 s.
	handshakeDeadline = 10 * time.Second
	// floodLogBound bounds the lines a server logs while it is flooded:
	// every kind of junk line is rate-limited to 5 per 10 s, and the flood
	// is a few dozen thousand junk events (before: a line each).
	floodLogBound = 400
)

// startTLSKeyed starts servers c1..cn, each with a server certificate of p
// (llmgwctl reaches them with an admin one) and the gossip key in keyPath,
// --bootstrap-expect n and --join of the others, and waits until they have
// formed a cluster.
func startTLSKeyed(t *testing.T, p *testPKI, keyPath string, n int) *cluster {
	t.Helper()
	c := &cluster{t: t}
	for i := 1; i <= n; i++ {
		c.servers = append(c.servers, tlsServer(t, p, fmt.Sprintf("c%d", i), serverOpts{extra: []string{"--gossip-key-file", keyPath}}))
	}
	c.startJoined()
	c.waitLeader(c.servers, formTimeout)
	c.waitPeers(c.servers, ids(c.servers), formTimeout)
	return c
}

// floodAddr is the loopback address the i-th silent socket comes from.
func floodAddr(i int) string { return fmt.Sprintf("127.0.0.%d", 2+i%floodAddrs) }

// raiseFDLimit makes sure this process may hold need descriptors, raising
// RLIMIT_NOFILE (up to its hard limit, or past it as root) or skipping the
// test when it cannot.
func raiseFDLimit(t *testing.T, need uint64) {
	t.Helper()
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		t.Fatal(err)
	}
	if l.Cur >= need {
		return
	}
	l.Cur = min(max(need, l.Cur), max(l.Max, need))
	if l.Max < need {
		l.Max = need // only root may
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		t.Skipf("the flood needs %d file descriptors and RLIMIT_NOFILE cannot be raised to it: %v", need, err)
	}
	t.Logf("RLIMIT_NOFILE raised to %d for the flood", l.Cur)
}

// portFlood is floodPerPort silent sockets on one port, each watched until
// the server closes it.
type portFlood struct {
	name     string
	deadline time.Duration
	wg       sync.WaitGroup

	mu        sync.Mutex
	lifetimes []time.Duration // of the sockets the server closed
	refused   int             // reset while connecting: closed at once
	dialErrs  []string
	open      int // still open past the deadline and the slack
}

// floodPort opens n silent sockets on addr, from floodAddrs addresses, and
// watches each until the server closes it or deadline plus slack passes.
func floodPort(name, addr string, n int, deadline, slack time.Duration) *portFlood {
	f := &portFlood{name: name, deadline: deadline}
	next := atomic.Int64{}
	for range 16 {
		f.wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(floodAddr(i))}, Timeout: 10 * time.Second}
				c, err := d.Dial("tcp", addr)
				if err != nil {
					f.mu.Lock()
					if errors.Is(err, syscall.ECONNRESET) {
						f.refused++
					} else {
						f.dialErrs = append(f.dialErrs, err.Error())
					}
					f.mu.Unlock()
					continue
				}
				f.wg.Go(func() { f.watch(c, time.Now(), deadline+slack) })
			}
		})
	}
	return f
}

// watch reads c — the server may speak first (gRPC's SETTINGS), the
// socket never does — until the server closes it or limit passes.
func (f *portFlood) watch(c net.Conn, start time.Time, limit time.Duration) {
	defer c.Close()
	_ = c.SetReadDeadline(start.Add(limit))
	_, err := io.Copy(io.Discard, c)
	f.mu.Lock()
	defer f.mu.Unlock()
	if errors.Is(err, os.ErrDeadlineExceeded) {
		f.open++
		return
	}
	f.lifetimes = append(f.lifetimes, time.Since(start))
}

// result waits for every socket and says what became of them.
func (f *portFlood) result() (summary string, open int, longest time.Duration) {
	f.wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	sort.Slice(f.lifetimes, func(i, j int) bool { return f.lifetimes[i] < f.lifetimes[j] })
	// Those closed well before the deadline made room for later ones, past
	// a cap.
	early := 0
	for _, d := range f.lifetimes {
		if d < f.deadline*9/10 {
			early++
		}
	}
	if len(f.lifetimes) > 0 {
		longest = f.lifetimes[len(f.lifetimes)-1]
	}
	summary = fmt.Sprintf("%-11s %4d closed (%4d before the deadline, to make room; %d reset while connecting), the longest after %6v, deadline %v; %d still open; %d dials failed",
		f.name, len(f.lifetimes), early, f.refused, longest.Round(10*time.Millisecond), f.deadline, f.open, len(f.dialErrs))
	if len(f.dialErrs) > 0 {
		summary += " (first: " + f.dialErrs[0] + ")"
	}
	return summary, f.open, longest
}

// sustainedFlood keeps n silent sockets open on addr, from the addresses
// given in turn, each reopened 200 ms after the server closes it, until
// stop: the way 64 silent sockets kept a gossip port's handshake slots.
type sustainedFlood struct {
	stop   chan struct{}
	wg     sync.WaitGroup
	opened atomic.Int64
}

func sustain(addr string, n int, from []string) *sustainedFlood {
	s := &sustainedFlood{stop: make(chan struct{})}
	for i := range n {
		s.wg.Go(func() {
			for {
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from[i%len(from)])}, Timeout: 5 * time.Second}
				if c, err := d.Dial("tcp", addr); err == nil {
					s.opened.Add(1)
					closed := make(chan struct{})
					go func() { defer close(closed); _, _ = io.Copy(io.Discard, c) }()
					select {
					case <-closed:
					case <-s.stop:
					}
					c.Close()
					<-closed
				}
				select {
				case <-s.stop:
					return
				case <-time.After(200 * time.Millisecond): // pacing: reopen
				}
			}
		})
	}
	return s
}

func (s *sustainedFlood) end() {
	close(s.stop)
	s.wg.Wait()
}

// junkUDP sends n packets of garbage to a gossip port.
func junkUDP(t *testing.T, addr string, n int) {
	t.Helper()
	c, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range n {
		_, _ = c.Write([]byte(fmt.Sprintf("junk packet %d that is no gossip", i)))
	}
}

// keepsWorking checks, every 300 ms until stop, that llmgwctl and /healthz
// answer at s, that s sees every server alive in gossip, that the router
// serves a chat and the agent its /healthz; it returns how many rounds
// passed and the failures.
func keepsWorking(s *controlServer, servers int, router, agentHTTP string, stop <-chan struct{}) (rounds int, failures []string) {
	get := func(url string) error {
		resp, err := chatClient.Get(url)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	for {
		start := time.Now()
		if _, err := s.ctl("cluster", "status", "-o", "json"); err != nil {
			failures = append(failures, fmt.Sprintf("llmgwctl cluster status at %s: %v", s.id, err))
		}
		if err := get("http://" + s.http + "/healthz"); err != nil {
			failures = append(failures, fmt.Sprintf("%s /healthz: %v", s.id, err))
		}
		if m, err := s.memberStatus(); err != nil {
			failures = append(failures, fmt.Sprintf("llmgwctl server members at %s: %v", s.id, err))
		} else if alive := strings.Count(fmt.Sprint(m), "alive"); alive != servers {
			failures = append(failures, fmt.Sprintf("%s sees %d servers alive in gossip: %v", s.id, alive, m))
		}
		if code, body := chat(router, "m"); code != http.StatusOK {
			failures = append(failures, fmt.Sprintf("chat: %d %s", code, body))
		}
		if err := get("http://" + agentHTTP + "/healthz"); err != nil {
			failures = append(failures, fmt.Sprintf("agent /healthz: %v", err))
		}
		rounds++
		select {
		case <-stop:
			return rounds, failures
		case <-time.After(max(0, 300*time.Millisecond-time.Since(start))): // pacing
		}
	}
}

// readyOn waits until s's own copy of the state (no --consistent: its
// statuses come from the other servers over gossip's streams) shows n
// ready replicas of model.
func readyOn(t *testing.T, s *controlServer, model string, n int, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	var got int
	if !eventually(timeout, func() bool {
		out, err := s.ctl("replica", "list", "-o", "json")
		if err != nil {
			return false
		}
		got = 0
		for _, r := range decodeReplicas(t, out) {
			if r.Replica.Model == model && r.ready() {
				got++
			}
		}
		return got == n
	}) {
		t.Fatalf("%s shows %d ready replicas of %s within %v, want %d: its gossip streams are blocked", s.id, got, model, within(timeout), n)
	}
	return time.Since(start)
}

// TestListenersSilentSockets is issue 26's must-show for the control
// plane and the agent. A 3-server cluster with mutual TLS and a gossip key,
// an agent and a router serve model m; the agent and the router use c1
// and c2, so that c3 learns the agent's replicas only over gossip's
// streams. Then 2,000 silent sockets, from 40 loopback addresses, go to
// each of c3's ports — gRPC, Raft, gossip, HTTP — and to each of the
// agent's (LoadService, HTTP), with 2,000 junk UDP packets on c3's gossip
// port, and m is scaled to 2: every socket is closed within its port's
// handshake deadline (most at once: past a cap, the oldest socket still in
// its handshake makes room), while llmgwctl, /healthz, gossip and chat keep
// working throughout, c3 learns the new replica, and c3's log stays short.
// Then 256 silent sockets are held on c3's gossip port, each reopened as it
// is closed, and a new model's replica must still reach c3.
//
// Without the fix the Raft port's sockets are never closed and the gRPC
// port's only at gRPC's 120 s ConnectionTimeout (the first check fails);
// with the earlier gossip transport, whose 64 handshake slots the held
// sockets fill, the new model's replica never reaches c3; without the
// rate limits c3 logs a line per Raft socket and per UDP packet.
//
// The test raises RLIMIT_NOFILE if it is below 12,000 sockets and room.
func TestListenersSilentSockets(t *testing.T) {
	raiseFDLimit(t, 6*floodPerPort+4096)
	p := newPKI(t)
	keyPath, _ := keyFile(t)
	servers := startTLSKeyed(t, p, keyPath, 3).servers
	target := servers[2]
	control := []string{servers[0].grpc, servers[1].grpc}
	agent := startAgentProc(t, "n1", control, append(p.flags(mtls.RoleAgent, "n1"), "--gpus", "4")...)
	agentGRPC := agent.args[slicesIndex(agent.args, "--grpc-addr")+1]
	router := startRouterWith(t, "r1", control, p.flags(mtls.RoleRouter, "r1")...)
	if out, err := servers[0].ctl("model", "apply", "-f", modelFile(t, "m", 1)); err != nil {
		t.Fatalf("model apply: %v: %s", err, out)
	}
	if !eventually(90*time.Second, func() bool { code, _ := chat(router.http, "m"); return code == http.StatusOK }) {
		code, body := chat(router.http, "m")
		t.Fatalf("no chat served within %v: %d %s", within(90*time.Second), code, body)
	}
	readyOn(t, target, "m", 1, 30*time.Second)

	// The flood, and the checks while it lasts.
	failedBefore := sendsFailed(t, servers[:2])
	logBefore := strings.Count(target.output(), "\n")
	stop := make(chan struct{})
	var rounds int
	var failures []string
	checked := make(chan struct{})
	go func() {
		defer close(checked)
		rounds, failures = keepsWorking(target, 3, router.http, agent.http, stop)
	}()
	start := time.Now()
	slack := within(5 * time.Second)
	floods := []*portFlood{
		floodPort("c3 gRPC", target.grpc, floodPerPort, handshakeDeadline, slack),
		floodPort("c3 Raft", target.raft, floodPerPort, handshakeDeadline, slack),
		floodPort("c3 gossip", target.gossip, floodPerPort, handshakeDeadline, slack),
		floodPort("c3 HTTP", target.http, floodPerPort, 5*time.Second, slack),
		floodPort("agent load", agentGRPC, floodPerPort, handshakeDeadline, slack),
		floodPort("agent HTTP", agent.http, floodPerPort, 10*time.Second, slack),
	}
	junkUDP(t, target.gossip, floodPerPort)
	// A new replica, whose status c3 can learn only over gossip streams.
	if out, err := servers[0].ctl("model", "apply", "-f", modelFile(t, "m", 2)); err != nil {
		t.Fatalf("scale m to 2 during the flood: %v: %s", err, out)
	}
	learned := readyOn(t, target, "m", 2, 30*time.Second)
	var summaries []string
	for _, f := range floods {
		summary, open, longest := f.result()
		summaries = append(summaries, summary)
		if open > 0 || longest > f.deadline+slack {
			t.Errorf("%s: %d silent sockets still open, the longest closed after %v: past the handshake deadline %v (+%v slack)",
				f.name, open, longest.Round(time.Millisecond), f.deadline, slack)
		}
	}
	close(stop)
	<-checked
	floodTook := time.Since(start)
	logLines := strings.Count(target.output(), "\n") - logBefore
	t.Logf("%d silent sockets on each port, from %d addresses, and %d junk UDP packets; over %v:\n  %s",
		floodPerPort, floodAddrs, floodPerPort, floodTook.Round(time.Millisecond), strings.Join(summaries, "\n  "))
	t.Logf("meanwhile %d rounds of llmgwctl, /healthz, gossip members, chat and the agent's /healthz (%d failures); c3 learned the new replica in %v; c3 logged %d lines",
		rounds, len(failures), learned.Round(time.Millisecond), logLines)
	for i, f := range failures {
		if i == 10 {
			t.Errorf("... and %d more", len(failures)-10)
			break
		}
		t.Error(f)
	}
	if logLines > floodLogBound {
		t.Errorf("c3 logged %d lines during the flood, more than %d: junk is not rate-limited:\n%s", logLines, floodLogBound, tail(target.output(), 20))
	}

	// Held sockets on the gossip port, from 4 addresses, reopened as they
	// are closed: 4 times the 64 handshake slots of the earlier transport.
	held := sustain(target.gossip, 256, []string{"127.0.0.42", "127.0.0.43", "127.0.0.44", "127.0.0.45"})
	defer held.end()
	if !eventually(10*time.Second, func() bool { return held.opened.Load() >= 256 }) {
		t.Fatalf("only %d of 256 held sockets opened", held.opened.Load())
	}
	if out, err := servers[0].ctl("model", "apply", "-f", modelFile(t, "m2", 1)); err != nil {
		t.Fatalf("model apply m2: %v: %s", err, out)
	}
	learned = readyOn(t, target, "m2", 1, 30*time.Second)
	if code, body := chat(router.http, "m2"); code != http.StatusOK {
		t.Errorf("chat to m2 while c3's gossip port is held: %d %s", code, body)
	}
	// Every update the agent's servers sent c3 went through: none was
	// dropped for a stream refused (the repair, a full copy later, is what
	// let the earlier transport's c3 catch up, seconds late, between two
	// floods of its handshake slots).
	if failed := sendsFailed(t, servers[:2]) - failedBefore; failed > 0 {
		t.Errorf("c1 and c2 dropped %v updates to c3 for failed gossip streams while c3 was flooded", failed)
	}
	t.Logf("with 256 silent sockets held on c3's gossip port (%d opened in all), c3 learned m2's replica in %v", held.opened.Load(), learned.Round(time.Millisecond))
}

// sendsFailed is the updates servers dropped for a failed gossip stream to
// a peer (the ephemeral plane's send_failed).
func sendsFailed(t *testing.T, servers []*controlServer) float64 {
	t.Helper()
	var n float64
	for _, s := range servers {
		v, _ := testkit.Scrape(s.http, "llmgw_control_ephemeral_drops_total", testkit.Labels{"reason": "send_failed"})
		n += v
	}
	return n
}
