package router

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
)

// startRouter serves a router on loopback in front of one engine (demo-0),
// with cfg changed by mutate, and returns its address once demo-0 is
// routable. The engine's /metrics reports it idle; every other request goes
// to engine. Cleanup stops the router and checks that Serve returned.
func startRouter(t *testing.T, engine http.HandlerFunc, mutate func(*Config)) string {
	t.Helper()
	_, addr := startTestRouter(t, engine, mutate)
	return addr
}

// startTestRouter is startRouter that also returns the router, for tests
// that read its registry.
func startTestRouter(t *testing.T, engine http.HandlerFunc, mutate func(*Config)) (*Router, string) {
	t.Helper()
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			io.WriteString(w, "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")
			return
		}
		engine(w, r)
	}))
	t.Cleanup(eng.Close)
	cfg := DefaultConfig()
	cfg.ID = "r-test"
	cfg.Control = []string{control(t, strings.TrimPrefix(eng.URL, "http://"))}
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.OpsAddr = "127.0.0.1:0"
	cfg.ScrapeInterval = 20 * time.Millisecond
	mutate(&cfg)
	r, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	addr := serveRouter(t, r)
	testkit.Wait(t, "demo-0 to become routable", func() bool {
		eps, _ := r.eps.Lookup("demo")
		return len(eps) > 0 && r.ready()
	})
	return r, addr
}

// serveRouter serves r's API on a loopback port of its own until the test
// ends, and returns the port's address; cleanup checks that Serve
// returned, without error, once its context ended.
func serveRouter(t *testing.T, r *Router) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after its context ended")
		}
	})
	return ln.Addr().String()
}

// newClient is an HTTP client of its own, so no connection outlives the test.
func newClient(t *testing.T) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

const completion = `{"model":"demo","messages":[]}`

// errorCode is the code of an OpenAI error body, "" when body is not one.
func errorCode(body []byte) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil {
		return ""
	}
	return e.Error.Code
}

// dial opens a raw connection that fails the test's reads after 10 s.
func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

// TestBodyTimeout: a body that stops arriving is cut at the body timeout
// with a 408, while an answer streaming for longer than the timeout, after
// its body came, is not (the deadline is lifted once the body is read, and
// the next request on the connection has its own).
func TestBodyTimeout(t *testing.T) {
	const timeout = 200 * time.Millisecond
	addr := startRouter(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		select { // longer than the body timeout: the answer must outlive it
		case <-time.After(3 * timeout):
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "data: [DONE]\n\n")
	}, func(c *Config) { c.BodyTimeout = timeout })

	t.Run("slow body", func(t *testing.T) {
		c := dial(t, addr)
		start := time.Now()
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
			len(completion), completion[:10])
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("no answer to a body that stopped (%v after %s)", err, time.Since(start))
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusRequestTimeout || errorCode(body) != "request_timeout" {
			t.Fatalf("status %d body %s, want 408 request_timeout", resp.StatusCode, body)
		}
		if took := time.Since(start); took < timeout {
			t.Fatalf("cut after %s, before the %s timeout", took, timeout)
		}
	})
	t.Run("long answer", func(t *testing.T) {
		client := newClient(t)
		for i := range 2 { // the second on the same connection: the deadline was the first request's only
			resp, err := client.Post("http://"+addr+"/v1/chat/completions", "application/json",
				strings.NewReader(`{"model":"demo","stream":true,"messages":[]}`))
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || string(body) != "data: one\n\ndata: [DONE]\n\n" {
				t.Fatalf("request %d: stream = %q, %v; want it whole", i, body, err)
			}
		}
	})
}

// TestHeaderLimits: too many header fields, or too many bytes of them, get
// a 431 (in OpenAI's shape where the router's handler answers) and never
// reach the engine; a request within both limits goes through.
func TestHeaderLimits(t *testing.T) {
	var reached atomic.Int32
	addr := startRouter(t, func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		io.WriteString(w, `{"ok":true}`)
	}, func(c *Config) {})
	many := func(n int) http.Header {
		h := http.Header{}
		for i := range n {
			h.Set(fmt.Sprintf("X-H-%d", i), "v")
		}
		return h
	}
	big := func(n int) http.Header { return http.Header{"X-Big": {strings.Repeat("a", n)}} }
	tests := []struct {
		name     string
		header   http.Header
		want     int
		wantCode string // "" for any body; "-" for one not in OpenAI's shape
	}{
		{"within", many(90), 200, ""},
		{"too many", many(101), 431, "headers_too_large"},
		{"over the bytes, within Go's slack", big(65 << 10), 431, "headers_too_large"},
		// Go's server refuses it at --max-header-bytes, before any handler:
		// its plain 431 shows the rest was never read.
		{"far over the bytes", big(512 << 10), 431, "-"},
	}
	client := newClient(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := reached.Load()
			req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(completion))
			req.Header = tt.header
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			// Read to the end: Go's plain 431 has no length, so this
			// needs the server's half-close (limitConn.CloseWrite), not
			// the reset of a close over the unread headers.
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatalf("reading the %d answer: %v", resp.StatusCode, err)
			}
			code := errorCode(body)
			if tt.wantCode == "-" && code == "" {
				code = "-"
			}
			if resp.StatusCode != tt.want || (tt.wantCode != "" && code != tt.wantCode) {
				t.Fatalf("status %d body %.200s, want %d %s", resp.StatusCode, body, tt.want, tt.wantCode)
			}
			if got := reached.Load() - before; (tt.want == 200) != (got == 1) {
				t.Fatalf("the engine saw %d requests", got)
			}
		})
	}
}

