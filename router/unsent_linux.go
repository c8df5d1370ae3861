//go:build linux

package router

import (
	"net"
	"syscall"
)

// tcpNotsentLowat is Linux's TCP_NOTSENT_LOWAT (linux/tcp.h), which the
// syscall package does not name.
const tcpNotsentLowat = 25

// setUnsent sets c's TCP_NOTSENT_LOWAT to n bytes; a failure leaves the
// system's default (stalled clients are then found later, not never).
func setUnsent(c *net.TCPConn, n int) {
	raw, err := c.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(fd uintptr) {
		_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpNotsentLowat, n)
	})
}
