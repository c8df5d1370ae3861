package router

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testkit"
)

// client is a raw keep-alive connection from a loopback address of the
// test's choosing (127.0.0.x are all loopback: another client's address).
type client struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func connect(t *testing.T, from, addr string) *client {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &client{t: t, c: c, r: bufio.NewReader(c)}
}

// health sends GET /healthz and reads the answer: the connection is then
// idle in keep-alive.
func (c *client) health() error {
	_ = c.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c.c, "GET /healthz HTTP/1.1\r\nHost: r\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("status %d", resp.StatusCode)
	}
	return err
}

// stream starts a chat whose answer the engine holds open: the connection
// is then serving a request.
func (c *client) stream() {
	c.t.Helper()
	_ = c.c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c.c, "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		len(completion), completion)
	if _, err := http.ReadResponse(c.r, nil); err != nil {
		c.t.Fatalf("stream: %v", err)
	}
}

// closed reports whether the router closed the connection (a read ends
// in EOF or a reset) within d.
func (c *client) closed(d time.Duration) bool {
	_ = c.c.SetReadDeadline(time.Now().Add(d))
	_, err := c.r.ReadByte()
	return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
}

// waitIdle waits until the router holds n idle connections: a client has
// its answer a moment before the router marks the connection idle, and a
// connection still active is not evicted.
func waitIdle(t *testing.T, r *Router, n int) {
	t.Helper()
	testkit.Wait(t, fmt.Sprintf("%d idle connections", n), func() bool {
		v, _, _ := testkit.Gathered(r.reg, "llmgw_router_connections_open", testkit.Labels{"state": "idle"})
		return int(v) == n
	})
}

// refused reports whether a connection from from is closed at once: with
// a reset, which the dial itself may see.
func refused(t *testing.T, from, addr string) bool {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return errors.Is(err, syscall.ECONNRESET)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Read(make([]byte, 1))
	return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
}

// holdingEngine answers chats with a first event and then holds the
// stream open until the request ends.
func holdingEngine(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	io.WriteString(w, "data: one\n\n")
	w.(http.Flusher).Flush()
	<-r.Context().Done()
}

// TestMaxConnections: past --max-connections the oldest idle connection
// is closed to make room, and a new one is served; with every connection
// serving a request, the new one is closed at once while the others go on.
func TestMaxConnections(t *testing.T) {
	r, addr := startTestRouter(t, holdingEngine, func(c *Config) { c.MaxConnections, c.MaxConnsPerAddr = 3, 0 })
	a := connect(t, "127.0.0.1", addr)
	a.stream()
	b := connect(t, "127.0.0.1", addr)
	if err := b.health(); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, r, 1)
	c := connect(t, "127.0.0.1", addr)
	if err := c.health(); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, r, 2)
	// The cap is reached: a stream and two idle. D takes B's slot, the
	// oldest idle.
	d := connect(t, "127.0.0.3", addr)
	if err := d.health(); err != nil {
		t.Fatalf("a new client past the cap with idle connections to evict: %v", err)
	}
	if !b.closed(5 * time.Second) {
		t.Fatal("the oldest idle connection was not closed to make room")
	}
	if c.closed(100 * time.Millisecond) {
		t.Fatal("a newer idle connection was closed")
	}
	// Now every slot serves: a stream on each. E is closed at once.
	c.stream()
	d.stream()
	if !refused(t, "127.0.0.4", addr) {
		t.Fatal("a connection past the cap, with every slot serving, was not closed")
	}
	if a.closed(100 * time.Millisecond) {
		t.Fatal("a stream was cut to make room")
	}
}

// TestMaxConnsPerAddr: one address cannot hold more than its share: its
// next connection evicts its own oldest idle one, not another client's,
// and past its share with none idle it is refused, while another address
// connects.
func TestMaxConnsPerAddr(t *testing.T) {
	r, addr := startTestRouter(t, holdingEngine, func(c *Config) { c.MaxConnections, c.MaxConnsPerAddr = 100, 2 })
	other := connect(t, "127.0.0.1", addr)
	if err := other.health(); err != nil {
		t.Fatal(err)
	}
	hog := []*client{connect(t, "127.0.0.2", addr), connect(t, "127.0.0.2", addr)}
	for i, c := range hog {
		if err := c.health(); err != nil {
			t.Fatal(err)
		}
		waitIdle(t, r, i+2)
	}
	third := connect(t, "127.0.0.2", addr)
	if err := third.health(); err != nil {
		t.Fatalf("the address's third connection: %v", err)
	}
	if !hog[0].closed(5 * time.Second) {
		t.Fatal("the address's oldest idle connection was not closed")
	}
	if other.closed(100*time.Millisecond) || hog[1].closed(100*time.Millisecond) {
		t.Fatal("another connection was closed")
	}
	hog[1].stream()
	third.stream()
	if !refused(t, "127.0.0.2", addr) {
		t.Fatal("the address's connection past its share, none idle, was not closed")
	}
	if err := connect(t, "127.0.0.5", addr).health(); err != nil {
		t.Fatalf("another address while one holds its share: %v", err)
	}
}

// TestConnCapsOff: with both caps 0 nothing is tracked, and connections
// are not limited.
func TestConnCapsOff(t *testing.T) {
	addr := startRouter(t, holdingEngine, func(c *Config) { c.MaxConnections, c.MaxConnsPerAddr = 0, 0 })
	var cs []*client
	for range 20 {
		c := connect(t, "127.0.0.2", addr)
		if err := c.health(); err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	for i, c := range cs {
		if c.closed(10 * time.Millisecond) {
			t.Fatalf("connection %d closed with no caps", i)
		}
	}
	body := scrapeRouter(t, addr)
	if strings.Contains(body, "llmgw_router_connections_open") {
		t.Error("caps off, yet the connections are counted")
	}
}

// scrapeRouter is the router's /metrics text.
func scrapeRouter(t *testing.T, addr string) string {
	t.Helper()
	resp, err := newClient(t).Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestConnCapsCounted: what the caps close is counted by reason.
func TestConnCapsCounted(t *testing.T) {
	r, addr := startTestRouter(t, holdingEngine, func(c *Config) { c.MaxConnections, c.MaxConnsPerAddr = 100, 1 })
	for range 3 {
		if err := connect(t, "127.0.0.2", addr).health(); err != nil {
			t.Fatal(err)
		}
		waitIdle(t, r, 1)
	}
	testkit.WaitMetric(t, r.reg, "llmgw_router_connections_dropped_total", testkit.Labels{"reason": "evicted_idle"}, 2)
}

func TestConnCapsValidate(t *testing.T) {
	tests := []struct {
		name       string
		total, per int
		want       string // the problem's start; "" valid
	}{
		{"defaults", 4096, 256, ""},
		{"no caps", 0, 0, ""},
		{"per address only", 0, 64, ""},
		{"total only", 100, 0, ""},
		{"negative total", -1, 0, "--max-connections (max_connections): must not be negative"},
		{"negative per address", 10, -1, "--max-conns-per-addr (max_conns_per_addr): must not be negative"},
		{"per address above total: no effect, not refused", 10, 256, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			c.MaxConnections, c.MaxConnsPerAddr = tt.total, tt.per
			err := c.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tt.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tt.want)):
				t.Fatalf("Validate: %v, want %q", err, tt.want)
			}
		})
	}
}
