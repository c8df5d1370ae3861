package zmtp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"log"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"

	"github.com/llmgw/llmgw/internal/testkit"
)

func greeting() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xFF, 0x7F, 3, 0
	copy(g[12:32], "NULL")
	return g
}

// ready is a READY command frame with the given metadata properties.
func ready(props ...string) []byte {
	body := append([]byte{5}, "READY"...)
	for i := 0; i+1 < len(props); i += 2 {
		body = append(body, byte(len(props[i])))
		body = append(body, props[i]...)
		body = binary.BigEndian.AppendUint32(body, uint32(len(props[i+1])))
		body = append(body, props[i+1]...)
	}
	return frame(0x04, body)
}

// frame is one frame with flags and body, short or long as its size needs.
func frame(flags byte, body []byte) []byte {
	if len(body) > 255 {
		return append(binary.BigEndian.AppendUint64([]byte{flags | 0x02}, uint64(len(body))), body...)
	}
	return append([]byte{flags, byte(len(body))}, body...)
}

func long(flags byte, size uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{flags | 0x02}, size)
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// run feeds in to a guard in reads of at most chunk bytes and returns what
// it delivered and the refusal, if any.
func run(max uint64, in []byte, chunk int) ([]byte, error) {
	g := newGuard(max, nil)
	var out []byte
	for len(in) > 0 {
		k := min(chunk, len(in))
		d, err := g.feed(in[:k])
		out = append(out, d...)
		if err != nil {
			return out, err
		}
		in = in[k:]
	}
	return out, nil
}

func TestGuard(t *testing.T) {
	const max = 1000
	hs := cat(greeting(), ready("Socket-Type", "PUB", "Identity", ""))
	mutGreeting := func(i int, b byte) []byte { g := greeting(); g[i] = b; return g }
	tests := []struct {
		name string
		in   []byte
		// deliver is how many leading bytes of in pass (all, if -1).
		deliver int
		refused string // in the error; "" means no refusal
	}{
		{"handshake and frames", cat(hs, frame(1, []byte("kv")), frame(1, make([]byte, 8)), frame(0, make([]byte, 300))), -1, ""},
		{"a message of exactly the cap", cat(hs, frame(1, make([]byte, 500)), frame(0, make([]byte, 500))), -1, ""},
		{"commands after the handshake", cat(hs, frame(0x04, append([]byte{4}, "PING"...))), -1, ""},
		{"a partial stream waits", cat(hs, long(0, 10)[:5]), -1, ""},
		{"huge frame", cat(hs, frame(0, []byte("x")), long(0, 1<<62)), len(hs) + 3 + 8, "over the cap"},
		{"frame one past the cap", cat(hs, long(0, max+1)), len(hs) + 8, "over the cap"},
		{"message past the cap", cat(hs, long(1, 600), make([]byte, 600), long(0, 401)), len(hs) + 9 + 600 + 8, "over the cap"},
		{"overflowing total", cat(hs, long(1, 600), make([]byte, 600), long(0, ^uint64(0)-100)), len(hs) + 9 + 600 + 8, "over the cap"},
		{"too many frames", cat(hs, bytes.Repeat([]byte{1, 0}, maxFrames), []byte{0, 0}), len(hs) + 2*maxFrames + 1, "more than"},
		{"frames count per message", cat(hs, bytes.Repeat(cat(bytes.Repeat([]byte{1, 0}, maxFrames-1), []byte{0, 0}), 3)), -1, ""},
		{"not a greeting", mutGreeting(0, 0x00), 0, "not a ZMTP greeting"},
		{"bad footer", mutGreeting(9, 0x00), 0, "not a ZMTP greeting"},
		{"ZMTP 2", mutGreeting(10, 2), 0, "version"},
		{"PLAIN", func() []byte { g := greeting(); copy(g[12:], "PLAIN"); return g }(), 0, "mechanism"},
		{"as-server 2", mutGreeting(32, 2), 0, "as-server"},
		{"first frame a message", cat(greeting(), frame(0, []byte("hi"))), 64, "not a single command"},
		{"READY with more", cat(greeting(), frame(0x05, []byte("x"))), 64, "not a single command"},
		{"huge READY", cat(greeting(), long(0x04, 1<<62)), 64, "READY command of"},
		{"not READY", cat(greeting(), frame(0x04, append([]byte{5}, "HELLO"...))), 64, "not READY"},
		{"empty command", cat(greeting(), frame(0x04, nil)), 64, "not READY"},
		{"name past the body", cat(greeting(), frame(0x04, []byte{9, 'R'})), 64, "not READY"},
		{"truncated property name", cat(greeting(), frame(0x04, append(append([]byte{5}, "READY"...), 1))), 64, "truncated"},
		{"no value length", cat(greeting(), frame(0x04, append(append([]byte{5}, "READY"...), 1, 'a', 0))), 64, "truncated"},
		{"no socket type", cat(greeting(), ready("Identity", "x")), 64, "0 socket types"},
		{"unknown socket type", cat(greeting(), ready("Socket-Type", "FOO")), 64, "socket type \"FOO\""},
		{"two socket types", cat(greeting(), ready("Socket-Type", "PUB", "Socket-Type", "FOO")), 64, "2 socket types"},
		{"socket type spelt otherwise", cat(greeting(), ready("socket-type", "PUB")), 64, "property"},
		{"value past the body", cat(greeting(), frame(0x04, append(append([]byte{5}, "READY"...), 1, 'a', 0, 0, 0, 9, 'x'))), 64, "value of 9"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.in
			if tc.deliver >= 0 {
				want = tc.in[:tc.deliver]
			}
			for _, chunk := range []int{1, 7, len(tc.in)} {
				got, err := run(max, tc.in, chunk)
				if tc.refused == "" && err != nil {
					t.Fatalf("chunk %d: refused: %v", chunk, err)
				}
				if tc.refused != "" && (!errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tc.refused)) {
					t.Fatalf("chunk %d: err %v, want a refusal naming %q", chunk, err, tc.refused)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("chunk %d: delivered %d bytes, want the first %d", chunk, len(got), len(want))
				}
			}
		})
	}
}

