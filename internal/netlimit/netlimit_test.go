package netlimit

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeConn is a connection with the addresses a test gives it; it records
// its Close.
type fakeConn struct {
	net.Conn // nil: only what the limiter calls is implemented
	name     string
	local    net.Addr
	remote   net.Addr
	closed   *[]string
	deadline time.Time
}

func (c *fakeConn) RemoteAddr() net.Addr { return c.remote }
func (c *fakeConn) LocalAddr() net.Addr  { return c.local }
func (c *fakeConn) Close() error {
	*c.closed = append(*c.closed, c.name)
	return nil
}
func (c *fakeConn) SetDeadline(t time.Time) error { c.deadline = t; return nil }

// wrapped is a wrapper that unwraps as *tls.Conn does; sameEnds one that
// does not, but has its connection's addresses.
type wrapped struct{ net.Conn }

func (w wrapped) NetConn() net.Conn { return w.Conn }

type sameEnds struct{ net.Conn }

// fakeTimers fires the limiter's handshake timeouts when a test says.
type fakeTimers struct {
	mu     sync.Mutex
	timers []*fakeTimer
}

type fakeTimer struct {
	f       func()
	stopped bool
}

func (t *fakeTimer) Stop() bool { was := !t.stopped; t.stopped = true; return was }

func (ft *fakeTimers) AfterFunc(_ time.Duration, f func()) Timer {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	t := &fakeTimer{f: f}
	ft.timers = append(ft.timers, t)
	return t
}

// fire runs every timer not stopped, as if the timeout had passed.
func (ft *fakeTimers) fire() {
	ft.mu.Lock()
	ts := slices.Clone(ft.timers)
	ft.mu.Unlock()
	for _, t := range ts {
		if !t.stopped {
			t.f()
		}
	}
}

func tcpAddr(ip string, port int) *net.TCPAddr {
	return &net.TCPAddr{IP: net.ParseIP(ip), Port: port}
}

// step is one thing a table test does: admit a connection from an address,
// move one to a state, close it, or fire the timeouts.
type step struct {
	op   string // admit, active, idle, close, deadline-cleared, fire, via-netconn, via-ends, connstate-idle, connstate-active
	name string
	from string // admit: the remote IP
	// refused: admit is expected to refuse it.
	refused bool
}

