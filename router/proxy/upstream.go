package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// upstream is the proxy's HTTP/1.1 client to engines: keep-alive
// connections per engine address, each request written and its answer
// read on the calling request's own goroutine.
//
// It exists for latency. net/http's Transport hands every request to a
// pair of goroutines per connection (a write loop and a read loop) and
// back, so each request waits for two goroutine wake-ups, and on a busy
// machine each wake-up may wait for a timeslice; that was most of what
// the router added over nginx at the tail (docs/benchmarks.md, issue 15).
// Engines are reached over plain HTTP/1.1 only (the address of an
// endpoint is host:port, never a URL with a scheme), and the body is
// always in memory, so what remains of a client is small: the request
// head and body in one write, the answer parsed by net/http's own
// http.ReadResponse (status line, headers, chunked and sized bodies,
// trailers), and the connection pool.
//
// It keeps what the Transport gave the proxy: a client that goes away
// cancels the engine's request (its connection is cut), ConnectTimeout
// bounds the dial, FirstByteTimeout the wait for the answer's headers,
// idle connections are dropped after idleTimeout and at Close, at most
// maxIdle per address are kept, and a connection the engine closed while
// it was idle is not used (checked before reuse once it has been idle for
// trustIdle; a reused one that fails before its first byte is retried
// once on a new connection, the race every keep-alive client has with a
// server's idle timeout).
type upstream struct {
	dialer      net.Dialer
	firstByte   time.Duration
	idleTimeout time.Duration
	maxIdle     int
	// trustIdle is how long a connection may have been idle and still be
	// reused without the liveness check. The check is a system call per
	// request (a non-blocking peek at the socket); an engine closes an
	// idle kept-alive connection after seconds (uvicorn's and so vLLM's
	// timeout is 5 s, nginx's 75 s), so a connection used within the last
	// second is nearly always open, and in the rare case it is not (the
	// engine restarted) the write or the wait for the first byte fails and
	// the request is retried on a new connection, as after a close the
	// check could not have seen.
	trustIdle time.Duration
	now       func() time.Time

	mu     sync.Mutex
	idle   map[string][]*upConn // per address, the most recently used last
	closed bool
	sweep  *time.Timer // armed while any connection is idle
	armed  bool
}

func newUpstream(connect, firstByte time.Duration) *upstream {
	return &upstream{
		dialer:      net.Dialer{Timeout: connect, KeepAlive: 30 * time.Second},
		firstByte:   firstByte,
		idleTimeout: 90 * time.Second,
		maxIdle:     64,
		trustIdle:   time.Second,
		now:         time.Now,
		idle:        map[string][]*upConn{},
	}
}

// upConn is one connection to an engine.
type upConn struct {
	addr   string
	nc     net.Conn
	raw    syscall.RawConn // nil when the connection has none: no liveness check
	br     *bufio.Reader
	lim    headLimit // what br reads: nc, bounded while an answer's head is read
	head   []byte    // the request head (and a small body), reused
	idleAt time.Time
	// peek is c.peekFn, bound once so the liveness check allocates nothing.
	peek   func(fd uintptr) bool
	peekOK bool
}

// longAgo is a deadline in the past: it makes a blocked read or write
// return at once.
var longAgo = time.Unix(1, 0)

// errUpstreamClosed is a request made after Close.
var errUpstreamClosed = errors.New("proxy: upstream client closed")

// roundTrip sends a POST of body to addr at uri with the header h (less
// what dropped refuses) and returns the engine's answer once its headers
// arrived. The answer's Body must be closed: it returns the connection to
// the pool when the body was read to its end, and cuts it otherwise. ctx
// is the client's request: once it is done the connection is cut, which
// fails whatever read or write is under way.
func (u *upstream) roundTrip(ctx context.Context, addr, uri string, h http.Header, body []byte) (*http.Response, error) {
	for fresh := false; ; fresh = true {
		c, reused, err := u.conn(ctx, addr, fresh)
		if err != nil {
			return nil, err
		}
		if sp := trace.SpanFromContext(ctx); sp.IsRecording() { // the attempt's span (design §9 "Tracing")
			sp.AddEvent("llmgw.connected", trace.WithAttributes(attribute.Bool("llmgw.reused", reused)))
		}
		resp, err := u.exchange(ctx, c, uri, h, body)
		if err == nil {
			return resp, nil
		}
		_ = c.nc.Close()
		if !reused || ctx.Err() != nil || !errors.Is(err, errBeforeFirstByte) {
			return nil, err
		}
		// A kept-alive connection the engine closed as it was taken:
		// nothing reached the engine's handler, so once more, anew.
	}
}

// errBeforeFirstByte marks a failure of a write, or of the wait for the
// answer's first byte, that is not a timeout: the engine closed or reset
// the connection.
var errBeforeFirstByte = errors.New("connection closed before the answer")