// pipeEnds is a connected pair whose far end stands in for the peer.
func pipeEnds(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func TestGuardPeerTypes(t *testing.T) {
	for _, tc := range []struct {
		announce string
		ok       bool
	}{{"PUB", true}, {"XPUB", true}, {"REQ", false}, {"PUSH", false}} {
		g := newGuard(100, []zmq4.SocketType{zmq4.Pub, zmq4.XPub})
		_, err := g.feed(cat(greeting(), ready("Socket-Type", tc.announce)))
		if (err == nil) != tc.ok {
			t.Errorf("a %s peer: err %v, want ok=%v", tc.announce, err, tc.ok)
		}
	}
}

func TestConnRefusalClosesAndReports(t *testing.T) {
	near, peer := pipeEnds(t)
	reported := make(chan error, 2)
	c := Guard(near, Policy{MaxMessageBytes: 100, Refused: func(_ net.Addr, err error) { reported <- err }})
	go func() {
		_, _ = peer.Write(cat(greeting(), ready("Socket-Type", "PUB"), frame(0, []byte("ok")), long(0, 101)))
	}()
	got, err := io.ReadAll(c)
	var ne net.Error
	if !errors.Is(err, ErrRefused) || !errors.As(err, &ne) || ne.Timeout() {
		t.Fatalf("read error %v, want a refusal that is a non-timeout net.Error", err)
	}
	if want := cat(greeting(), ready("Socket-Type", "PUB"), frame(0, []byte("ok")), long(0, 101)[:8]); !bytes.Equal(got, want) {
		t.Errorf("delivered %q, want %q", got, want)
	}
	select {
	case err := <-reported:
		if !errors.Is(err, ErrRefused) {
			t.Errorf("reported %v", err)
		}
	default:
		t.Error("the refusal was not reported")
	}
	if _, err := peer.Write([]byte{0}); err == nil {
		t.Error("the refused connection is still open")
	}
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, ErrRefused) {
		t.Errorf("a read after the refusal: %v", err)
	}
	if len(reported) != 0 {
		t.Error("the refusal was reported twice")
	}
}

