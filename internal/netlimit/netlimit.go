// Package netlimit bounds what the peers of one listener can hold of a
// process (design §11 "Limits"): the connections open at once, in total and
// per address, and the time a connection may take before its handshake is
// done. Without it, a process's listeners kept every connection a peer
// opened for as long as the peer liked — 1,500 silent sockets on a control
// server's Raft and gRPC ports stayed open, and at a 1,024-fd limit
// llmgwctl and /healthz failed with "too many open files" — and one client
// holding a router's every connection slot kept all the others out (issue
// 26).
//
// The rules, one Limiter per listener:
//
//   - A connection is pending from its accept until the server says its
//     handshake is done (Active), then active, or idle between requests
//     (Idle: an HTTP keep-alive). Pending and idle connections are held for
//     nothing the peer has proved it needs; active ones are doing work.
//   - Past a cap — MaxConns in total, MaxConnsPerAddr from one address —
//     the oldest pending or idle connection within that cap (of that
//     address, for the per-address cap) is closed to make room, and only
//     if there is none is the new connection refused: closed at once. So
//     a flood of silent sockets, from one address or many, never keeps a
//     peer that completes its handshake out; it only evicts its own.
//   - A connection still pending HandshakeTimeout after its accept is
//     closed, whatever the server is doing with it.
//   - Accept never waits on a peer: it takes the next connection, does the
//     bookkeeping and returns it; handshakes run in the server's own
//     per-connection goroutines (TLS in the first Read, gRPC in its
//     handleRawConn), never in the accept loop.
//
// Every connection the limiter closes is reported to Config.OnDrop with its
// reason; Metrics counts those and the connections open on a registry the
// caller gives. The package keeps no global state.
//
// How a server says "handshake done": HTTP servers through ConnState (net/
// http's ReadHeaderTimeout already bounds a silent connection, TLS
// handshake included, so an HTTP listener needs no HandshakeTimeout of its
// own); gRPC by clearing the deadline it set (ClearedDeadlineEndsHandshake,
// after the HTTP/2 preface); a bare protocol such as Raft's by its first
// byte of data (ActiveOnFirstRead); anything else by calling Active.
//
// Addresses: the per-address cap counts IPv4 addresses one by one and IPv6
// ones by /64, the block one host is usually given, or one host could open
// a cap's worth from each of its 2^64 addresses.
package netlimit