// exchange writes the request on c and reads the answer's head.
func (u *upstream) exchange(ctx context.Context, c *upConn, uri string, h http.Header, body []byte) (*http.Response, error) {
	// The client going away cuts the connection; stop tells whether that
	// already happened (then the connection is never reused).
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetDeadline(longAgo) })
	if u.firstByte > 0 {
		// Over the write too: an engine that reads nothing fails as one
		// that answers nothing.
		_ = c.nc.SetDeadline(u.now().Add(u.firstByte))
	}
	if err := c.write(uri, h, body); err != nil {
		stop()
		return nil, classify(err)
	}
	// The answer's head is a peer's input: bounded before it is read, as
	// the Transport bounds it (MaxResponseHeaderBytes), and so is the
	// number of interim answers before the real one.
	c.lim.n = maxResponseHead
	defer func() { c.lim.n = -1 }()
	if _, err := c.br.Peek(1); err != nil {
		stop()
		return nil, classify(err)
	}
	resp, err := http.ReadResponse(c.br, nil)
	// 1xx answers are interim (the request has no Expect, but 103 Early
	// Hints may come): the answer is the next one.
	for n := 0; err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200; n++ {
		if n == maxInterim {
			err = fmt.Errorf("more than %d interim (1xx) answers", maxInterim)
			break
		}
		resp, err = http.ReadResponse(c.br, nil)
	}
	if err != nil {
		stop()
		return nil, fmt.Errorf("read the answer's head: %w", err)
	}
	if u.firstByte > 0 {
		_ = c.nc.SetDeadline(time.Time{})
		if ctx.Err() != nil { // gone between the head and the line above
			_ = c.nc.SetDeadline(longAgo)
		}
	}
	resp.Body = &upBody{u: u, c: c, src: resp.Body, stop: stop, keep: !resp.Close}
	return resp, nil
}

// maxResponseHead bounds an answer's head (status line and header fields,
// interim answers included) as read from an engine; maxInterim the interim
// answers before the final one (the Transport allows 5).
const (
	maxResponseHead = 1 << 20
	maxInterim      = 5
)

// errHeadTooLarge is what reading past maxResponseHead returns.
var errHeadTooLarge = fmt.Errorf("the answer's head is over %d bytes", maxResponseHead)

// headLimit is a connection as its bufio.Reader reads it: while n ≥ 0, at
// most n more bytes, then errHeadTooLarge; n < 0 is no bound (the body,
// which the proxy streams through, keeping only a bounded tail).
type headLimit struct {
	nc net.Conn
	n  int64
}

func (l *headLimit) Read(p []byte) (int, error) {
	if l.n < 0 {
		return l.nc.Read(p)
	}
	if l.n == 0 {
		return 0, errHeadTooLarge
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.nc.Read(p)
	l.n -= int64(n)
	return n, err
}

// classify marks what failed before the answer's first byte and was not
// a timeout (errBeforeFirstByte), so a reused connection may be retried.
func classify(err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return err
	}
	return fmt.Errorf("%w: %w", errBeforeFirstByte, err)
}

// inlineBody bounds the bodies copied behind the request head, sent in
// one write; larger ones go in a second buffer of the same writev.
const inlineBody = 64 << 10

// write sends the request: the request line, Host, the client's header
// fields less those dropped (and Host, Expect: the body is at hand),
// Content-Length, then the body.
func (c *upConn) write(uri string, h http.Header, body []byte) error {
	b := append(c.head[:0], "POST "...)
	b = append(b, uri...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, c.addr...)
	b = append(b, "\r\n"...)
	agent := false
	for k, vs := range h {
		if dropped(k) || k == "Host" || k == "Expect" {
			continue
		}
		agent = agent || k == "User-Agent"
		for _, v := range vs {
			b = append(b, k...)
			b = append(b, ": "...)
			b = appendValue(b, v)
			b = append(b, "\r\n"...)
		}
	}
	if !agent {
		b = append(b, "User-Agent: Go-http-client/1.1\r\n"...) // what the Transport sent
	}
	b = append(b, "Content-Length: "...)
	b = strconv.AppendInt(b, int64(len(body)), 10)
	b = append(b, "\r\n\r\n"...)
	var err error
	if len(body) <= inlineBody {
		b = append(b, body...)
		_, err = c.nc.Write(b)
	} else {
		bufs := net.Buffers{b, body}
		_, err = bufs.WriteTo(c.nc)
	}
	if cap(b) <= 2*inlineBody {
		c.head = b[:0]
	}
	if err != nil {
		return fmt.Errorf("write the request: %w", err)
	}
	return nil
}

// appendValue appends a header value as net/http writes one: CR and LF
// become spaces (the server that parsed it let none through; this keeps
// it so), leading and trailing blanks go.
func appendValue(b []byte, v string) []byte {
	i, j := 0, len(v)
	for i < j && (v[i] == ' ' || v[i] == '\t') {
		i++
	}
	for j > i && (v[j-1] == ' ' || v[j-1] == '\t') {
		j--
	}
	for k := i; k < j; k++ {
		ch := v[k]
		if ch == '\r' || ch == '\n' {
			ch = ' '
		}
		b = append(b, ch)
	}
	return b
}

