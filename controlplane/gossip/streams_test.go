package gossip

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/mtls/mtlstest"
	"github.com/llmgw/llmgw/internal/netlimit"
	"github.com/llmgw/llmgw/internal/testkit"
)

// flood holds n silent sockets on addr from the loopback address from,
// reopening each 100 ms after the server closes it, until stop; it records
// the longest any lived.
type flood struct {
	stop    chan struct{}
	wg      sync.WaitGroup
	longest atomic.Int64 // ns
	closed  atomic.Int64
}

func startFlood(t *testing.T, from, addr string, n int) *flood {
	f := &flood{stop: make(chan struct{})}
	for range n {
		f.wg.Go(func() {
			for {
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
				c, err := d.Dial("tcp", addr)
				if err != nil {
					select {
					case <-f.stop:
						return
					case <-time.After(50 * time.Millisecond): // pacing a failed dial
					}
					continue
				}
				start := time.Now()
				done := make(chan struct{})
				go func() {
					defer close(done)
					_, _ = c.Read(make([]byte, 1)) // until the server closes it
				}()
				select {
				case <-done:
					if d := time.Since(start); int64(d) > f.longest.Load() {
						f.longest.Store(int64(d))
					}
					f.closed.Add(1)
					c.Close()
					// Pacing: an attacker reconnecting in a tight loop would
					// only burn this machine's CPU, which the test shares.
					select {
					case <-f.stop:
						return
					case <-time.After(100 * time.Millisecond):
					}
				case <-f.stop:
					c.Close()
					<-done
					return
				}
			}
		})
	}
	t.Cleanup(f.end)
	return f
}

func (f *flood) end() {
	select {
	case <-f.stop:
	default:
		close(f.stop)
	}
	f.wg.Wait()
}

// TestSilentStreamsBlockNoOne (issue 26): 100 silent sockets from one
// address on a member's gossip port and 32 from another, each reopened
// when it is closed, while
// another member sends it reliable messages (streams) and joins it. Every
// send arrives; every silent socket is closed within the handshake timeout
// (or at once past the address's cap). The transport this replaced held 64
// handshakes in progress for everyone: 64 silent sockets kept every other
// stream out.
func TestSilentStreamsBlockNoOne(t *testing.T) {
	const timeout = time.Second
	p := mtlstest.New(t)
	for _, tt := range []struct {
		name string
		a, b *mtls.Source
	}{
		{"plain", nil, nil},
		{"tls", p.Source(mtls.RoleServer, "a"), p.Source(mtls.RoleServer, "b")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var drops, timedOut atomic.Int64
			lim := netlimit.New(netlimit.Config{MaxConns: 512, MaxConnsPerAddr: 64, HandshakeTimeout: timeout,
				OnDrop: func(r netlimit.Reason) {
					drops.Add(1)
					if r == netlimit.HandshakeTimeout {
						timedOut.Add(1)
					}
				}})
			a, got := startMember(t, "a", Security{TLS: tt.a, Conns: lim})
			b, _ := startMember(t, "b", Security{TLS: tt.b})
			// From one address past its cap (evicted by the next ones) and
			// from another under it (timed out).
			f := startFlood(t, "127.0.0.2", a.Addr(), 100)
			f2 := startFlood(t, "127.0.0.3", a.Addr(), 32)
			testkit.Wait(t, "the flood to hold the cap", func() bool { return lim.Open() >= 64+32 })
			if _, err := b.Join([]string{a.Addr()}); err != nil {
				t.Fatalf("join during the flood: %v", err)
			}
			testkit.Wait(t, "a and b to see each other", func() bool { return alive(a) == 2 && alive(b) == 2 })
			const sends = 20
			for i := range sends {
				if err := b.Send("a", []byte{PlaneBatchKind, byte(i)}); err != nil {
					t.Fatalf("send %d during the flood: %v", i, err)
				}
			}
			testkit.Wait(t, "every send to arrive", func() bool { return got.count() >= sends })
			// Past a timeout, so that the silent sockets under the cap were
			// timed out too, not only evicted by the next ones.
			testkit.Wait(t, "silent sockets to be timed out", func() bool { return timedOut.Load() > 0 })
			f.end()
			f2.end()
			for _, f := range []*flood{f, f2} {
				if longest := time.Duration(f.longest.Load()); longest > timeout+2*time.Second {
					t.Errorf("a silent socket lived %v, handshake timeout %v", longest, timeout)
				}
			}
			t.Logf("%d silent sockets closed (%d by the limiter, %d at the handshake timeout), the longest after %v; %d sends and a join went through",
				f.closed.Load()+f2.closed.Load(), drops.Load(), timedOut.Load(), time.Duration(max(f.longest.Load(), f2.longest.Load())).Round(time.Millisecond), sends)
		})
	}
}
