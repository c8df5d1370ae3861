package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
)

// countingEngine serves h and counts the connections it accepted.
func countingEngine(t *testing.T, h http.HandlerFunc) (string, *atomic.Int32) {
	t.Helper()
	var conns atomic.Int32
	s := httptest.NewUnstartedServer(h)
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	return strings.TrimPrefix(s.URL, "http://"), &conns
}

func newTestUpstream(t *testing.T, firstByte time.Duration) *upstream {
	t.Helper()
	u := newUpstream(time.Second, firstByte)
	t.Cleanup(u.close)
	return u
}

// get makes one request and reads its answer whole.
func get(ctx context.Context, u *upstream, addr string) (int, string, error) {
	resp, err := u.roundTrip(ctx, addr, "/v1/completions", http.Header{"Content-Type": {"application/json"}}, []byte(`{"model":"m"}`))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// TestUpstreamReuse: sized, chunked and interim (1xx) answers read to
// their end leave the connection for the next request; one the engine
// asks to close does not.
func TestUpstreamReuse(t *testing.T) {
	tests := []struct {
		name      string
		h         http.HandlerFunc
		wantConns int32
	}{
		{"sized", ok(`{"a":1}`), 1},
		{"chunked", func(w http.ResponseWriter, _ *http.Request) {
			for range 3 {
				io.WriteString(w, "data: {}\n\n")
				w.(http.Flusher).Flush()
			}
			io.WriteString(w, `{"a":1}`)
		}, 1},
		{"early hints", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Link", "</x>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			io.WriteString(w, `{"a":1}`)
		}, 1},
		{"connection close", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Connection", "close")
			io.WriteString(w, `{"a":1}`)
		}, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr, conns := countingEngine(t, tt.h)
			u := newTestUpstream(t, 5*time.Second)
			for range 3 {
				code, body, err := get(t.Context(), u, addr)
				if err != nil || code != 200 || !strings.HasSuffix(body, `{"a":1}`) {
					t.Fatalf("answer %d %q, err %v", code, body, err)
				}
			}
			if got := conns.Load(); got != tt.wantConns {
				t.Fatalf("%d connections for 3 requests, want %d", got, tt.wantConns)
			}
		})
	}
}

// TestUpstreamUnreadBodyCutsConnection: an answer closed before its end
// is not left on a connection another request would read.
func TestUpstreamUnreadBodyCutsConnection(t *testing.T) {
	addr, conns := countingEngine(t, ok(strings.Repeat("x", 64<<10)))
	u := newTestUpstream(t, 5*time.Second)
	resp, err := u.roundTrip(t.Context(), addr, "/", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := resp.Body.Read(make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if code, body, err := get(t.Context(), u, addr); err != nil || code != 200 || len(body) != 64<<10 {
		t.Fatalf("answer %d, %d bytes, err %v", code, len(body), err)
	}
	if got := conns.Load(); got != 2 {
		t.Fatalf("%d connections, want 2", got)
	}
}

// rawEngine answers every request on a connection with a sized 200,
// then closes the connection after closeAfter answers, without saying
// so: an engine's idle timeout, as the client sees it.
func rawEngine(t *testing.T, closeAfter int, delay time.Duration) (string, *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns atomic.Int32
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			wg.Go(func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for range closeAfter {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
				}
				time.Sleep(delay)
			})
		}
	})
	return ln.Addr().String(), &conns
}

// TestUpstreamStaleConnection: a kept-alive connection the engine closed
// while it was idle costs the next request nothing, whether the close is
// seen before the request is written (the liveness check), or only after
// (the retry on a new connection): because it came as the request was
// written, or because the connection was used too recently to be checked.
func TestUpstreamStaleConnection(t *testing.T) {
	for _, tt := range []struct {
		name  string
		delay time.Duration // how long the engine holds the connection open after its last answer
		wait  bool          // the next request comes once the close has arrived
		trust time.Duration // upstream.trustIdle
	}{
		{"closed before the next request, checked", 0, true, 0},
		{"closed before the next request, trusted", 0, true, time.Hour},
		{"closed as the next request is written", 50 * time.Millisecond, false, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			addr, conns := rawEngine(t, 1, tt.delay)
			u := newTestUpstream(t, 5*time.Second)
			u.trustIdle = tt.trust
			for i := range 3 {
				if code, body, err := get(t.Context(), u, addr); err != nil || code != 200 || body != "{}" {
					t.Fatalf("request %d: answer %d %q, err %v", i, code, body, err)
				}
				if tt.wait {
					testkit.Wait(t, "the engine's close to reach the idle connection", func() bool { return closedIdle(u, addr) })
				}
			}
			if got := conns.Load(); got < 3 {
				t.Fatalf("%d connections for 3 requests on one-answer connections", got)
			}
		})
	}
}

// TestUpstreamTrustsRecentConnections: a connection idle for less than
// trustIdle is reused without the liveness check's system call; one idle
// longer is checked first.
func TestUpstreamTrustsRecentConnections(t *testing.T) {
	addr, conns := countingEngine(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "{}") })
	u := newTestUpstream(t, 5*time.Second)
	// A clock ahead of the real one by skew (it also sets the engine
	// connection's deadlines, which must stay in the future), and bounds
	// in hours, so that however slow the machine, the real time between
	// requests is nothing beside them.
	var skew time.Duration
	u.now = func() time.Time { return time.Now().Add(skew) }
	u.trustIdle, u.idleTimeout = time.Hour, 24*time.Hour
	peeks := 0
	for i, tt := range []struct {
		idle  time.Duration // since the last answer
		peeks int           // liveness checks so far
	}{
		{0, 0},
		{30 * time.Minute, 0},
		{time.Hour, 1},
		{3 * time.Hour, 2},
	} {
		skew += tt.idle
		if i == 1 { // the one connection, counted from now on
			u.mu.Lock()
			c := u.idle[addr][0]
			if peek := c.peek; peek != nil {
				c.peek = func(fd uintptr) bool { peeks++; return peek(fd) }
			}
			u.mu.Unlock()
		}
		if code, body, err := get(t.Context(), u, addr); err != nil || code != 200 || body != "{}" {
			t.Fatalf("request %d: answer %d %q, err %v", i, code, body, err)
		}
		if peeks != tt.peeks {
			t.Errorf("request %d, idle %s: %d liveness checks so far, want %d", i, tt.idle, peeks, tt.peeks)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections, want 1 reused", n)
	}
}