// conn returns an idle connection to addr that is still open (reused),
// or a new one; fresh skips the idle ones.
func (u *upstream) conn(ctx context.Context, addr string, fresh bool) (*upConn, bool, error) {
	now := u.now()
	for !fresh {
		c, err := u.take(addr, now)
		if err != nil {
			return nil, false, err
		}
		if c == nil {
			break
		}
		if now.Sub(c.idleAt) < u.trustIdle && c.br.Buffered() == 0 || c.alive() {
			return c, true, nil
		}
		_ = c.nc.Close()
	}
	nc, err := u.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, false, fmt.Errorf("dial: %w", err)
	}
	c := &upConn{addr: addr, nc: nc, lim: headLimit{nc: nc, n: -1}}
	c.br = bufio.NewReaderSize(&c.lim, 4<<10)
	if sc, ok := nc.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			c.raw = raw
			c.peek = c.peekFn
		}
	}
	return c, false, nil
}

// take pops addr's most recently used idle connection, closing those
// idle for too long at now; nil when none is left.
func (u *upstream) take(addr string, now time.Time) (*upConn, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return nil, errUpstreamClosed
	}
	l := u.idle[addr]
	for len(l) > 0 {
		c := l[len(l)-1]
		l[len(l)-1] = nil
		l = l[:len(l)-1]
		if now.Sub(c.idleAt) < u.idleTimeout {
			u.idle[addr] = l
			return c, nil
		}
		_ = c.nc.Close() // the oldest are first: all that is left is older
		for _, old := range l {
			_ = old.nc.Close()
		}
		l = l[:0]
	}
	if l != nil {
		delete(u.idle, addr)
	}
	return nil, nil
}

// put keeps c for the next request to its address.
func (u *upstream) put(c *upConn) {
	c.idleAt = u.now()
	u.mu.Lock()
	if u.closed || len(u.idle[c.addr]) >= u.maxIdle {
		u.mu.Unlock()
		_ = c.nc.Close()
		return
	}
	u.idle[c.addr] = append(u.idle[c.addr], c)
	if !u.armed {
		u.armed = true
		if u.sweep == nil {
			u.sweep = time.AfterFunc(u.idleTimeout, u.sweepIdle)
		} else {
			u.sweep.Reset(u.idleTimeout)
		}
	}
	u.mu.Unlock()
}

// sweepIdle closes the connections idle for idleTimeout, so those to
// engines no longer asked do not stay open; it runs again while any
// connection is idle.
func (u *upstream) sweepIdle() {
	now := u.now()
	var gone []*upConn
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		return
	}
	for addr, l := range u.idle {
		k := 0
		for k < len(l) && now.Sub(l[k].idleAt) >= u.idleTimeout {
			k++
		}
		gone = append(gone, l[:k]...)
		if k == len(l) {
			delete(u.idle, addr)
		} else if k > 0 {
			u.idle[addr] = append(l[:0], l[k:]...)
		}
	}
	u.armed = len(u.idle) > 0
	if u.armed {
		u.sweep.Reset(u.idleTimeout)
	}
	u.mu.Unlock()
	for _, c := range gone {
		_ = c.nc.Close()
	}
}

// close drops every idle connection; requests after it fail.
func (u *upstream) close() {
	u.mu.Lock()
	u.closed = true
	if u.sweep != nil {
		u.sweep.Stop()
	}
	idle := u.idle
	u.idle = map[string][]*upConn{}
	u.mu.Unlock()
	for _, l := range idle {
		for _, c := range l {
			_ = c.nc.Close()
		}
	}
}

// alive reports whether an idle connection may carry a request: the
// engine has neither closed it nor sent anything unasked (nothing is
// buffered, nothing waits in the socket). A connection without a raw
// descriptor is taken on trust.
func (c *upConn) alive() bool {
	if c.br.Buffered() > 0 {
		return false
	}
	if c.raw == nil {
		return true
	}
	c.peekOK = false
	if err := c.raw.Read(c.peek); err != nil {
		return false
	}
	return c.peekOK
}

// upBody is an answer's body: it remembers whether it was read to its
// end, so Close knows whether the connection can carry another request.
type upBody struct {
	u    *upstream
	c    *upConn
	src  io.ReadCloser // http.ReadResponse's body; never closed (that would drain it)
	stop func() bool
	keep bool // the engine did not ask to close
	eof  bool
	done bool
}

func (b *upBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, http.ErrBodyReadAfterClose
	}
	n, err := b.src.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

// Close keeps the connection for the next request when the body ended
// and the client's context never cut it; otherwise the connection is
// closed, which also ends the engine's work on an unfinished answer.
func (b *upBody) Close() error {
	if b.done {
		return nil
	}
	b.done = true
	if b.stop() && b.eof && b.keep {
		b.u.put(b.c)
		return nil
	}
	return b.c.nc.Close()
}
