package gossip

import (
	"crypto/tls"
	"fmt"
	"log"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/netlimit"
)

// defaultHandshakeTimeout bounds an incoming stream's handshake when no
// limiter says otherwise (Security.Conns).
const defaultHandshakeTimeout = 10 * time.Second

// streamTransport is memberlist's NetTransport with its incoming streams
// bounded and, with TLS, every TCP stream carried over mutual TLS between
// servers (design §11: only servers join gossip). Joins and push/pull are
// streams, so a process without a server certificate of the cluster's CA
// cannot join, nor receive the members' state or the ephemeral plane's
// batches (reliable sends are streams too). A dialed stream to a named
// member also checks that the certificate names that member, so one
// server cannot answer for another.
//
// Incoming streams (issue 26): each is admitted by the listener's limiter
// (Security.Conns: caps in total and per address, the oldest stream still
// in its handshake closed to make room), then handshaken on a goroutine of
// its own — TLS, or in plain text the stream's first byte — within the
// handshake timeout, and only then handed to memberlist. Nothing in the
// accept loop waits on a peer. The transport this replaces bounded the
// handshakes in progress to 64 for everyone together: 64 silent sockets,
// reopened as they timed out, kept every server's stream out (a new
// replica stayed unknown on that server) and logged a line for each
// refused one.
//
// UDP packets (probes, gossip broadcasts) are NetTransport's own: TLS has
// no datagram form here. They are authenticated by the gossip keyring
// (--gossip-key-file) when one is set; without it, a host that can reach
// the gossip port can still send forged UDP gossip, though it can neither
// join Raft (its transport demands a server certificate) nor be sent
// anything over a stream. Junk packets cost a rate-limited log line
// (package logadapt).
type streamTransport struct {
	*memberlist.NetTransport
	src     *mtls.Source      // nil: plain TCP
	conns   *netlimit.Limiter // nil: no caps
	timeout time.Duration
	logger  *log.Logger
	// server is made once, so its session ticket keys last; sessions is
	// the dialer's cache. Streams that read an answer (push/pull) resume
	// sessions and skip a full handshake's signatures; one-way sends (the
	// plane's batches) close before the ticket arrives, and pay a full
	// handshake each: about 1 ms of CPU on the two sides together, measured
	// on loopback, against 0.15 ms for a plain stream.
	server   *tls.Config
	sessions tls.ClientSessionCache

	streams chan net.Conn
	done    chan struct{}
	wg      sync.WaitGroup

	mu sync.Mutex
	// handshaking is the streams in their handshake, closed by Shutdown
	// so that it does not wait out their timeouts.
	handshaking map[net.Conn]bool
	closed      bool
}

var _ memberlist.NodeAwareTransport = (*streamTransport)(nil)

// newStreamTransport wraps inner: src nil is plain TCP; conns nil admits
// every stream, with defaultHandshakeTimeout.
func newStreamTransport(inner *memberlist.NetTransport, src *mtls.Source, conns *netlimit.Limiter, logger *log.Logger) *streamTransport {
	t := &streamTransport{
		NetTransport: inner, src: src, conns: conns, timeout: defaultHandshakeTimeout, logger: logger,
		streams: make(chan net.Conn), done: make(chan struct{}), handshaking: map[net.Conn]bool{},
	}
	if conns != nil && conns.HandshakeTimeout() > 0 {
		t.timeout = conns.HandshakeTimeout()
	}
	if src != nil {
		t.server, t.sessions = src.ServerConfig(mtls.RoleServer), tls.NewLRUClientSessionCache(64)
	}
	t.wg.Go(t.accept)
	return t
}

