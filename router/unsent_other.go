//go:build !linux

package router

import "net"

// setUnsent does nothing where TCP_NOTSENT_LOWAT is not known: a stalled
// client is found once the system's buffers are full.
func setUnsent(*net.TCPConn, int) {}
