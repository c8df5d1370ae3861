package kv

import (
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/agent/kv/zmtp"
	"github.com/llmgw/llmgw/internal/testkit"
	"github.com/llmgw/llmgw/vllm"
)

// zmtpGreeting is a ZMTP 3.0 NULL-mechanism greeting, as a client sends it.
func zmtpGreeting() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xFF, 0x7F, 3, 0
	copy(g[12:32], "NULL")
	return g
}

// zmtpReady is a READY command frame announcing a socket of the type.
func zmtpReady(sockType string) []byte {
	body := []byte{5}
	body = append(body, "READY"...)
	body = append(body, 11)
	body = append(body, "Socket-Type"...)
	body = binary.BigEndian.AppendUint32(body, uint32(len(sockType)))
	body = append(body, sockType...)
	return append([]byte{0x04, byte(len(body))}, body...)
}

// longHeader is a long frame's header declaring size bytes.
func longHeader(flags byte, size uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{flags | 0x02}, size)
}

// TestListenerSurvivesHostilePeer is the attack a peer on the KV socket
// made: it connects to the listener's endpoint (where the engine's PUB
// connects) and sends frames that made zmq4 allocate or index from what
// they declare. Each must cost the peer its connection and nothing more:
// the agent stays up, counts the refusal, and an engine connecting next is
// still mirrored.
func TestListenerSurvivesHostilePeer(t *testing.T) {
	huge := uint64(1) << 62 // past Go's largest allocation: makeslice panics
	attacks := []struct {
		name   string
		stream [][]byte // written one packet at a time
	}{
		{"huge first frame", [][]byte{zmtpGreeting(), longHeader(0x04, huge)}},
		{"huge frame after the handshake", [][]byte{zmtpGreeting(), zmtpReady("PUB"), longHeader(0, huge)}},
		{"frame over the cap", [][]byte{zmtpGreeting(), zmtpReady("PUB"), longHeader(0, zmtp.DefaultMaxMessageBytes+1)}},
		{"message over the cap in frames", [][]byte{zmtpGreeting(), zmtpReady("PUB"),
			longHeader(0x01, zmtp.DefaultMaxMessageBytes/2), make([]byte, zmtp.DefaultMaxMessageBytes/2),
			longHeader(0, zmtp.DefaultMaxMessageBytes/2+1)}},
		// zmq4 v0.17.0 slices a metadata property's name and value length
		// without checking they are inside the READY body.
		{"truncated metadata", [][]byte{zmtpGreeting(), {0x04, 7, 5, 'R', 'E', 'A', 'D', 'Y', 1}}},
		// zmq4 v0.17.0 panics on a socket type it does not know.
		{"unknown socket type", [][]byte{zmtpGreeting(), zmtpReady("FOO")}},
		{"metadata without a value length", [][]byte{zmtpGreeting(), {0x04, 9, 5, 'R', 'E', 'A', 'D', 'Y', 1, 'a', 0}}},
	}
	for _, tc := range attacks {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, setup{enc: vllm.EncodingMap})
			addr := strings.TrimPrefix(h.l.Endpoint(), "tcp://")
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			for _, p := range tc.stream {
				if _, err := c.Write(p); err != nil {
					break // the agent may close on us part way
				}
			}
			// The agent ends the connection: reads drain its greeting and
			// READY, then stop.
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.Copy(io.Discard, c); err != nil {
				t.Fatalf("the agent did not close the hostile connection: %v", err)
			}
			testkit.Wait(t, "the refused frame to be counted", func() bool { return value(h.hub.metrics.framesRefused) == 1 })

			// The legitimate engine's stream still arrives.
			_, ev := h.eng.stored(nil, toks(1, 2*testBS))
			h.eng.publish(false, ev)
			h.converged(t)
		})
	}
}

// TestReplaySurvivesHostileListener is the other direction: the agent's
// replay DEALER dials whatever listens on the engine's replay port. A
// listener there that answers with a huge frame fails the replay (the
// replica becomes untrusted, as for any failed replay) and nothing more.
func TestReplaySurvivesHostileListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan struct{})
	go func() {
		defer close(served)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		for _, p := range [][]byte{zmtpGreeting(), zmtpReady("ROUTER"), longHeader(0, 1<<62)} {
			if _, err := c.Write(p); err != nil {
				return
			}
		}
		_, _ = io.Copy(io.Discard, c) // until the agent hangs up
	}()

	reg := prometheus.NewRegistry()
	hub, err := NewHub(quiet, reg)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultListenerConfig()
	cfg.ReplicaID, cfg.Endpoint, cfg.Topic, cfg.BlockSize = "demo-0", "tcp://127.0.0.1:0", "kv", testBS
	cfg.ReplayEndpoint, cfg.CatchUp = "tcp://"+ln.Addr().String(), true
	l, err := hub.Listen(cfg, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	testkit.Wait(t, "the failed replay to untrust the replica", func() bool {
		_, u, _ := hub.Blocks("demo-0")
		return u
	})
	if n := value(hub.metrics.framesRefused); n != 1 {
		t.Errorf("frames refused = %v, want 1", n)
	}
	if n := value(hub.metrics.replays); n != 1 {
		t.Errorf("replays = %v, want 1 (failed)", n)
	}
	select {
	case <-served:
	case <-time.After(20 * time.Second):
		t.Fatal("the agent did not hang up on the hostile replay listener")
	}
}

// panicky is a socket whose Recv panics, as a zmq4 bug would.
type panicky struct{ zmq4.Socket }

func (panicky) Recv() (zmq4.Msg, error) { panic("zmq4 bug") }

// TestReceiveSurvivesLibraryPanic: a panic of zmq4 on the listener's own
// goroutine stops that listener's receiving and untrusts its replica; it
// does not take the agent down.
func TestReceiveSurvivesLibraryPanic(t *testing.T) {
	hub, err := NewHub(quiet, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	l := &Listener{cfg: DefaultListenerConfig(), log: quiet, hub: hub, sub: panicky{},
		mirror: newMirror("demo-0", 1, testBS, "0", DefaultMaxBlocks, DefaultMaxOffloadBlocks, 16), msgs: make(chan zmq4.Msg, 1)}
	hub.add(l.mirror)
	l.wg.Add(1)
	go l.receive(t.Context())
	l.wg.Wait()
	if _, u, _ := hub.Blocks("demo-0"); !u {
		t.Error("the replica is trusted after its socket panicked")
	}
}