// TestEngineNeverSeesCredentials: the client's Authorization, Cookie and
// Proxy-Authorization stay at the router; its other headers go on.
func TestEngineNeverSeesCredentials(t *testing.T) {
	seen := make(chan http.Header, 1)
	addr := startRouter(t, func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
		io.WriteString(w, `{"ok":true}`)
	}, func(c *Config) {})
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(completion))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk-secret")
	req.Header.Set("Cookie", "session=secret")
	req.Header.Set("Proxy-Authorization", "Basic c2VjcmV0")
	req.Header.Set("X-Keep", "1")
	resp, err := newClient(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	h := <-seen
	for _, k := range []string{"Authorization", "Cookie", "Proxy-Authorization"} {
		if v := h.Get(k); v != "" {
			t.Errorf("the engine saw %s: %q", k, v)
		}
	}
	if h.Get("X-Keep") != "1" {
		t.Errorf("the engine did not see the client's other headers: %v", h)
	}
}

// TestInflightLimit: beyond --max-inflight a request gets a 503 with
// Retry-After at once, /healthz still answers, and the request being served
// completes; once it has, the next is served.
func TestInflightLimit(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	addr := startRouter(t, func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			close(started)
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		io.WriteString(w, `{"ok":true}`)
	}, func(c *Config) { c.MaxInflight = 1 })
	client := newClient(t)
	post := func() (*http.Response, []byte, error) {
		resp, err := client.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(completion))
		if err != nil {
			return nil, nil, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp, body, err
	}
	type result struct {
		resp *http.Response
		body []byte
		err  error
	}
	first := make(chan result, 1)
	go func() { resp, body, err := post(); first <- result{resp, body, err} }()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("the first request never reached the engine")
	}

	resp, body, err := post()
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" || errorCode(body) != "router_overloaded" {
		close(release)
		<-first
		t.Fatalf("beyond the limit: %v %v %s; want 503 router_overloaded with Retry-After: 1", err, resp, body)
	}
	hz, err := client.Get("http://" + addr + "/healthz")
	if err != nil || hz.StatusCode != 200 {
		t.Errorf("/healthz at the limit: %v %v", err, hz)
	}
	if hz != nil {
		hz.Body.Close()
	}
	// A request refused while its body is still being sent gets its 503 at
	// once, its connection closed, not once the server read the rest.
	if err := slowUploadAnswer(addr, http.StatusServiceUnavailable); err != nil {
		t.Error(err)
	}

	close(release)
	select {
	case r := <-first:
		if r.err != nil || r.resp.StatusCode != 200 {
			t.Fatalf("the request being served: %v %v %s", r.err, r.resp, r.body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the request being served did not complete")
	}
	if resp, body, err := post(); err != nil || resp.StatusCode != 200 {
		t.Fatalf("after the first completed: %v %v %s", err, resp, body)
	}
}

// TestConnectionTimeouts: a client trickling its headers, and a kept-alive
// connection left idle, are closed at their timeouts rather than held.
func TestConnectionTimeouts(t *testing.T) {
	const timeout = 200 * time.Millisecond
	addr := startRouter(t, func(w http.ResponseWriter, r *http.Request) {}, func(c *Config) {
		c.ReadHeaderTimeout = timeout
		c.IdleTimeout = timeout
	})
	tests := []struct {
		name string
		send string // then nothing more
		want string // the start of what the router sends before closing
	}{
		{"headers never end", "GET /healthz HTTP/1.1\r\nHost: r\r\nX-Slow: ", ""},
		{"idle after a request", "GET /healthz HTTP/1.1\r\nHost: r\r\n\r\n", "HTTP/1.1 200 OK"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// From before the dial: the router's clock starts once it has
			// accepted, which may be before the dial returns here.
			start := time.Now()
			c := dial(t, addr) // reads fail after 10 s: the router must close first
			if _, err := io.WriteString(c, tt.send); err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(c)
			if err != nil {
				t.Fatalf("connection still open after %s (%v); got %q", time.Since(start), err, got)
			}
			if !strings.HasPrefix(string(got), tt.want) {
				t.Fatalf("got %q, want it to start %q", got, tt.want)
			}
			if took := time.Since(start); took < timeout {
				t.Fatalf("closed after %s, before the %s timeout", took, timeout)
			}
		})
	}
}

// slowUploadAnswer sends a request with half its body to addr and checks
// that it is answered want, closing the connection, before the rest.
func slowUploadAnswer(addr string, want int) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	_, _ = io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 1000\r\n\r\n{\"model\":")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return fmt.Errorf("no answer while the body is being sent: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != want || !resp.Close {
		return fmt.Errorf("%s (close %v) while the body is being sent, want %d closing the connection", resp.Status, resp.Close, want)
	}
	return nil
}