func TestLimiter(t *testing.T) {
	admit := func(name, from string) step { return step{op: "admit", name: name, from: from} }
	refuse := func(name, from string) step { return step{op: "admit", name: name, from: from, refused: true} }
	do := func(op, name string) step { return step{op: op, name: name} }
	tests := []struct {
		name  string
		cfg   Config
		steps []step
		// closed is what the limiter closed, in order; drops their reasons.
		closed []string
		drops  []Reason
		open   int
	}{
		{"no limits", Config{},
			[]step{admit("a", "10.0.0.1"), admit("b", "10.0.0.1"), admit("c", "10.0.0.1")},
			nil, nil, 3},
		{"per address: busy connections refuse the next from that address only", Config{MaxConnsPerAddr: 2},
			[]step{admit("a", "10.0.0.1"), do("active", "a"), admit("b", "10.0.0.1"), do("active", "b"),
				refuse("c", "10.0.0.1"), admit("d", "10.0.0.2")},
			[]string{"c"}, []Reason{RefusedPerAddr}, 3},
		{"per address: the address's oldest pending connection makes room", Config{MaxConnsPerAddr: 2},
			[]step{admit("x", "10.0.0.2"), admit("a", "10.0.0.1"), admit("b", "10.0.0.1"), admit("c", "10.0.0.1")},
			[]string{"a"}, []Reason{EvictedHandshake}, 3},
		{"total: the oldest idle connection makes room", Config{MaxConns: 2},
			[]step{admit("a", "10.0.0.1"), do("active", "a"), admit("b", "10.0.0.1"), do("idle", "b"), admit("c", "10.0.0.2")},
			[]string{"b"}, []Reason{EvictedIdle}, 2},
		{"total: oldest first, pending or idle", Config{MaxConns: 2},
			[]step{admit("a", "10.0.0.1"), do("idle", "a"), admit("b", "10.0.0.2"), admit("c", "10.0.0.3"), admit("d", "10.0.0.4")},
			[]string{"a", "b"}, []Reason{EvictedIdle, EvictedHandshake}, 2},
		{"total: nothing spare refuses", Config{MaxConns: 1},
			[]step{admit("a", "10.0.0.1"), do("active", "a"), refuse("b", "10.0.0.2")},
			[]string{"b"}, []Reason{RefusedTotal}, 1},
		{"an idle connection that served again is the newest", Config{MaxConns: 3},
			[]step{admit("a", "10.0.0.1"), do("idle", "a"), admit("b", "10.0.0.1"), do("idle", "b"), admit("c", "10.0.0.1"), do("active", "c"),
				do("active", "a"), do("idle", "a"), admit("d", "10.0.0.2")},
			[]string{"b"}, []Reason{EvictedIdle}, 3},
		{"both caps: the address's own connection goes, once", Config{MaxConns: 2, MaxConnsPerAddr: 1},
			[]step{admit("a", "10.0.0.1"), admit("b", "10.0.0.2"), admit("c", "10.0.0.2")},
			[]string{"b"}, []Reason{EvictedHandshake}, 2},
		{"a closed connection frees its slot", Config{MaxConns: 1, MaxConnsPerAddr: 1},
			[]step{admit("a", "10.0.0.1"), do("active", "a"), do("close", "a"), admit("b", "10.0.0.1"), do("active", "b")},
			[]string{"a"}, nil, 1},
		{"handshake timeout closes the pending only", Config{HandshakeTimeout: time.Second},
			[]step{admit("a", "10.0.0.1"), admit("b", "10.0.0.1"), do("active", "b"), admit("c", "10.0.0.1"), do("idle", "c"), do("fire", "")},
			[]string{"a"}, []Reason{HandshakeTimeout}, 2},
		{"a timeout after a close does nothing", Config{HandshakeTimeout: time.Second},
			[]step{admit("a", "10.0.0.1"), do("close", "a"), do("fire", "")},
			[]string{"a"}, nil, 0},
		{"a cleared deadline ends the handshake when configured", Config{MaxConns: 1, ClearedDeadlineEndsHandshake: true},
			[]step{admit("a", "10.0.0.1"), do("deadline-cleared", "a"), refuse("b", "10.0.0.2")},
			[]string{"b"}, []Reason{RefusedTotal}, 1},
		{"a cleared deadline means nothing otherwise", Config{MaxConns: 1},
			[]step{admit("a", "10.0.0.1"), do("deadline-cleared", "a"), admit("b", "10.0.0.2")},
			[]string{"a"}, []Reason{EvictedHandshake}, 1},
		{"IPv6 counts by /64", Config{MaxConnsPerAddr: 1},
			[]step{admit("a", "2001:db8::1"), do("active", "a"), refuse("b", "2001:db8::2"), admit("c", "2001:db8:0:1::1"),
				admit("d", "::ffff:10.0.0.1"), do("active", "d"), refuse("e", "10.0.0.1")},
			[]string{"b", "e"}, []Reason{RefusedPerAddr, RefusedPerAddr}, 3},
		{"found through NetConn", Config{MaxConns: 1},
			[]step{admit("a", "10.0.0.1"), do("via-netconn", "a"), refuse("b", "10.0.0.2")},
			[]string{"b"}, []Reason{RefusedTotal}, 1},
		{"found by its addresses", Config{MaxConns: 1},
			[]step{admit("a", "10.0.0.1"), do("via-ends", "a"), refuse("b", "10.0.0.2")},
			[]string{"b"}, []Reason{RefusedTotal}, 1},
		{"http ConnState", Config{MaxConns: 2},
			[]step{admit("a", "10.0.0.1"), do("connstate-active", "a"), admit("b", "10.0.0.1"), do("connstate-active", "b"),
				do("connstate-idle", "b"), admit("c", "10.0.0.2")},
			[]string{"b"}, []Reason{EvictedIdle}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var closed []string
			var drops []Reason
			var timers fakeTimers
			cfg := tt.cfg
			cfg.OnDrop = func(r Reason) { drops = append(drops, r) }
			cfg.AfterFunc = timers.AfterFunc
			l := New(cfg)
			conns := map[string]net.Conn{}
			fakes := map[string]*fakeConn{}
			for i, s := range tt.steps {
				switch s.op {
				case "admit":
					fc := &fakeConn{name: s.name, local: tcpAddr("10.9.9.9", 443), remote: tcpAddr(s.from, 40000+i), closed: &closed}
					fakes[s.name] = fc
					c, ok := l.Admit(fc)
					if ok == s.refused {
						t.Fatalf("step %d: admit %s from %s: admitted %v, want %v", i, s.name, s.from, ok, !s.refused)
					}
					conns[s.name] = c
				case "active":
					l.Active(conns[s.name])
				case "idle":
					l.Idle(conns[s.name])
				case "close":
					conns[s.name].Close()
				case "deadline-cleared":
					conns[s.name].SetDeadline(time.Time{})
					if !fakes[s.name].deadline.IsZero() {
						t.Fatalf("step %d: SetDeadline did not pass on", i)
					}
				case "fire":
					timers.fire()
				case "via-netconn":
					l.Active(wrapped{conns[s.name]})
				case "via-ends":
					l.Active(sameEnds{fakes[s.name]}) // the raw connection: no path to ours but its addresses
				case "connstate-active":
					l.ConnState(wrapped{conns[s.name]}, http.StateActive)
				case "connstate-idle":
					l.ConnState(wrapped{conns[s.name]}, http.StateIdle)
				default:
					t.Fatalf("unknown op %q", s.op)
				}
			}
			if !slices.Equal(closed, tt.closed) {
				t.Errorf("closed %v, want %v", closed, tt.closed)
			}
			if !slices.Equal(drops, tt.drops) {
				t.Errorf("drops %v, want %v", drops, tt.drops)
			}
			if got := l.Open(); got != tt.open {
				t.Errorf("Open() = %d, want %d", got, tt.open)
			}
			if p, a, i := l.Counts(); p+a+i != tt.open {
				t.Errorf("Counts() = %d handshaking, %d active, %d idle; Open() = %d", p, a, i, tt.open)
			}
		})
	}
}

