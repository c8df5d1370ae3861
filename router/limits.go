package router

import (
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/llmgw/llmgw/router/openai"
)

// This file bounds what clients can hold of a router (design §11): each
// connection's time (header read, body read, idle), the size and number of
// a request's headers, the connections open and the requests served at
// once. Without them a few thousand slow or idle connections, or half-sent
// uploads, hold the router's memory and file descriptors for as long as
// the clients like.

// limitListener accepts at most n connections at a time: past that, Accept
// waits for one to close, so the extra connections wait in the kernel's
// backlog (and time out there) while the ones accepted are served. It is
// golang.org/x/net/netutil's LimitListener, written out so Close also
// ends an Accept waiting for room.
type limitListener struct {
	net.Listener
	room      chan struct{} // a token per open connection
	closed    chan struct{}
	closeOnce sync.Once
}

func newLimitListener(ln net.Listener, n int) *limitListener {
	return &limitListener{Listener: ln, room: make(chan struct{}, n), closed: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.room <- struct{}{}:
	case <-l.closed:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.room
		return nil, err
	}
	return &limitConn{Conn: c, release: sync.OnceFunc(func() { <-l.room })}, nil
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// limitConn gives its listener's token back when closed, once.
type limitConn struct {
	net.Conn
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}

// CloseWrite passes on to the connection's own half-close. Go's server
// half-closes before hanging up on a request it did not read whole (a
// 431 for headers past --max-header-bytes, a 408 or 413 for a body), so
// the client reads the answer and then EOF; on a connection without it
// the server's close, over the unread bytes, resets the connection and
// the client may get "connection reset" instead of the answer's end.
func (c *limitConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// limits is the handler in front of the router's mux: it refuses, before
// anything reads the body, a request with too many or too large headers
// (431) and one beyond the in-flight limit (503 with Retry-After), and
// puts the body timeout on the body's read.
//
// http.Server has no body timeout of its own (ReadTimeout covers headers
// and body together, and WriteTimeout would cut long streams), hence the
// deadline set here per request.
type limits struct {
	next        http.Handler
	headerCount int
	headerBytes int
	bodyTimeout time.Duration
	inflight    chan struct{} // a token per request being served
}

func newLimits(cfg Config, next http.Handler) *limits {
	return &limits{next: next, headerCount: cfg.MaxHeaderCount, headerBytes: cfg.MaxHeaderBytes,
		bodyTimeout: cfg.BodyTimeout, inflight: make(chan struct{}, cfg.MaxInflight)}
}

// counted tells whether a request counts against the in-flight limit:
// the probes do not, since a router busy to its limit is alive and its load
// balancer must still see it. (Prometheus reads the operations port, which
// this limit does not cover.)
func counted(path string) bool {
	switch path {
	case "/healthz", "/readyz":
		return false
	}
	return true
}

func (l *limits) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if e := l.checkHeaders(r.Header); e != nil {
		w.Header().Set("Connection", "close")
		openai.WriteError(w, e)
		return
	}
	if counted(r.URL.Path) {
		select {
		case l.inflight <- struct{}{}:
			defer func() { <-l.inflight }()
		default:
			if r.ContentLength != 0 {
				// Go's server would read the rest of the unread body before
				// sending the answer: a slow upload would wait for its 503
				// as long as it takes to send. Closing answers at once.
				w.Header().Set("Connection", "close")
			}
			openai.WriteError(w, openai.Overloaded(cap(l.inflight), 1))
			return
		}
	}
	if r.Body != nil && r.Body != http.NoBody {
		// The deadline is the body's alone: Go's server lifts it once the
		// body's end has been read (to watch for the client going away), so
		// it never cuts the answer; a handler that stops reading early
		// leaves it to bound the server's read of the rest. A read past it
		// fails with os.ErrDeadlineExceeded, which the API answers with 408.
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(l.bodyTimeout))
	}
	l.next.ServeHTTP(w, r)
}

// checkHeaders counts every header line and its bytes (name, ": ", value,
// CRLF). Go's server already refuses more than MaxHeaderBytes (plus its
// 4 KiB of slack) with a plain 431; this answers the rest in OpenAI's shape
// and bounds the count, which Go does not.
func (l *limits) checkHeaders(h http.Header) *openai.Error {
	count, size := 0, 0
	for k, vs := range h {
		count += len(vs)
		for _, v := range vs {
			size += len(k) + len(v) + 4
		}
	}
	switch {
	case count > l.headerCount:
		return openai.HeadersTooLarge("more than " + strconv.Itoa(l.headerCount) + " header fields")
	case size > l.headerBytes:
		return openai.HeadersTooLarge("more than " + strconv.Itoa(l.headerBytes) + " bytes of headers")
	}
	return nil
}
