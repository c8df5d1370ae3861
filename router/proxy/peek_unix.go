//go:build unix

package proxy

import "syscall"

// peekFn is the liveness check's look at the socket, run by RawConn.Read
// without blocking: EAGAIN (nothing to read) is the one good answer;
// bytes the engine sent unasked, its end of the stream (0) or an error
// mean the connection is done.
func (c *upConn) peekFn(fd uintptr) bool {
	var b [1]byte
	_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	c.peekOK = err == syscall.EAGAIN || err == syscall.EWOULDBLOCK
	return true
}
