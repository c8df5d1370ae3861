package router

import (
	"net/http"
	"strconv"
	"time"

	"github.com/llmgw/llmgw/router/openai"
)

// This file bounds what clients can hold of a router (design §11): each
// connection's time (header read, body read, idle), the size and number of
// a request's headers and the requests served at once; conns.go bounds the
// connections open. Without them a few thousand slow or idle connections, or half-sent
// uploads, hold the router's memory and file descriptors for as long as
// the clients like.

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
		openai.WriteErrorAt(w, r.URL.Path, e)
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
			openai.WriteErrorAt(w, r.URL.Path, openai.Overloaded(cap(l.inflight), 1))
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
// 4 KiB of slack) with a plain 431; this answers the rest in the API's
// error shape and bounds the count, which Go does not.
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
