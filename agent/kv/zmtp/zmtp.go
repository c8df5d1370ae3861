// Package zmtp stands between go-zeromq/zmq4 and the network so that no
// peer of a KV socket can crash the agent (design §6 "KV events").
//
// zmq4 v0.17.0 trusts what a peer declares: conn.go's frame reader
// allocates the length a frame header claims (make([]byte, size), up to
// 2^63-1, so one 9-byte header panics with "makeslice: len out of range"
// or exhausts memory), and protocol.go's metadata parser slices a READY
// command's property lengths without checking them. Both run in zmq4's own
// goroutines (the accept loop's handshake, a reader per connection), where
// no recover of ours can reach. So the bytes are checked before zmq4 sees
// them: this package registers a transport, Scheme, whose connections
// parse the peer's side of ZMTP 3.x and close the connection, before zmq4
// has read the offending header, when
//   - the greeting is not a ZMTP 3.x NULL-mechanism greeting,
//   - the first frame is not a well-formed READY command (every metadata
//     property inside its body, one Socket-Type of a known socket type:
//     zmq4 panics on an unknown one), or the handshake takes too long,
//   - a frame's declared length, or a multipart message's running total,
//     exceeds the cap, or a message has more frames than any socket here
//     sends.
//
// zmq4 keeps its transports in a process-wide registry and hands a
// transport only the socket's context and address, so the limits travel in
// the context the socket was made with (WithPolicy).
package zmtp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// Scheme is the transport this package registers with zmq4: TCP with the
// peer's framing bounded. Endpoint turns a tcp:// endpoint into it.
const Scheme = "llmgw-tcp"

// IPCScheme is the same for ZeroMQ's ipc:// (Unix domain sockets), the
// transport the agent prefers for engines it runs (design §6 "KV events").
const IPCScheme = "llmgw-ipc"

const (
	// DefaultMaxMessageBytes bounds one message (the sum of its frames).
	// vLLM publishes a batch per engine step; a step that stores a 128k
	// token prompt is about a megabyte of msgpack, so 16 MiB is far past
	// any legitimate batch and still a bounded allocation.
	DefaultMaxMessageBytes = 16 << 20
	// DefaultHandshakeTimeout bounds the greeting and READY exchange; zmq4
	// runs handshakes on its accept goroutine, so a peer that says nothing
	// would otherwise keep every later connection (the engine's) waiting.
	DefaultHandshakeTimeout = 10 * time.Second
	// maxReadyBytes bounds the READY command: its metadata is the socket
	// type and identity (at most 255 bytes), so 64 KiB is generous.
	maxReadyBytes = 64 << 10
	// maxFrames bounds the frames of one message: each costs zmq4 a slice
	// header however short it is. vLLM's messages have three or four.
	maxFrames = 64
)

// ErrRefused is what a connection's reads return once its peer broke a
// limit; the connection is closed by then.
var ErrRefused = errors.New("zmtp: refused")

// Policy is the limits on a peer and what to do when it breaks one.
type Policy struct {
	// MaxMessageBytes caps each frame's declared length and the sum over a
	// multipart message; 0 means DefaultMaxMessageBytes.
	MaxMessageBytes uint64
	// HandshakeTimeout bounds the peer's greeting and READY; 0 means
	// DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// PeerTypes, if set, are the socket types the peer may announce; a
	// peer announcing another is refused (zmq4 would refuse it too, but
	// without closing the connection). Any known type passes if empty.
	PeerTypes []zmq4.SocketType
	// Refused, if set, is called once per refused connection with the
	// peer's address and the reason (wrapping ErrRefused), so the caller
	// can count and log it. It runs on zmq4's goroutine: keep it short.
	Refused func(remote net.Addr, err error)
	// Handshaken, if set, is called once per connection whose peer's
	// greeting and READY passed the policy: a publisher that (re)connected,
	// whose batches sent while it had no peer went to no one. It runs on
	// zmq4's goroutine: keep it short.
	Handshaken func(remote net.Addr)
	// RequireUID makes every connection's peer prove it runs as UID: the
	// peer's credentials on a Unix socket (SO_PEERCRED), the owner of the
	// peer's socket on loopback TCP (/proc/net/tcp). A peer of another
	// user, or one that cannot be told, is refused before zmq4 reads a
	// byte of it. Linux only; elsewhere every such peer is refused.
	RequireUID bool
	UID        uint32
	// Dial, if set, makes a dialing socket's TCP connections instead of
	// zmq4's dialer, so the caller decides which addresses a name may
	// reach (the agent's guard for external engines). It runs on zmq4's
	// dialing goroutine.
	//
	// It is also how a redial is paced: zmq4 redials a connection its
	// peer ended at once, so a peer that is refused at every handshake
	// (publisher and replay ports swapped) would be redialed thousands of
	// times a second. Dial gets "unix" for ipc endpoints too.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// AllowFrom, if set, are the addresses an accepted TCP connection may
	// come from; any other peer is refused before a byte of it is read.
	// For a socket bound beyond loopback (an external engine's publisher
	// connecting out to the agent), where no user can be checked.
	AllowFrom []netip.Prefix
}

