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
)

// handshakeTimeout bounds an incoming stream's TLS handshake, so a peer
// that connects and says nothing holds a goroutine only that long.
const handshakeTimeout = 5 * time.Second

// maxHandshakes bounds the incoming handshakes in progress; a stream past
// it is closed at once. Servers open a few streams a second (push/pull,
// the ephemeral plane's batches), far below it; a flood does not get a
// goroutine per connection.
const maxHandshakes = 64

// tlsTransport is memberlist's NetTransport with every TCP stream carried
// over mutual TLS between servers (design §11: only servers join gossip).
// Joins and push/pull are streams, so a process without a server
// certificate of the cluster's CA cannot join, nor receive the members'
// state or the ephemeral plane's batches (reliable sends are streams too).
// A dialed stream to a named member also checks that the certificate names
// that member, so one server cannot answer for another.
//
// UDP packets (probes, gossip broadcasts) are NetTransport's own: TLS has
// no datagram form here. They are authenticated by the gossip keyring
// (--gossip-key-file) when one is set; without it, a host that can reach
// the gossip port can still send forged UDP gossip, though it can neither
// join Raft (its transport demands a server certificate) nor be sent
// anything over a stream.
type tlsTransport struct {
	*memberlist.NetTransport
	src    *mtls.Source
	logger *log.Logger
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
	slots   chan struct{}
	wg      sync.WaitGroup
}

var _ memberlist.NodeAwareTransport = (*tlsTransport)(nil)

func newTLSTransport(inner *memberlist.NetTransport, src *mtls.Source, logger *log.Logger) *tlsTransport {
	t := &tlsTransport{
		NetTransport: inner, src: src, logger: logger,
		server: src.ServerConfig(mtls.RoleServer), sessions: tls.NewLRUClientSessionCache(64),
		streams: make(chan net.Conn), done: make(chan struct{}), slots: make(chan struct{}, maxHandshakes),
	}
	t.wg.Go(t.accept)
	return t
}

// accept takes NetTransport's accepted connections and handshakes each on
// its own goroutine, so a slow peer never holds up the others.
func (t *tlsTransport) accept() {
	for {
		select {
		case <-t.done:
			return
		case c := <-t.NetTransport.StreamCh():
			select {
			case t.slots <- struct{}{}:
			default:
				t.logger.Printf("[WARN] memberlist: refusing a gossip stream from %s: %d TLS handshakes in progress", c.RemoteAddr(), maxHandshakes)
				_ = c.Close()
				continue
			}
			t.wg.Go(func() {
				defer func() { <-t.slots }()
				t.serve(c)
			})
		}
	}
}

func (t *tlsTransport) serve(c net.Conn) {
	tc := tls.Server(c, t.server)
	_ = tc.SetDeadline(time.Now().Add(handshakeTimeout))
	if err := tc.Handshake(); err != nil {
		t.logger.Printf("[WARN] memberlist: refusing a gossip stream from %s: %v", c.RemoteAddr(), err)
		_ = c.Close()
		return
	}
	_ = tc.SetDeadline(time.Time{})
	select {
	case t.streams <- tc:
	case <-t.done:
		_ = tc.Close()
	}
}

// StreamCh is the streams whose peer proved to be a server of the cluster.
func (t *tlsTransport) StreamCh() <-chan net.Conn { return t.streams }

func (t *tlsTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout opens a stream and handshakes within timeout. With a
// member's name (every send but a join by address), the peer's certificate
// must name it.
func (t *tlsTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
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
// connection), then stops accept and the handshakes.
func (t *tlsTransport) Shutdown() error {
	err := t.NetTransport.Shutdown()
	close(t.done)
	t.wg.Wait()
	return err
}