import (
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Reason says why the limiter closed a connection.
type Reason uint8

const (
	// RefusedTotal: a new connection past MaxConns, with no pending or idle
	// connection to close instead.
	RefusedTotal Reason = iota + 1
	// RefusedPerAddr: a new connection past MaxConnsPerAddr, with no
	// pending or idle connection of its address to close instead.
	RefusedPerAddr
	// EvictedHandshake: the oldest connection still in its handshake,
	// closed to make room for a new one.
	EvictedHandshake
	// EvictedIdle: the oldest idle connection, closed to make room.
	EvictedIdle
	// HandshakeTimeout: still pending HandshakeTimeout after its accept.
	HandshakeTimeout
)

// Reasons lists every Reason, for callers that create their metrics'
// series up front.
var Reasons = []Reason{RefusedTotal, RefusedPerAddr, EvictedHandshake, EvictedIdle, HandshakeTimeout}

// String is the reason as a metric label.
func (r Reason) String() string {
	switch r {
	case RefusedTotal:
		return "total"
	case RefusedPerAddr:
		return "per_address"
	case EvictedHandshake:
		return "evicted_handshake"
	case EvictedIdle:
		return "evicted_idle"
	case HandshakeTimeout:
		return "handshake_timeout"
	}
	return "unknown"
}

// Config sizes one listener's limits. The zero value limits nothing.
type Config struct {
	// MaxConns bounds the connections open at once; 0 is no bound.
	MaxConns int
	// MaxConnsPerAddr bounds those from one address (an IPv4 address, an
	// IPv6 /64); 0 is no bound.
	MaxConnsPerAddr int
	// HandshakeTimeout closes a connection not marked Active within it of
	// its accept; 0 is no timeout (the server bounds its handshake itself,
	// as net/http does with ReadHeaderTimeout).
	HandshakeTimeout time.Duration
	// ClearedDeadlineEndsHandshake marks a connection Active when the
	// server clears its deadline (SetDeadline with the zero time), the
	// way gRPC's server ends its handshake: it sets a deadline of its
	// ConnectionTimeout on accept and clears it once the TLS handshake and
	// the client's HTTP/2 preface are in.
	ClearedDeadlineEndsHandshake bool
	// OnDrop, if set, is called for every connection the limiter closes,
	// with no lock held, from the goroutine that closed it.
	OnDrop func(Reason)
	// AfterFunc schedules the handshake timeouts; time.AfterFunc when nil
	// (tests give a clock of their own).
	AfterFunc func(d time.Duration, f func()) Timer
}

// Timer is what the limiter needs of a scheduled timeout (*time.Timer).
type Timer interface{ Stop() bool }

// Limiter applies one Config to the connections of one listener: wrap the
// listener with Listen (or pass each accepted connection to Admit, for a
// server whose accept loop is not ours) and tell it how connections
// progress with Active and Idle. It is safe for concurrent use.
type Limiter struct {
	cfg Config

	mu   sync.Mutex
	open int
	// states counts the open connections by state.
	states [gone]int
	addrs  map[netip.Prefix]*addrConns
	// spare is the oldest-first queue of every pending or idle connection:
	// the candidates for eviction.
	spare queue
	// byEnds finds a connection by its two addresses, for Active and Idle
	// given a wrapper that does not unwrap (NetConn) to ours.
	byEnds map[ends]*conn
}

// addrConns is one address's share.
type addrConns struct {
	n     int
	spare queue // its pending or idle connections, oldest first
}

// ends is a TCP connection's two addresses: unique among the open
// connections of one listener.
type ends struct{ local, remote netip.AddrPort }

// New returns a limiter for cfg.
func New(cfg Config) *Limiter {
	if cfg.AfterFunc == nil {
		cfg.AfterFunc = func(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
	}
	return &Limiter{cfg: cfg, spare: queue{link: allLink}, addrs: map[netip.Prefix]*addrConns{}, byEnds: map[ends]*conn{}}
}

// Open is the number of connections open now.
func (l *Limiter) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// Counts is the open connections by state: still in their handshake,
// active, idle.
func (l *Limiter) Counts() (handshaking, busy, waiting int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.states[pending], l.states[active], l.states[idle]
}

// HandshakeTimeout is the configured one, for a caller that runs the
// handshake itself and bounds it the same.
func (l *Limiter) HandshakeTimeout() time.Duration { return l.cfg.HandshakeTimeout }

// Listen wraps inner: its Accept admits each connection (Admit), loops
// past the refused ones, and returns the next admitted one.
func (l *Limiter) Listen(inner net.Listener) net.Listener { return &listener{Listener: inner, l: l} }

type listener struct {
	net.Listener
	l *Limiter
}

func (ln *listener) Accept() (net.Conn, error) {
	for {
		c, err := ln.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if ac, ok := ln.l.Admit(c); ok {
			return ac, nil
		}
	}
}

// state is where a connection is in its life.
type state uint8

const (
	pending state = iota
	active
	idle
	gone // closed, or chosen to be: its counts are released
)

// conn is an admitted connection. Its fields after Conn are guarded by
// l.mu.
type conn struct {
	net.Conn
	l    *Limiter
	addr netip.Prefix
	ends ends // the zero value when the connection is not TCP

	st    state
	timer Timer
	// all and mine link it into l.spare and its address's spare queue
	// while it is pending or idle.
	all, mine link
}

// Admit counts c against the caps and returns it wrapped, or closes it
// and returns false when it is refused. It may close older connections to
// make room (see the package doc). It never blocks on a peer.
func (l *Limiter) Admit(c net.Conn) (net.Conn, bool) {
	nc := &conn{Conn: c, l: l, addr: prefixOf(c.RemoteAddr())}
	if lo, ok := addrPort(c.LocalAddr()); ok {
		if ro, ok := addrPort(c.RemoteAddr()); ok {
			nc.ends = ends{lo, ro}
		}
	}
	// Past a cap, the oldest spare connection within it makes room; with
	// none, the new one is refused. The per-address cap goes first, so
	// that an address over its share evicts its own.
	var out victims
	l.mu.Lock()
	if max := l.cfg.MaxConnsPerAddr; max > 0 {
		if a := l.addrs[nc.addr]; a != nil && a.n >= max && !l.evictLocked(a.spare.front(), &out) {
			return l.refuseLocked(c, RefusedPerAddr)
		}
	}
	if max := l.cfg.MaxConns; max > 0 && l.open >= max && !l.evictLocked(l.spare.front(), &out) {
		return l.refuseLocked(c, RefusedTotal)
	}
	a := l.addrs[nc.addr]
	if a == nil {
		a = &addrConns{spare: queue{link: mineLink}}
		l.addrs[nc.addr] = a
	}
	l.open++
	l.states[pending]++
	a.n++
	l.spare.push(nc)
	a.spare.push(nc)
	if nc.ends != (ends{}) {
		l.byEnds[nc.ends] = nc
	}
	if d := l.cfg.HandshakeTimeout; d > 0 {
		nc.timer = l.cfg.AfterFunc(d, nc.timedOut)
	}
	l.mu.Unlock()
	for _, v := range out.list[:out.n] {
		// An idle connection goes with a FIN, so its client sees an
		// ordinary close of a kept-alive connection; one in its handshake
		// with a reset.
		l.drop(v.c, v.why, v.why == EvictedHandshake)
	}
	return nc, true
}

// victims is the connections Admit evicts, at most one per cap, closed
// once the lock is released.
type victims struct {
	list [2]struct {
		c   net.Conn
		why Reason
	}
	n int
}

// evictLocked releases v, the oldest spare connection within a cap, into
// out; false when there is none (v is nil).
func (l *Limiter) evictLocked(v *conn, out *victims) bool {
	if v == nil {
		return false
	}
	why := EvictedHandshake
	if v.st == idle {
		why = EvictedIdle
	}
	out.list[out.n].c, out.list[out.n].why = v.Conn, why
	out.n++
	l.releaseLocked(v)
	return true
}

// refuseLocked unlocks l and closes c, refused for why. Nothing was
// evicted for c by then: the per-address cap refuses before it evicts, and
// once it has evicted, the total is below its cap.
func (l *Limiter) refuseLocked(c net.Conn, why Reason) (net.Conn, bool) {
	l.mu.Unlock()
	l.drop(c, why, true)
	return nil, false
}

// drop closes c for reason and reports it. reset closes with a TCP reset
// (SO_LINGER 0), so a refused or silent peer's connection leaves nothing
// behind in the kernel (no TIME_WAIT) under a flood.
func (l *Limiter) drop(c net.Conn, reason Reason, reset bool) {
	if tc, ok := c.(*net.TCPConn); ok && reset {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
	if l.cfg.OnDrop != nil {
		l.cfg.OnDrop(reason)
	}
}

// releaseLocked takes c out of every count and queue: from now on its slot
// is free, whoever closes it.
func (l *Limiter) releaseLocked(c *conn) {
	if c.st == gone {
		return
	}
	if c.st != active {
		l.spare.remove(c)
		l.addrs[c.addr].spare.remove(c)
	}
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	l.states[c.st]--
	c.st = gone
	l.open--
	a := l.addrs[c.addr]
	if a.n--; a.n == 0 {
		delete(l.addrs, c.addr)
	}
	if c.ends != (ends{}) {
		delete(l.byEnds, c.ends)
	}
}

// timedOut closes c if it is still pending when its handshake timeout
// fires.
func (c *conn) timedOut() {
	c.l.mu.Lock()
	if c.st != pending {
		c.l.mu.Unlock()
		return
	}
	c.l.releaseLocked(c)
	c.l.mu.Unlock()
	c.l.drop(c.Conn, HandshakeTimeout, true)
}

// Close releases the connection's slot and closes it.
func (c *conn) Close() error {
	c.l.mu.Lock()
	c.l.releaseLocked(c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}

// SetDeadline passes on; with ClearedDeadlineEndsHandshake, clearing it
// ends the handshake.
func (c *conn) SetDeadline(t time.Time) error {
	if t.IsZero() && c.l.cfg.ClearedDeadlineEndsHandshake {
		c.l.set(c, active)
	}
	return c.Conn.SetDeadline(t)
}

// CloseWrite passes on to the connection's own half-close: net/http
// half-closes before hanging up on a request it did not read whole (a 431,
// 408 or 413), so that the client reads the answer and then EOF rather than
// a reset.
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// Active marks c — a connection this limiter admitted, or any wrapper of
// one (a *tls.Conn, or a wrapper with the same addresses) — as done with
// its handshake and busy: never evicted. A connection it does not know is
// ignored.
func (l *Limiter) Active(c net.Conn) {
	if nc := l.find(c); nc != nil {
		l.set(nc, active)
	}
}

// Idle marks c as waiting for its next request: it ends the handshake, and
// the connection may be evicted, the longest idle first, to make room.
func (l *Limiter) Idle(c net.Conn) {
	if nc := l.find(c); nc != nil {
		l.set(nc, idle)
	}
}

// ConnState is an http.Server's ConnState hook: a request being read or
// served (StateActive), or a hijacked connection, is active; a kept-alive
// connection between requests (StateIdle) is idle. A new connection stays
// pending until its first request, which ReadHeaderTimeout bounds.
func (l *Limiter) ConnState(c net.Conn, s http.ConnState) {
	switch s {
	case http.StateActive, http.StateHijacked:
		l.Active(c)
	case http.StateIdle:
		l.Idle(c)
	}
}

// find is the admitted connection under c: c itself, one reached by
// unwrapping NetConn (as *tls.Conn offers), or the one with c's addresses.
func (l *Limiter) find(c net.Conn) *conn {
	for x := c; x != nil; {
		if nc, ok := x.(*conn); ok {
			if nc.l == l {
				return nc
			}
			return nil
		}
		u, ok := x.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		x = u.NetConn()
	}
	lo, ok1 := addrPort(c.LocalAddr())
	ro, ok2 := addrPort(c.RemoteAddr())
	if !ok1 || !ok2 {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byEnds[ends{lo, ro}]
}

// set moves c to st (active or idle).
func (l *Limiter) set(c *conn, st state) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.st == gone || c.st == st {
		return
	}
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	if c.st != active {
		// Out of the queues; an idle one goes back in at the end, as the
		// newest.
		l.spare.remove(c)
		l.addrs[c.addr].spare.remove(c)
	}
	l.states[c.st]--
	l.states[st]++
	c.st = st
	if st == idle {
		l.spare.push(c)
		l.addrs[c.addr].spare.push(c)
	}
}

// ActiveOnFirstRead wraps inner, a listener over this limiter's (directly,
// or through tls.NewListener), so that each connection is marked Active
// when its first byte of data is read: the handshake of a protocol whose
// client speaks first and whose connections are never idle, such as
// Raft's. With TLS the first byte is the first after the handshake, so a
// peer without a certificate never becomes active.
func (l *Limiter) ActiveOnFirstRead(inner net.Listener) net.Listener {
	return &firstReadListener{Listener: inner, l: l}
}

type firstReadListener struct {
	net.Listener
	l *Limiter
}

func (ln *firstReadListener) Accept() (net.Conn, error) {
	c, err := ln.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &firstRead{Conn: c, l: ln.l}, nil
}

type firstRead struct {
	net.Conn
	l    *Limiter
	done atomic.Bool
}

func (f *firstRead) Read(b []byte) (int, error) {
	n, err := f.Conn.Read(b)
	if n > 0 && !f.done.Load() {
		f.done.Store(true)
		f.l.Active(f.Conn)
	}
	return n, err
}

// NetConn is the wrapped connection (as *tls.Conn has it).
func (f *firstRead) NetConn() net.Conn { return f.Conn }

// prefixOf is the per-address key of addr: an IPv4 address, an IPv6 /64;
// the zero prefix for an address that is not IP (every such connection
// shares one count).
func prefixOf(addr net.Addr) netip.Prefix {
	ap, ok := addrPort(addr)
	if !ok {
		return netip.Prefix{}
	}
	ip := ap.Addr().Unmap()
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	p, _ := ip.Prefix(bits)
	return p
}

// addrPort is addr as a netip.AddrPort, for TCP (and UDP) addresses.
func addrPort(addr net.Addr) (netip.AddrPort, bool) {
	switch a := addr.(type) {
	case *net.TCPAddr:
		return a.AddrPort(), true
	case *net.UDPAddr:
		return a.AddrPort(), true
	}
	return netip.AddrPort{}, false
}