func TestReasonStrings(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range Reasons {
		s := r.String()
		if s == "unknown" || seen[s] {
			t.Errorf("reason %d: label %q", r, s)
		}
		seen[s] = true
	}
}

// TestLimiterConcurrent admits, moves and closes connections from many
// goroutines (for the race detector) and checks that every slot comes
// back.
func TestLimiterConcurrent(t *testing.T) {
	var mu sync.Mutex
	var closed []string
	l := New(Config{MaxConns: 16, MaxConnsPerAddr: 4, HandshakeTimeout: time.Millisecond})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				fc := &fakeConn{name: "c", local: tcpAddr("10.9.9.9", 443), remote: tcpAddr(fmt.Sprintf("10.0.0.%d", i%5), g*1000+i), closed: new([]string)}
				c, ok := l.Admit(lockedClose{fc, &mu, &closed})
				if !ok {
					continue
				}
				switch i % 3 {
				case 0:
					l.Active(c)
				case 1:
					l.Idle(c)
				}
				if i%2 == 0 {
					c.Close()
				}
			}
		})
	}
	wg.Wait()
	// What is left: idle, active and pending connections; close them all.
	l.mu.Lock()
	var left []*conn
	for _, c := range l.byEnds {
		left = append(left, c)
	}
	l.mu.Unlock()
	for _, c := range left {
		c.Close()
	}
	if n := l.Open(); n != 0 {
		t.Fatalf("Open() = %d after every connection closed", n)
	}
	if p, a, i := l.Counts(); p+a+i != 0 {
		t.Fatalf("Counts() = %d, %d, %d after every connection closed", p, a, i)
	}
	if len(l.addrs) != 0 || l.spare.front() != nil {
		t.Fatalf("state left behind: %d addresses, spare %v", len(l.addrs), l.spare.front())
	}
}

