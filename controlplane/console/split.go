package console

import (
	"bufio"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"time"
)

// Split makes one listener serve both plain HTTP and HTTPS: a connection
// whose first byte opens a TLS handshake record (0x16) is served as TLS
// with cfg, any other as it is. The control node's HTTP port keeps serving
// /metrics, /healthz and /readyz in plain text to Prometheus and probes, as
// it always has, while the console there is reached over HTTPS with a
// client certificate (Access) — one port, no new flag, nothing to re-point.
//
// Accept never waits for a client's first byte: each connection is sniffed
// in its own goroutine, within sniffTimeout, and handed over when known.
// Close stops accepting and waits for those goroutines.
func Split(l net.Listener, cfg *tls.Config) net.Listener {
	s := &split{Listener: l, cfg: cfg, conns: make(chan net.Conn), done: make(chan struct{}), pending: map[net.Conn]bool{}}
	s.wg.Go(s.acceptLoop)
	return s
}

// sniffTimeout bounds the wait for a new connection's first byte, as the
// HTTP server's ReadHeaderTimeout bounds the rest of a request's head.
const sniffTimeout = 5 * time.Second

// tlsRecordHandshake is the first byte of every TLS ClientHello; no HTTP
// method starts with it.
const tlsRecordHandshake = 0x16

type split struct {
	net.Listener
	cfg   *tls.Config
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup

	mu      sync.Mutex
	err     error             // the inner listener's Accept error, once it failed
	pending map[net.Conn]bool // connections being sniffed, closed by Close
	closed  bool
}

func (s *split) acceptLoop() {
	var delay time.Duration // after a failed Accept (too many open files), as net/http waits
	for {
		c, err := s.Listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				s.mu.Lock()
				s.err = err
				s.mu.Unlock()
				s.once.Do(func() { close(s.done) })
				return
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			select {
			case <-s.done:
				return
			case <-time.After(delay):
			}
			continue
		}
		delay = 0
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			continue
		}
		s.pending[c] = true
		s.mu.Unlock()
		s.wg.Go(func() { s.sniff(c) })
	}
}

func (s *split) sniff(c net.Conn) {
	_ = c.SetReadDeadline(time.Now().Add(sniffTimeout))
	br := bufio.NewReaderSize(c, 1)
	first, err := br.Peek(1)
	_ = c.SetReadDeadline(time.Time{})
	s.mu.Lock()
	delete(s.pending, c)
	s.mu.Unlock()
	if err != nil {
		c.Close()
		return
	}
	var out net.Conn = &peeked{Conn: c, r: br}
	if first[0] == tlsRecordHandshake {
		out = tls.Server(out, s.cfg)
	}
	select {
	case s.conns <- out:
	case <-s.done:
		c.Close()
	}
}

// Accept returns the next sniffed connection.
func (s *split) Accept() (net.Conn, error) {
	select {
	case c := <-s.conns:
		return c, nil
	case <-s.done:
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.err != nil {
			return nil, s.err
		}
		return nil, net.ErrClosed
	}
}

// Close closes the inner listener and waits for the sniffing goroutines;
// connections not yet handed over are closed.
func (s *split) Close() error {
	err := s.Listener.Close()
	s.once.Do(func() { close(s.done) })
	s.mu.Lock()
	s.closed = true
	for c := range s.pending {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

// peeked is a connection whose first bytes sit in r.
type peeked struct {
	net.Conn
	r *bufio.Reader
}

func (p *peeked) Read(b []byte) (int, error) { return p.r.Read(b) }