// accept takes NetTransport's accepted connections, admits each and
// handshakes it on its own goroutine, so a slow peer never holds up the
// others. The limiter's total cap bounds those goroutines.
func (t *streamTransport) accept() {
	for {
		select {
		case <-t.done:
			return
		case c := <-t.NetTransport.StreamCh():
			if t.conns != nil {
				var ok bool
				if c, ok = t.conns.Admit(c); !ok {
					continue // refused, closed and counted by the limiter
				}
			}
			t.wg.Go(func() { t.serve(c) })
		}
	}
}

// serve handshakes c and hands it to memberlist, or closes it.
func (t *streamTransport) serve(c net.Conn) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		_ = c.Close()
		return
	}
	t.handshaking[c] = true
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		delete(t.handshaking, c)
		t.mu.Unlock()
	}()
	_ = c.SetDeadline(time.Now().Add(t.timeout))
	var out net.Conn
	if t.src != nil {
		tc := tls.Server(c, t.server)
		if err := tc.Handshake(); err != nil {
			t.logger.Printf("[WARN] memberlist: refusing a gossip stream from %s: %v", c.RemoteAddr(), err)
			_ = c.Close()
			return
		}
		out = tc
	} else {
		// Plain text: the stream's first byte is its handshake, so a silent
		// socket is closed here as in TLS rather than held by memberlist.
		p := &peeked{Conn: c}
		if _, err := c.Read(p.first[:]); err != nil {
			t.logger.Printf("[WARN] memberlist: refusing a gossip stream from %s: nothing received: %v", c.RemoteAddr(), err)
			_ = c.Close()
			return
		}
		p.have = true
		out = p
	}
	_ = c.SetDeadline(time.Time{})
	if t.conns != nil {
		t.conns.Active(c)
	}
	select {
	case t.streams <- out:
	case <-t.done:
		_ = out.Close()
	}
}

// peeked is a plain stream whose first byte was read to see it speak.
type peeked struct {
	net.Conn
	first [1]byte
	have  bool
}

func (p *peeked) Read(b []byte) (int, error) {
	if p.have && len(b) > 0 {
		p.have = false
		b[0] = p.first[0]
		return 1, nil
	}
	return p.Conn.Read(b)
}

// StreamCh is the admitted streams that completed their handshake: with
// TLS, those whose peer proved to be a server of the cluster.
func (t *streamTransport) StreamCh() <-chan net.Conn { return t.streams }

func (t *streamTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout opens a stream and, with TLS, handshakes within
// timeout. With a member's name (every send but a join by address), the
// peer's certificate must name it.
func (t *streamTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if t.src == nil {
		return t.NetTransport.DialAddressTimeout(a, timeout)
	}
	deadline := time.Now().Add(timeout)
	c, err := t.NetTransport.DialAddressTimeout(a, timeout)
	if err != nil {
		return nil, err
	}
	cfg := t.src.ClientConfig(mtls.RoleServer)
	cfg.ClientSessionCache = t.sessions
	if a.Name != "" {
		verify := cfg.VerifyConnection
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if err := verify(cs); err != nil {
				return err
			}
			id, err := mtls.IdentityOf(cs.PeerCertificates[0])
			if err != nil {
				return err
			}
			if id.Name != a.Name {
				return fmt.Errorf("tls: gossip peer at %s is %s, not server %s", a.Addr, id, a.Name)
			}
			return nil
		}
	}
	tc := tls.Client(c, cfg)
	_ = tc.SetDeadline(deadline)
	if err := tc.Handshake(); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("gossip stream to %s: %w", a.String(), err)
	}
	_ = tc.SetDeadline(time.Time{})
	return tc, nil
}

// Shutdown closes the listeners first, while accept still drains them
// (NetTransport waits for its accept loop, which may be handing over a
// connection), then stops accept and cuts the handshakes.
func (t *streamTransport) Shutdown() error {
	err := t.NetTransport.Shutdown()
	close(t.done)
	t.mu.Lock()
	t.closed = true
	for c := range t.handshaking {
		_ = c.Close()
	}
	t.mu.Unlock()
	t.wg.Wait()
	return err
}