// lockedClose records closes under a lock, for the concurrent test.
type lockedClose struct {
	*fakeConn
	mu     *sync.Mutex
	closed *[]string
}

func (c lockedClose) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	*c.closed = append(*c.closed, c.name)
	return nil
}

// dialFrom connects to addr from the loopback address from (127.0.0.x are
// all loopback), as another client would.
func dialFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedWithin reports whether the server closed c within d: a read ends
// with EOF or a reset rather than the read's own timeout.
func closedWithin(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// serve accepts on ln until it is closed, handing each connection to
// handle on its own goroutine; cleanup closes ln and waits for them all.
func serve(t *testing.T, ln net.Listener, handle func(net.Conn)) {
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { defer c.Close(); handle(c) })
		}
	})
	t.Cleanup(func() { ln.Close(); wg.Wait() })
}

// TestListenerOnLoopback: real connections through Listen. Silent ones
// past the per-address cap are closed at once, the rest at the handshake
// timeout, while a client from another address that speaks is served and
// kept past the timeout.
func TestListenerOnLoopback(t *testing.T) {
	const timeout = 300 * time.Millisecond
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var dropMu sync.Mutex
	drops := map[Reason]int{}
	l := New(Config{MaxConns: 64, MaxConnsPerAddr: 4, HandshakeTimeout: timeout, OnDrop: func(r Reason) {
		dropMu.Lock()
		drops[r]++
		dropMu.Unlock()
	}})
	serve(t, l.ActiveOnFirstRead(l.Listen(inner)), func(c net.Conn) {
		// An echo server: the first byte read marks the connection active.
		b := make([]byte, 1)
		for {
			if _, err := c.Read(b); err != nil {
				return
			}
			if _, err := c.Write(b); err != nil {
				return
			}
		}
	})
	addr := inner.Addr().String()
	start := time.Now()
	var silent []net.Conn
	for range 10 {
		silent = append(silent, dialFrom(t, "127.0.0.2", addr))
	}
	good := dialFrom(t, "127.0.0.3", addr)
	if _, err := good.Write([]byte{'x'}); err != nil {
		t.Fatal(err)
	}
	if _, err := good.Read(make([]byte, 1)); err != nil {
		t.Fatalf("the speaking client was not served: %v", err)
	}
	// Every silent one is closed within the timeout and some slack; the
	// first six were evicted by the later ones of their address.
	for i, c := range silent {
		if !closedWithin(c, timeout+2*time.Second) {
			t.Fatalf("silent connection %d still open %v after it connected", i, time.Since(start))
		}
	}
	// The speaking one outlives the timeout.
	time.Sleep(timeout) // pacing: past the handshake timeout
	if _, err := good.Write([]byte{'y'}); err != nil {
		t.Fatal(err)
	}
	if _, err := good.Read(make([]byte, 1)); err != nil {
		t.Fatalf("the active connection was closed past the handshake timeout: %v", err)
	}
	// A drop is counted just after its socket is closed. Those past the
	// cap were evicted, unless the first ones had timed out before the
	// last came (a slow machine); the last 4 time out.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		dropMu.Lock()
		got := fmt.Sprint(drops)
		ok := drops[EvictedHandshake]+drops[HandshakeTimeout] == 10 && drops[HandshakeTimeout] >= 4
		dropMu.Unlock()
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("drops %s, want 10 evicted in their handshake or timed out, 4 of them at least timed out", got)
		}
	}
}