func (p Policy) withDefaults() Policy {
	if p.MaxMessageBytes == 0 {
		p.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if p.HandshakeTimeout <= 0 {
		p.HandshakeTimeout = DefaultHandshakeTimeout
	}
	return p
}

type policyKey struct{}

// WithPolicy returns a context carrying p, for the context a zmq4 socket is
// made with: the socket's Scheme connections and listeners apply it. A
// socket whose context carries none gets the defaults.
func WithPolicy(ctx context.Context, p Policy) context.Context {
	return context.WithValue(ctx, policyKey{}, p.withDefaults())
}

func policyFrom(ctx context.Context) Policy {
	if p, ok := ctx.Value(policyKey{}).(Policy); ok {
		return p
	}
	return Policy{}.withDefaults()
}

// Endpoint turns tcp://HOST:PORT into the same address on Scheme, for a
// zmq4 socket's Listen or Dial; other endpoints are returned unchanged (and
// zmq4 then uses its own, unbounded transport for them).
func Endpoint(ep string) string {
	if rest, ok := strings.CutPrefix(ep, "tcp://"); ok {
		return Scheme + "://" + rest
	}
	if rest, ok := strings.CutPrefix(ep, "ipc://"); ok {
		return IPCScheme + "://" + rest
	}
	return ep
}

func init() {
	// zmq4's registry is process-wide and refuses a name twice: the only
	// failure is this package being linked twice under one name.
	if err := zmq4.RegisterTransport(Scheme, tcpTransport{}); err != nil {
		panic(err)
	}
	if err := zmq4.RegisterTransport(IPCScheme, ipcTransport{}); err != nil {
		panic(err)
	}
}

// tcpTransport is zmq4's TCP transport with every connection guarded.
type tcpTransport struct{}

var plainTCP = transport.New("tcp")

func (tcpTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	p := policyFrom(ctx)
	dial := d.DialContext
	if p.Dial != nil {
		dial = p.Dial
	}
	c, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return checkedGuard(c, p)
}

func (tcpTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return newListener(l, policyFrom(ctx)), nil
}

func (tcpTransport) Addr(ep string) (string, error) { return plainTCP.Addr(ep) }

// ipcTransport is zmq4's ipc transport with every connection guarded.
type ipcTransport struct{}

func (ipcTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	p := policyFrom(ctx)
	dial := d.DialContext
	if p.Dial != nil {
		dial = p.Dial
	}
	c, err := dial(ctx, "unix", addr)
	if err != nil {
		return nil, err
	}
	return checkedGuard(c, p)
}

func (ipcTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	l, err := net.Listen("unix", addr)
	if err != nil {
		return nil, err
	}
	return newListener(l, policyFrom(ctx)), nil
}

func (ipcTransport) Addr(ep string) (string, error) { return ep, nil }

// checkedGuard guards a dialed connection after checking its peer's user.
func checkedGuard(c net.Conn, p Policy) (net.Conn, error) {
	if err := p.checkPeer(c); err != nil {
		_ = c.Close()
		if p.Refused != nil {
			p.Refused(c.RemoteAddr(), err)
		}
		return nil, err
	}
	return Guard(c, p), nil
}

// checkPeer refuses a peer of another user than p.UID, if p asks.
func (p Policy) checkPeer(c net.Conn) error {
	if len(p.AllowFrom) > 0 {
		if err := allowed(c.RemoteAddr(), p.AllowFrom); err != nil {
			return err
		}
	}
	if !p.RequireUID {
		return nil
	}
	uid, err := PeerUID(c)
	if err != nil {
		return fmt.Errorf("%w: the peer's user cannot be told: %w", ErrRefused, err)
	}
	if uid != p.UID {
		return fmt.Errorf("%w: the peer runs as uid %d, not %d", ErrRefused, uid, p.UID)
	}
	return nil
}

// allowed refuses a remote address outside every prefix of allow.
func allowed(remote net.Addr, allow []netip.Prefix) error {
	ap, err := netip.ParseAddrPort(fmt.Sprint(remote))
	if err != nil {
		return fmt.Errorf("%w: the peer's address %v cannot be told", ErrRefused, remote)
	}
	a := ap.Addr().Unmap()
	for _, p := range allow {
		if p.Contains(a) {
			return nil
		}
	}
	return fmt.Errorf("%w: %s is not in the allow-list", ErrRefused, a)
}

// Guard wraps c, whose reads are a ZMTP 3.x peer's side from its greeting
// on, so that its reads deliver only what p allows.
func Guard(c net.Conn, p Policy) net.Conn {
	p = p.withDefaults()
	return guardUntil(c, p, time.Now().Add(p.HandshakeTimeout))
}

// guardUntil is Guard with the handshake's deadline given.
func guardUntil(c net.Conn, p Policy, deadline time.Time) net.Conn {
	g := &conn{Conn: c, p: p, g: newGuard(p.MaxMessageBytes, p.PeerTypes)}
	_ = c.SetReadDeadline(deadline)
	return g
}

// conn is a guarded connection. Reads are zmq4's alone (one reader per
// connection), so the parser needs no lock; refusal closes the connection
// once.
type conn struct {
	net.Conn
	p    Policy
	g    *guard
	out  []byte // checked bytes not yet delivered
	err  error  // sticky: the refusal, after the bytes before it
	once sync.Once
}

func (c *conn) Read(p []byte) (int, error) {
	for {
		if len(c.out) > 0 {
			n := copy(p, c.out)
			c.out = c.out[n:]
			return n, nil
		}
		if c.err != nil {
			return 0, c.err
		}
		n, err := c.Conn.Read(p)
		wasHandshake := !c.g.handshakeDone()
		out, gerr := c.g.feed(p[:n])
		if gerr != nil {
			c.refuse(gerr)
		} else if wasHandshake && c.g.handshakeDone() {
			_ = c.Conn.SetReadDeadline(time.Time{})
			if c.p.Handshaken != nil {
				c.p.Handshaken(c.Conn.RemoteAddr())
			}
		}
		if err != nil && c.err == nil {
			c.err = err
			if wasHandshake {
				// zmq4 does not close a connection whose handshake
				// failed; a peer that stalls must not keep its socket.
				_ = c.Conn.Close()
			}
		}
		if len(out) == 0 {
			continue
		}
		if len(out) <= len(p) {
			return copy(p, out), nil // out may alias p; copy handles it
		}
		// Only the handshake's held-back bytes (the guard's own buffer,
		// never p) can outgrow p.
		k := copy(p, out)
		c.out = out[k:]
		return k, nil
	}
}

func (c *conn) refuse(err error) {
	c.err = refusal{err}
	c.once.Do(func() {
		_ = c.Conn.Close()
		if c.p.Refused != nil {
			c.p.Refused(c.Conn.RemoteAddr(), err)
		}
	})
}

// refusal is a refusal as reads return it: a net.Error that is not a
// timeout, which zmq4 takes as the connection closed (it then drops it from
// the socket) rather than as a passing error.
type refusal struct{ err error }

func (r refusal) Error() string { return r.err.Error() }
func (r refusal) Unwrap() error { return r.err }
func (refusal) Timeout() bool   { return false }
func (refusal) Temporary() bool { return false }

var _ net.Error = refusal{}

type phase int

const (
	phaseGreeting phase = iota
	phaseReady
	phaseFrames
)

// ZMTP 3.x frame flags (RFC 23).
const (
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
)

// guard parses the peer's side of a ZMTP 3.x stream as zmq4 will read it:
// a 64-byte greeting, then frames of a flags byte, a 1-byte (or, with
// flagLong, 8-byte big-endian) length and the body. The greeting and the
// READY command are held back until complete and checked; later frames
// pass as they come, bodies skipped by count, each header checked the
// moment it is complete.
type guard struct {
	max   uint64
	peers []zmq4.SocketType
	phase phase
	held  []byte // greeting or READY frame, until checked
	emit  []byte // feed's output when it is not a slice of its input

	hdr      [9]byte
	hdrN     int
	bodyLeft uint64
	msgBytes uint64 // frames before this one in the current message
	msgFrame int
}

func newGuard(max uint64, peers []zmq4.SocketType) *guard {
	if len(peers) == 0 {
		peers = knownTypes
	}
	return &guard{max: max, peers: peers}
}

// knownTypes are the socket types zmq4 knows: SocketType.IsCompatible
// panics on any other.
var knownTypes = []zmq4.SocketType{zmq4.Pair, zmq4.Pub, zmq4.Sub, zmq4.Req, zmq4.Rep, zmq4.Dealer,
	zmq4.Router, zmq4.Pull, zmq4.Push, zmq4.XPub, zmq4.XSub}

func (g *guard) handshakeDone() bool { return g.phase == phaseFrames }

// feed takes the next bytes read from the peer and returns those that may
// be delivered now, in order. On a refusal it returns, with the error, the
// bytes before the one that completed the offending header (so zmq4 never
// holds a complete bad header); the held-back handshake is then dropped.
func (g *guard) feed(b []byte) ([]byte, error) {
	g.emit = g.emit[:0]
	i := 0
	for i < len(b) && g.phase != phaseFrames {
		var err error
		i, err = g.handshake(b, i)
		if err != nil {
			return g.emit, err
		}
	}
	start := i
	for i < len(b) {
		if g.bodyLeft > 0 {
			k := min(g.bodyLeft, uint64(len(b)-i))
			i += int(k)
			g.bodyLeft -= k
			continue
		}
		g.hdr[g.hdrN] = b[i]
		g.hdrN++
		if size, ok := g.header(); ok {
			if err := g.frame(size); err != nil {
				return append(g.emit, b[start:i]...), err
			}
		}
		i++
	}
	if len(g.emit) == 0 {
		return b[start:], nil
	}
	return append(g.emit, b[start:]...), nil
}

// header returns the declared size once the header in g.hdr is complete.
func (g *guard) header() (uint64, bool) {
	switch {
	case g.hdr[0]&flagLong == 0 && g.hdrN == 2:
		return uint64(g.hdr[1]), true
	case g.hdr[0]&flagLong != 0 && g.hdrN == 9:
		var n uint64
		for _, c := range g.hdr[1:9] {
			n = n<<8 | uint64(c)
		}
		return n, true
	}
	return 0, false
}

// frame checks a complete frame header against the limits and starts its
// body.
func (g *guard) frame(size uint64) error {
	fl := g.hdr[0]
	g.hdrN = 0
	if size > g.max || g.msgBytes > g.max-size {
		return fmt.Errorf("%w: a frame of %d bytes (after %d in its message) is over the cap of %d bytes",
			ErrRefused, size, g.msgBytes, g.max)
	}
	if g.msgFrame++; g.msgFrame > maxFrames {
		return fmt.Errorf("%w: a message of more than %d frames", ErrRefused, maxFrames)
	}
	if fl&flagMore != 0 {
		g.msgBytes += size
	} else {
		g.msgBytes, g.msgFrame = 0, 0
	}
	g.bodyLeft = size
	return nil
}

// handshake consumes handshake bytes from b[i:] into g.held and returns
// the index after them; a complete, valid part moves to g.emit.
func (g *guard) handshake(b []byte, i int) (int, error) {
	switch g.phase {
	case phaseGreeting:
		k := min(64-len(g.held), len(b)-i)
		g.held = append(g.held, b[i:i+k]...)
		i += k
		if len(g.held) < 64 {
			return i, nil
		}
		if err := checkGreeting(g.held); err != nil {
			return i, err
		}
	case phaseReady:
		for {
			want, err := readyWant(g.held)
			if err != nil {
				return i, err
			}
			if uint64(len(g.held)) == want {
				break
			}
			if i == len(b) {
				return i, nil
			}
			k := min(want-uint64(len(g.held)), uint64(len(b)-i))
			g.held = append(g.held, b[i:i+int(k)]...)
			i += int(k)
		}
		if err := checkReady(g.held, g.peers); err != nil {
			return i, err
		}
	}
	g.emit = append(g.emit, g.held...)
	g.held = g.held[:0]
	g.phase++
	return i, nil
}

// checkGreeting accepts what zmq4 accepts (signature, version 3.0 or
// later, as-server 0 or 1) with the NULL mechanism, the agent's only one.
func checkGreeting(g []byte) error {
	switch {
	case g[0] != 0xFF || g[9] != 0x7F:
		return fmt.Errorf("%w: not a ZMTP greeting", ErrRefused)
	case g[10] < 3:
		return fmt.Errorf("%w: ZMTP version %d.%d, not 3.x", ErrRefused, g[10], g[11])
	case string(g[12:32]) != "NULL"+strings.Repeat("\x00", 16):
		return fmt.Errorf("%w: security mechanism %q, not NULL", ErrRefused, strings.TrimRight(string(g[12:32]), "\x00"))
	case g[32] > 1:
		return fmt.Errorf("%w: as-server flag %d", ErrRefused, g[32])
	}
	return nil
}

// readyWant is how many bytes the handshake's frame f, so far, needs in
// all: a byte for its flags, then its header, then header and body.
func readyWant(f []byte) (uint64, error) {
	if len(f) == 0 {
		return 1, nil
	}
	if f[0]&^flagLong != flagCommand {
		return 0, fmt.Errorf("%w: the handshake's first frame (flags %#x) is not a single command", ErrRefused, f[0])
	}
	hl := 2
	if f[0]&flagLong != 0 {
		hl = 9
	}
	if len(f) < hl {
		return uint64(hl), nil
	}
	var n uint64
	for _, c := range f[1:hl] {
		n = n<<8 | uint64(c)
	}
	if n > maxReadyBytes {
		return 0, fmt.Errorf("%w: a READY command of %d bytes is over the cap of %d", ErrRefused, n, maxReadyBytes)
	}
	return uint64(hl) + n, nil
}

// checkReady checks the READY command in frame f: its name, that every
// metadata property (name length, name, 4-byte value length, value) lies
// inside the body, as zmq4's parser assumes without checking, and that it
// announces one of the peer types.
//
// zmq4 title-cases property names and takes the last "Socket-Type"; a name
// it could map there folds to "socket-type", so exactly one name folding to
// it, spelt "Socket-Type" (as libzmq and zmq4 send it), leaves no doubt
// which value zmq4 will use.
func checkReady(f []byte, peers []zmq4.SocketType) error {
	body := f[2:]
	if f[0]&flagLong != 0 {
		body = f[9:]
	}
	if len(body) == 0 || int(body[0]) > len(body)-1 || string(body[1:1+int(body[0])]) != "READY" {
		return fmt.Errorf("%w: the handshake's first command is not READY", ErrRefused)
	}
	var types []string
	for p := body[1+int(body[0]):]; len(p) > 0; {
		k := int(p[0])
		if len(p) < 1+k+4 {
			return fmt.Errorf("%w: READY metadata property truncated", ErrRefused)
		}
		name := string(p[1 : 1+k])
		v := uint64(p[1+k])<<24 | uint64(p[2+k])<<16 | uint64(p[3+k])<<8 | uint64(p[4+k])
		p = p[1+k+4:]
		if v > uint64(len(p)) {
			return fmt.Errorf("%w: READY metadata value of %d bytes with %d left", ErrRefused, v, len(p))
		}
		if strings.EqualFold(name, "socket-type") {
			if name != "Socket-Type" {
				return fmt.Errorf("%w: READY metadata property %q", ErrRefused, name)
			}
			types = append(types, string(p[:v]))
		}
		p = p[v:]
	}
	if len(types) != 1 {
		return fmt.Errorf("%w: READY metadata with %d socket types", ErrRefused, len(types))
	}
	if !slices.Contains(peers, zmq4.SocketType(types[0])) {
		return fmt.Errorf("%w: peer socket type %q", ErrRefused, types[0])
	}
	return nil
}