func TestConnHandshakeTimeout(t *testing.T) {
	near, peer := pipeEnds(t)
	c := Guard(near, Policy{HandshakeTimeout: 50 * time.Millisecond})
	go func() { _, _ = peer.Write(greeting()[:10]) }()
	_, err := io.ReadAll(c)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read error %v, want a timeout", err)
	}
	if _, err := peer.Write([]byte{0}); err == nil {
		t.Error("the stalled connection is still open")
	}
}

// deadlines records the read deadlines set on a connection.
type deadlines struct {
	net.Conn
	set []time.Time
}

func (d *deadlines) SetReadDeadline(t time.Time) error {
	d.set = append(d.set, t)
	return d.Conn.SetReadDeadline(t)
}

// TestConnNoDeadlineAfterHandshake: once the peer's greeting and READY
// pass, the handshake's deadline is lifted and Handshaken is called, once.
func TestConnNoDeadlineAfterHandshake(t *testing.T) {
	near, peer := pipeEnds(t)
	rec := &deadlines{Conn: near}
	handshakes := 0
	c := Guard(rec, Policy{HandshakeTimeout: time.Minute, Handshaken: func(net.Addr) { handshakes++ }})
	go func() { _, _ = peer.Write(cat(greeting(), ready("Socket-Type", "PUB"), frame(0, []byte("x")))) }()
	want := cat(greeting(), ready("Socket-Type", "PUB"), frame(0, []byte("x")))
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read %q, %v; want %q", got, err, want)
	}
	if len(rec.set) != 2 || rec.set[0].IsZero() || !rec.set[1].IsZero() {
		t.Fatalf("read deadlines %v, want the handshake's, then none", rec.set)
	}
	if handshakes != 1 {
		t.Fatalf("Handshaken called %d times, want once", handshakes)
	}
}

