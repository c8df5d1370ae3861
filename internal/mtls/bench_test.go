package mtls

import (
	"crypto/tls"
	"net"
	"path/filepath"
	"testing"
)

// BenchmarkConnect is the cost a TLS handshake adds to a new connection
// (docs/benchmarks.md, "Security"): a loopback TCP connect and one byte
// echoed, plain and with llmgw's mutual TLS 1.3 handshake (ECDSA P-256 both
// ways, the chain checked against the CA and the role on both sides).
// Connections are long-lived in llmgw (gRPC streams, keep-alive), so this
// is paid per connection, not per request.
func BenchmarkConnect(b *testing.B) {
	dir := b.TempDir()
	ca := filepath.Join(dir, "ca")
	if _, err := CreateCA(ca, CAOptions{}); err != nil {
		b.Fatal(err)
	}
	files := func(id Identity) *Source {
		c, k, err := CreateCert(ca, dir, id, CertOptions{})
		if err != nil {
			b.Fatal(err)
		}
		s, err := Load(Files{CA: filepath.Join(ca, CAFile), Cert: c, Key: k})
		if err != nil {
			b.Fatal(err)
		}
		return s
	}
	srv, cli := files(Identity{RoleServer, "s1"}), files(Identity{RoleRouter, "r1"})
	for _, mode := range []string{"plain", "mtls"} {
		b.Run(mode, func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			if mode == "mtls" {
				ln = tls.NewListener(ln, srv.ServerConfig())
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					go func() {
						defer c.Close()
						buf := make([]byte, 1)
						if _, err := c.Read(buf); err == nil {
							_, _ = c.Write(buf)
						}
					}()
				}
			}()
			cfg := cli.ClientConfig(RoleServer)
			buf := make([]byte, 1)
			b.ResetTimer()
			for b.Loop() {
				c, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					b.Fatal(err)
				}
				if mode == "mtls" {
					c = tls.Client(c, cfg)
				}
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
				if _, err := c.Read(buf); err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
			b.StopTimer()
			ln.Close()
			<-done
		})
	}
}
