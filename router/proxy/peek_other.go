//go:build !unix

package proxy

// peekFn cannot look at the socket here: the connection is taken on
// trust, and a reused one that fails before its first byte is retried.
func (c *upConn) peekFn(uintptr) bool {
	c.peekOK = true
	return true
}
