package zmtp

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// PeerUID is the user the peer of c runs as: for a Unix socket its
// credentials (SO_PEERCRED), for a TCP connection the owner of the
// socket at its other end, which on loopback is in this host's
// /proc/net/tcp or tcp6.
func PeerUID(c net.Conn) (uint32, error) {
	switch c := c.(type) {
	case *net.UnixConn:
		raw, err := c.SyscallConn()
		if err != nil {
			return 0, err
		}
		var cred *syscall.Ucred
		var cerr error
		if err := raw.Control(func(fd uintptr) {
			cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
		}); err != nil {
			return 0, err
		}
		if cerr != nil {
			return 0, cerr
		}
		return cred.Uid, nil
	case *net.TCPConn:
		us, them := c.LocalAddr().(*net.TCPAddr).AddrPort(), c.RemoteAddr().(*net.TCPAddr).AddrPort()
		for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
			table, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			if uid, ok := socketUID(table, them, us); ok {
				return uid, nil
			}
		}
		return 0, fmt.Errorf("no socket %s -> %s in /proc/net/tcp*: not a local peer", them, us)
	}
	return 0, fmt.Errorf("a %T has no peer credentials", c)
}

// socketUID finds, in a /proc/net/tcp or tcp6 table, the socket whose
// local address is local and remote address is remote, and returns its
// owner's uid. Addresses are compared unmapped, since either end may be an
// IPv6 socket speaking to an IPv4 address.
func socketUID(table []byte, local, remote netip.AddrPort) (uint32, bool) {
	sc := bufio.NewScanner(bytes.NewReader(table))
	sc.Scan() // the header
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 8 {
			continue
		}
		l, err1 := procAddr(f[1])
		r, err2 := procAddr(f[2])
		if err1 != nil || err2 != nil || !sameAddr(l, local) || !sameAddr(r, remote) {
			continue
		}
		uid, err := strconv.ParseUint(f[7], 10, 32)
		if err != nil {
			return 0, false
		}
		return uint32(uid), true
	}
	return 0, false
}

func sameAddr(a, b netip.AddrPort) bool {
	return a.Port() == b.Port() && a.Addr().Unmap() == b.Addr().Unmap()
}

// procAddr parses ADDR:PORT as /proc/net/tcp prints it: the address as
// 32-bit words in host order, each as hex; the port as hex.
func procAddr(s string) (netip.AddrPort, error) {
	a, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, errors.New("no port")
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, err
	}
	raw, err := hex.DecodeString(a)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, fmt.Errorf("address %q", a)
	}
	out := make([]byte, len(raw))
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(out[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	addr, _ := netip.AddrFromSlice(out)
	return netip.AddrPortFrom(addr, uint16(port)), nil
}
