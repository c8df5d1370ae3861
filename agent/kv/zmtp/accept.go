package zmtp

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// signatureLen is the ZMTP signature every peer sends unprompted on
// connecting (RFC 23): libzmq sends these 10 bytes and waits for the
// other side's, so no more can be awaited before zmq4 answers.
const signatureLen = 10

// maxPending bounds the accepted connections still waiting for their
// signature: each costs a goroutine and a descriptor until its deadline.
const maxPending = 32

// listener guards every connection it accepts, and hands zmq4 only those
// whose peer passed checkPeer and sent its signature within the handshake
// deadline.
//
// zmq4 runs each accepted connection's handshake on its accept goroutine,
// one at a time, so a peer that connects and says nothing kept every later
// connection — the engine's own — waiting for its whole deadline (issue
// 27: 10 s per silent connection). Here each connection waits for its
// signature on a goroutine of its own, and zmq4 sees it only once it has
// spoken; a silent one is closed at its deadline without having delayed
// anyone.
type listener struct {
	net.Listener
	p     Policy
	ready chan net.Conn
	done  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup

	mu      sync.Mutex
	pending map[net.Conn]struct{}
}

func newListener(l net.Listener, p Policy) *listener {
	ln := &listener{Listener: l, p: p, ready: make(chan net.Conn), done: make(chan struct{}), pending: map[net.Conn]struct{}{}}
	ln.wg.Go(ln.acceptLoop)
	return ln
}

func (l *listener) acceptLoop() {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			select { // a passing error (out of descriptors): back off
			case <-l.done:
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		if err := l.p.checkPeer(c); err != nil {
			l.refuse(c, err)
			continue
		}
		l.mu.Lock()
		full := len(l.pending) >= maxPending
		if !full {
			l.pending[c] = struct{}{}
		}
		l.mu.Unlock()
		if full {
			l.refuse(c, fmt.Errorf("%w: %d connections already waiting for their handshake", ErrRefused, maxPending))
			continue
		}
		l.wg.Go(func() { l.await(c) })
	}
}

// await reads the peer's signature by the handshake deadline, then queues
// the connection, guarded, for zmq4's Accept; the rest of the handshake
// must complete by the same deadline.
func (l *listener) await(c net.Conn) {
	deadline := time.Now().Add(l.p.HandshakeTimeout)
	_ = c.SetReadDeadline(deadline)
	sig := make([]byte, signatureLen)
	_, err := io.ReadFull(c, sig)
	l.mu.Lock()
	delete(l.pending, c)
	l.mu.Unlock()
	if err != nil {
		l.refuse(c, fmt.Errorf("%w: no ZMTP signature within the handshake deadline: %w", ErrRefused, err))
		return
	}
	g := guardUntil(&prefixConn{Conn: c, pre: sig}, l.p, deadline)
	select {
	case l.ready <- g:
	case <-l.done:
		_ = g.Close()
	}
}

func (l *listener) refuse(c net.Conn, err error) {
	_ = c.Close()
	if l.p.Refused != nil {
		l.p.Refused(c.RemoteAddr(), err)
	}
}

// Accept returns the next connection whose peer has sent its signature.
func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting, closes the connections still waiting and waits
// for the listener's goroutines.
func (l *listener) Close() error {
	err := net.ErrClosed
	l.once.Do(func() {
		close(l.done)
		err = l.Listener.Close()
		l.mu.Lock()
		for c := range l.pending {
			_ = c.Close()
		}
		l.mu.Unlock()
	})
	l.wg.Wait()
	return err
}

// prefixConn delivers pre, bytes already read from Conn, before the rest.
type prefixConn struct {
	net.Conn
	pre []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.pre) > 0 {
		n := copy(p, c.pre)
		c.pre = c.pre[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}
