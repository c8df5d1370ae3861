package router

import (
	"errors"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestUnsentBound: on a connection the router accepted, writes to a
// client that reads nothing block once about the client's window and
// clientUnsent more are out — not after the megabytes Linux's send buffer
// grows to — so --client-write-timeout finds a stalled stream while its
// generation still runs.
func TestUnsentBound(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("TCP_NOTSENT_LOWAT is Linux's")
	}
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := unsentListener{Listener: raw}
	defer ln.Close()
	written := make(chan int, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			written <- -1
			return
		}
		defer c.Close()
		ev := []byte("data: " + strings.Repeat("x", 140) + "\n\n")
		n := 0
		for n < 64<<20 {
			_ = c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
			k, err := c.Write(ev)
			n += k
			if errors.Is(err, os.ErrDeadlineExceeded) {
				break
			}
			if err != nil {
				n = -1
				break
			}
		}
		written <- n
	}()
	c, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n := <-written
	if n < 0 || n > 1<<20 {
		t.Fatalf("%d bytes were written to a client reading nothing before a write blocked; want under 1 MiB", n)
	}
	t.Logf("%d bytes (%d events of 148 bytes) before a write blocked", n, n/148)
}