// closedIdle reports whether addr's idle connection fails the liveness
// check (and leaves it idle).
func closedIdle(u *upstream, addr string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	l := u.idle[addr]
	return len(l) > 0 && !l[len(l)-1].alive()
}

// TestUpstreamClientGone: a client that goes away cuts the engine's
// request, while waiting for the head and in the middle of a stream.
func TestUpstreamClientGone(t *testing.T) {
	for _, midStream := range []bool{false, true} {
		reached, gone := make(chan struct{}), make(chan struct{})
		addr, _ := countingEngine(t, func(w http.ResponseWriter, r *http.Request) {
			if midStream {
				io.WriteString(w, "data: {}\n\n")
				w.(http.Flusher).Flush()
			}
			close(reached)
			<-r.Context().Done() // the connection was cut
			close(gone)
		})
		u := newTestUpstream(t, 5*time.Second)
		ctx, cancel := context.WithCancel(t.Context())
		errc := make(chan error, 1)
		go func() {
			resp, err := u.roundTrip(ctx, addr, "/", nil, nil)
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			errc <- err
		}()
		// The client leaves once the request reached the engine (a cut
		// before that is a request the engine never saw).
		select {
		case <-reached:
		case err := <-errc:
			t.Fatalf("midStream %v: the request ended before the engine had it: %v", midStream, err)
		case <-time.After(30 * time.Second):
			t.Fatalf("midStream %v: the request did not reach the engine", midStream)
		}
		cancel()
		select {
		case err := <-errc:
			if err == nil {
				t.Fatalf("midStream %v: no error after the client left", midStream)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("midStream %v: the request outlived its client", midStream)
		}
		select {
		case <-gone:
		case <-time.After(30 * time.Second):
			t.Fatalf("midStream %v: the engine never saw the connection cut", midStream)
		}
	}
}

// TestUpstreamFirstByteTimeout: an engine that sends no head within
// FirstByteTimeout fails the attempt; once the head came, a long body
// is not cut.
func TestUpstreamFirstByteTimeout(t *testing.T) {
	release := make(chan struct{})
	addr, _ := countingEngine(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow-head" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		w.(http.Flusher).Flush()
		time.Sleep(150 * time.Millisecond)
		io.WriteString(w, "end")
	})
	defer close(release)
	u := newTestUpstream(t, 50*time.Millisecond)
	_, err := u.roundTrip(t.Context(), addr, "/slow-head", nil, nil)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("err %v, want a timeout", err)
	}
	code, body, err := get(t.Context(), u, addr)
	if err != nil || code != 200 || body != "end" {
		t.Fatalf("slow body: %d %q %v", code, body, err)
	}
}

// TestUpstreamIdleExpiry: connections idle past the idle timeout are
// closed by the sweep, and by the next request that finds them.
func TestUpstreamIdleExpiry(t *testing.T) {
	addr, conns := countingEngine(t, ok(`{}`))
	u := newTestUpstream(t, time.Second)
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	u.now = func() time.Time { return time.Unix(0, now.Load()) }
	if _, _, err := get(t.Context(), u, addr); err != nil {
		t.Fatal(err)
	}
	now.Add(int64(u.idleTimeout))
	if _, _, err := get(t.Context(), u, addr); err != nil {
		t.Fatal(err)
	}
	if got := conns.Load(); got != 2 {
		t.Fatalf("%d connections, want 2: the expired one was reused", got)
	}
	now.Add(int64(u.idleTimeout))
	u.sweepIdle()
	u.mu.Lock()
	n := len(u.idle)
	u.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d addresses with idle connections after the sweep", n)
	}
}

// TestUpstreamBoundsTheHead: an engine whose answer's head never ends, or
// that sends interim answers without end, gets an error naming the bound
// rather than the router's memory.
func TestUpstreamBoundsTheHead(t *testing.T) {
	tests := []struct {
		name string
		head func(w io.Writer)
		want string
	}{
		{"endless header", func(w io.Writer) {
			_, _ = io.WriteString(w, "HTTP/1.1 200 OK\r\n")
			line := "X-Pad: " + strings.Repeat("a", 1000) + "\r\n"
			for range 2 * maxResponseHead / len(line) {
				if _, err := io.WriteString(w, line); err != nil {
					return
				}
			}
		}, "head is over"},
		{"endless 1xx", func(w io.Writer) {
			for range 2 * maxInterim {
				if _, err := io.WriteString(w, "HTTP/1.1 103 Early Hints\r\n\r\n"); err != nil {
					return
				}
			}
		}, "interim"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				_, _ = bufio.NewReader(c).ReadString('\n') // the request line
				tt.head(c)
			}()
			t.Cleanup(func() { ln.Close(); <-done })
			u := newTestUpstream(t, 5*time.Second)
			_, _, err = get(context.Background(), u, ln.Addr().String())
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one containing %q", err, tt.want)
			}
		})
	}
}
