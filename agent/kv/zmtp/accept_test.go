package zmtp

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/llmgw/llmgw/internal/testkit"
)

// pubSub binds a SUB socket under policy p at ep and returns it with a
// function that connects a PUB to it and waits for the subscription.
func pubSub(t *testing.T, p Policy, ep string) (zmq4.Socket, func() zmq4.Socket) {
	t.Helper()
	sub := zmq4.NewSub(WithPolicy(t.Context(), p), zmq4.WithLogger(quietLog()))
	t.Cleanup(func() { _ = sub.Close() })
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	if err := sub.Listen(Endpoint(ep)); err != nil {
		t.Fatal(err)
	}
	bound := ep
	if a, ok := sub.Addr().(*net.TCPAddr); ok {
		bound = "tcp://" + a.String()
	}
	return sub, func() zmq4.Socket {
		pub := zmq4.NewPub(t.Context(), zmq4.WithLogger(quietLog()))
		t.Cleanup(func() { _ = pub.Close() })
		if err := pub.Dial(bound); err != nil {
			t.Fatal(err)
		}
		testkit.Wait(t, "the subscription to reach the publisher", func() bool { return len(pub.(zmq4.Topics).Topics()) != 0 })
		return pub
	}
}

// TestSilentConnectionsDoNotDelay (issue 27): peers that connect and say
// nothing used to hold zmq4's accept loop for the handshake deadline each,
// delaying the engine's own connection; now the engine's handshake
// completes at once however many of them wait, and each is closed at its
// deadline.
func TestSilentConnectionsDoNotDelay(t *testing.T) {
	refused := make(chan error, 16)
	p := Policy{HandshakeTimeout: 30 * time.Second, Refused: func(_ net.Addr, err error) { refused <- err }}
	sub, connect := pubSub(t, p, "tcp://127.0.0.1:0")
	for range 3 {
		c, err := net.Dial("tcp", sub.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	// Within the deadline of one silent peer, the publisher is through.
	done := make(chan zmq4.Socket, 1)
	go func() { done <- connect() }()
	select {
	case pub := <-done:
		if err := pub.Send(zmq4.NewMsgString("hello")); err != nil {
			t.Fatal(err)
		}
		if msg, err := sub.Recv(); err != nil || string(msg.Bytes()) != "hello" {
			t.Fatalf("received %q, %v", msg.Bytes(), err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the publisher waited behind silent connections")
	}
}

// TestSilentConnectionCut: a silent peer's connection is closed at the
// handshake deadline.
func TestSilentConnectionCut(t *testing.T) {
	refused := make(chan error, 1)
	sub, _ := pubSub(t, Policy{HandshakeTimeout: 200 * time.Millisecond, Refused: func(_ net.Addr, err error) { refused <- err }},
		"tcp://127.0.0.1:0")
	c := dialRefused(t, sub.Addr().String(), refused, "signature")
	defer c.Close()
}

// dialRefused connects to addr, says nothing, and waits for the listener
// to refuse the connection with an error naming why.
func dialRefused(t *testing.T, addr string, refused <-chan error, why string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-refused:
		if !strings.Contains(err.Error(), why) {
			t.Errorf("refused for %v; want %q", err, why)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the connection was not refused within 30s (%s)", why)
	}
	return c
}

// TestIPC: the guarded ipc transport carries messages, and a peer of
// another user than the policy requires is refused on either transport
// before zmq4 sees it.
func TestIPC(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("peer credentials are read on Linux")
	}
	self := uint32(os.Geteuid())
	for _, tc := range []struct {
		name string
		ep   string
	}{
		{"ipc", "ipc://" + filepath.Join(t.TempDir(), "kv.sock")},
		{"tcp", "tcp://127.0.0.1:0"},
	} {
		t.Run(tc.name+" same user", func(t *testing.T) {
			sub, connect := pubSub(t, Policy{RequireUID: true, UID: self}, tc.ep)
			pub := connect()
			if err := pub.Send(zmq4.NewMsgString("hello")); err != nil {
				t.Fatal(err)
			}
			if msg, err := sub.Recv(); err != nil || string(msg.Bytes()) != "hello" {
				t.Fatalf("received %q, %v", msg.Bytes(), err)
			}
		})
		t.Run(tc.name+" another user", func(t *testing.T) {
			refused := make(chan error, 4)
			sub, _ := pubSub(t, Policy{RequireUID: true, UID: self + 1, Refused: func(_ net.Addr, err error) { refused <- err }}, tc.ep)
			network, addr := "unix", strings.TrimPrefix(tc.ep, "ipc://")
			if tc.name == "tcp" {
				network, addr = "tcp", sub.Addr().String()
			}
			c, err := net.Dial(network, addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			select {
			case err := <-refused:
				if !strings.Contains(err.Error(), "uid") {
					t.Errorf("refused for %v", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("a peer of another user was not refused")
			}
		})
	}
}

func TestSocketUID(t *testing.T) {
	table := []byte(`  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:A43C 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 1 1 0000000000000000 20 4 30 10 -1
   1: 0100007F:1F90 0100007F:A43C 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 20 4 30 10 -1
   2: 0000000000000000FFFF00000100007F:B000 0000000000000000FFFF00000100007F:1F90 01 00000000:00000000 00:00000000 00000000  33        0 3 1 0
`)
	ap := netip.MustParseAddrPort
	for _, tc := range []struct {
		local, remote string
		uid           uint32
		ok            bool
	}{
		{"127.0.0.1:42044", "127.0.0.1:8080", 1000, true},
		{"127.0.0.1:8080", "127.0.0.1:42044", 0, true},
		{"127.0.0.1:45056", "127.0.0.1:8080", 33, true}, // an IPv6 socket's v4-mapped addresses
		{"127.0.0.1:42045", "127.0.0.1:8080", 0, false},
	} {
		uid, ok := socketUID(table, ap(tc.local), ap(tc.remote))
		if uid != tc.uid || ok != tc.ok {
			t.Errorf("%s -> %s: uid %d %v, want %d %v", tc.local, tc.remote, uid, ok, tc.uid, tc.ok)
		}
	}
}

// TestAllowFrom (issue 27): a socket bound for an external engine's
// publisher, which connects out, accepts only the addresses of its
// allow-list; any other peer is closed before a byte of it is read.
func TestAllowFrom(t *testing.T) {
	for _, tc := range []struct {
		name  string
		allow string
		pass  bool
	}{
		{"listed", "127.0.0.1/32", true},
		{"listed by prefix", "127.0.0.0/8", true},
		{"not listed", "127.0.0.2/32", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			refused := make(chan error, 4)
			p := Policy{AllowFrom: []netip.Prefix{netip.MustParsePrefix(tc.allow)},
				Refused: func(_ net.Addr, err error) { refused <- err }}
			sub, connect := pubSub(t, p, "tcp://127.0.0.1:0")
			if tc.pass {
				pub := connect()
				if err := pub.Send(zmq4.NewMsgString("hello")); err != nil {
					t.Fatal(err)
				}
				if msg, err := sub.Recv(); err != nil || string(msg.Bytes()) != "hello" {
					t.Fatalf("received %q, %v", msg.Bytes(), err)
				}
				return
			}
			c := dialRefused(t, sub.Addr().String(), refused, "not in the allow-list")
			defer c.Close()
			_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
			if n, err := c.Read(make([]byte, 16)); err == nil {
				t.Errorf("the refused connection answered %d bytes; want it closed", n)
			}
		})
	}
}
