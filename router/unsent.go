package router

import "net"

// A client that stops reading a stream is detected when a write to it
// blocks past --client-write-timeout (design §7.1), and a write blocks
// only once the socket's buffers are full. Linux grows a connection's
// send buffer to megabytes (tcp_wmem: 4 MiB), so a stalled client would
// be sent some 26,000 SSE events — more than most generations — before
// any write blocked (measured on loopback: 3.9 MB), and its engine
// request would run to the end. TCP_NOTSENT_LOWAT bounds the bytes a
// socket holds that were not yet sent (in flight, unacknowledged, is not
// bounded: it does not slow a fast client), so a write blocks once the
// client's window is shut and clientUnsent more bytes wait: about 800
// events on loopback. Where the option does not exist nothing is set.

// clientUnsent is the most a client connection's socket holds unsent:
// 16 KiB, what Cloudflare and Google run HTTP/2 with.
const clientUnsent = 16 << 10

// unsentListener bounds the unsent bytes of each accepted TCP connection
// (setUnsent).
type unsentListener struct{ net.Listener }

func (l unsentListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		setUnsent(tc, clientUnsent)
	}
	return c, nil
}