// TestTLSHandshakeNotInAccept: with tls.NewListener over the limiter, a
// silent peer never holds up Accept (the handshake runs in the
// connection's first Read), and it is closed at the timeout while a peer
// that completes its handshake and speaks is active.
func TestTLSHandshakeNotInAccept(t *testing.T) {
	const timeout = 300 * time.Millisecond
	cert := selfSigned(t)
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(Config{HandshakeTimeout: timeout})
	ln := l.ActiveOnFirstRead(tls.NewListener(l.Listen(inner), &tls.Config{Certificates: []tls.Certificate{cert}}))
	serve(t, ln, func(c net.Conn) {
		b := make([]byte, 1)
		if _, err := c.Read(b); err == nil {
			c.Write(b)
			c.Read(b) // until the client closes
		}
	})
	addr := inner.Addr().String()
	var silent []net.Conn
	for range 20 {
		silent = append(silent, dialFrom(t, "127.0.0.1", addr))
	}
	start := time.Now()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatalf("a TLS client behind 20 silent ones: %v", err)
	}
	defer c.Close()
	if _, err := c.Write([]byte{'x'}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took >= timeout {
		t.Errorf("the TLS client was served after %v, at or past the silent ones' timeout %v", took, timeout)
	}
	for i, s := range silent {
		if !closedWithin(s, timeout+2*time.Second) {
			t.Fatalf("silent connection %d not closed", i)
		}
	}
	if n := l.Open(); n != 1 {
		t.Errorf("Open() = %d, want 1 (the TLS client)", n)
	}
}

// TestCloseWritePassesOn: a half-close reaches the peer as EOF while the
// connection still reads.
func TestCloseWritePassesOn(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(Config{MaxConns: 1})
	serve(t, l.Listen(inner), func(c net.Conn) {
		c.Write([]byte("bye"))
		c.(interface{ CloseWrite() error }).CloseWrite()
		c.Read(make([]byte, 1)) // until the client closes
	})
	c := dialFrom(t, "127.0.0.1", inner.Addr().String())
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 8)
	n, _ := c.Read(b)
	if string(b[:n]) != "bye" {
		t.Fatalf("read %q", b[:n])
	}
	if _, err := c.Read(b); err == nil || err.Error() != "EOF" {
		t.Fatalf("after the half-close: %v, want EOF", err)
	}
}

// selfSigned is a throwaway server certificate for 127.0.0.1.
func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func TestCounts(t *testing.T) {
	var closed []string
	l := New(Config{})
	admit := func(name string) net.Conn {
		c, _ := l.Admit(&fakeConn{name: name, local: tcpAddr("10.9.9.9", 443), remote: tcpAddr("10.0.0.1", len(closed)+len(name)*100), closed: &closed})
		return c
	}
	a, b, c := admit("a"), admit("b"), admit("c")
	l.Active(a)
	l.Idle(b)
	if p, ac, i := l.Counts(); p != 1 || ac != 1 || i != 1 {
		t.Fatalf("Counts() = %d, %d, %d, want 1 handshaking, 1 active, 1 idle", p, ac, i)
	}
	l.Idle(a)
	c.Close()
	if p, ac, i := l.Counts(); p != 0 || ac != 0 || i != 2 {
		t.Fatalf("Counts() = %d, %d, %d, want 2 idle", p, ac, i)
	}
}

// BenchmarkConnState is the limiter's cost per HTTP request on a kept-alive
// connection: the two state changes net/http reports (active, then idle),
// on 1,024 open connections, from parallel goroutines (one lock for all).
func BenchmarkConnState(b *testing.B) {
	var closed []string
	l := New(Config{MaxConns: 4096, MaxConnsPerAddr: 256})
	var conns []net.Conn
	for i := range 1024 {
		c, _ := l.Admit(&fakeConn{name: "c", local: tcpAddr("10.9.9.9", 443), remote: tcpAddr(fmt.Sprintf("10.0.%d.%d", i/256, i%256), 40000), closed: &closed})
		conns = append(conns, c)
	}
	var next atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		c := conns[int(next.Add(1))%len(conns)]
		for pb.Next() {
			l.ConnState(c, http.StateActive)
			l.ConnState(c, http.StateIdle)
		}
	})
}