func TestEndpoint(t *testing.T) {
	for in, want := range map[string]string{
		"tcp://127.0.0.1:5557": Scheme + "://127.0.0.1:5557",
		"ipc:///tmp/x":         IPCScheme + ":///tmp/x",
		"inproc://x":           "inproc://x",
	} {
		if got := Endpoint(in); got != want {
			t.Errorf("Endpoint(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestSocketsOverScheme: zmq4 sockets on the guarded transport talk as on
// tcp://, and a peer sending past the cap loses its connection.
func TestSocketsOverScheme(t *testing.T) {
	refused := make(chan error, 4)
	ctx := WithPolicy(t.Context(), Policy{MaxMessageBytes: 1 << 10, Refused: func(_ net.Addr, err error) { refused <- err }})
	sub := zmq4.NewSub(ctx, zmq4.WithLogger(quietLog()))
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	if err := sub.Listen(Endpoint("tcp://127.0.0.1:0")); err != nil {
		t.Fatal(err)
	}
	pub := zmq4.NewPub(t.Context(), zmq4.WithLogger(quietLog()))
	defer pub.Close()
	if err := pub.Dial("tcp://" + sub.Addr().String()); err != nil {
		t.Fatal(err)
	}
	testkit.Wait(t, "the subscription to reach the publisher", func() bool {
		return len(pub.(zmq4.Topics).Topics()) != 0
	})
	if err := pub.SendMulti(zmq4.NewMsgFrom([]byte("kv"), make([]byte, 1000))); err != nil {
		t.Fatal(err)
	}
	msg, err := sub.Recv()
	if err != nil || len(msg.Frames) != 2 || len(msg.Frames[1]) != 1000 {
		t.Fatalf("received %d frames, %v", len(msg.Frames), err)
	}
	if err := pub.SendMulti(zmq4.NewMsgFrom([]byte("kv"), make([]byte, 1<<10))); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-refused:
		if !strings.Contains(err.Error(), "over the cap") {
			t.Errorf("refused for %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a message past the cap was not refused")
	}
}

// fakeConn reads from a byte string and discards writes: zmq4's side of a
// connection whose peer sent exactly that.
type fakeConn struct {
	net.Conn // nil: only the methods below are called
	r        *bytes.Reader
}

func (c *fakeConn) Read(p []byte) (int, error)         { return c.r.Read(p) }
func (c *fakeConn) Write(p []byte) (int, error)        { return len(p), nil }
func (c *fakeConn) Close() error                       { return nil }
func (c *fakeConn) SetReadDeadline(time.Time) error    { return nil }
func (c *fakeConn) RemoteAddr() net.Addr               { return &net.TCPAddr{} }
func (c *fakeConn) SetDeadline(t time.Time) error      { return nil }
func (c *fakeConn) SetWriteDeadline(t time.Time) error { return nil }

// FuzzZMTPFrames feeds the guard whatever a peer could send: what it
// delivers must not depend on how reads split the stream, must be a prefix
// of it, and zmq4 reading the guarded stream must not panic.
func FuzzZMTPFrames(f *testing.F) {
	hs := cat(greeting(), ready("Socket-Type", "PUB"))
	for _, s := range [][]byte{
		hs,
		cat(hs, frame(1, []byte("kv")), frame(1, make([]byte, 8)), frame(0, make([]byte, 300))),
		cat(hs, frame(0x04, append([]byte{4}, "PING"...))),
		cat(hs, long(0, 1<<62)),
		cat(hs, long(1, 600), make([]byte, 600), long(0, 600)),
		cat(greeting(), long(0x04, 1<<62)),
		cat(greeting(), frame(0x04, append(append([]byte{5}, "READY"...), 1))),
		cat(greeting(), frame(0x04, append(append([]byte{5}, "READY"...), 1, 'a', 0))),
		cat(greeting(), frame(0x04, append(append([]byte{5}, "READY"...), 1, 'a', 0, 0, 0, 9, 'x'))),
		cat(greeting(), ready("Socket-Type", "ROUTER", "Identity", "x"), frame(0, nil)),
		cat(greeting(), ready("Socket-Type", "FOO")),
		cat(greeting(), ready("sOCKET-tYPE", "PUB")),
	} {
		f.Add(s, uint8(7))
	}
	const max = 1 << 10
	f.Fuzz(func(t *testing.T, in []byte, chunk uint8) {
		whole, werr := run(max, in, len(in)+1)
		split, serr := run(max, in, int(chunk%64)+1)
		if !bytes.Equal(whole, split) || (werr == nil) != (serr == nil) {
			t.Fatalf("whole read delivered %d (%v), reads of %d delivered %d (%v)", len(whole), werr, int(chunk%64)+1, len(split), serr)
		}
		if !bytes.HasPrefix(in, whole) {
			t.Fatal("delivered bytes that are not the stream's")
		}
		if werr != nil && !errors.Is(werr, ErrRefused) {
			t.Fatalf("refusal %v does not wrap ErrRefused", werr)
		}
		c := Guard(&fakeConn{r: bytes.NewReader(in)}, Policy{MaxMessageBytes: max})
		zc, err := zmq4.Open(c, null.Security(), zmq4.Sub, zmq4.SocketIdentity("agent"), true, nil)
		if err != nil {
			return
		}
		for range 1000 {
			if _, err := zc.RecvMsg(); err != nil {
				return
			}
		}
	})
}

func quietLog() *log.Logger { return log.New(io.Discard, "", 0) }
