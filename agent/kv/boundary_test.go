package kv

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/internal/backoff"
	"github.com/llmgw/llmgw/internal/testkit"
	"github.com/llmgw/llmgw/vllm"
)

// restartEngine makes the fake engine a new process of itself, unknown to
// any supervisor: an empty cache, seq from 0, an empty replay buffer.
func (e *fakeEngine) restartEngine() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.seq, e.ring = 0, nil
	clear(e.held)
	clear(e.off)
}

// reconnect makes a new PUB socket connect to endpoint, as a restarted
// engine's does, and waits for its subscription.
func (e *fakeEngine) reconnect(endpoint string) {
	e.t.Helper()
	_ = e.pub.Close()
	e.pub = zmq4.NewPub(context.Background(), zmq4.WithLogger(slog.NewLogLogger(quiet.Handler(), slog.LevelDebug)))
	e.connect(endpoint)
}

// TestListenerSeesUnnoticedRestart (issue 27): an engine killed and
// restarted within one health interval is a new process the supervisor
// never named. Its batches used to be dropped as "already applied", and
// the index kept the old process's blocks. Now the engine's own signals
// tell: a live batch below the seq wanted next that is not one applied
// lately, or a replay, after its publisher reconnects, that no longer
// holds the last batch applied. Either way the mirror equals the new
// process's cache.
func TestListenerSeesUnnoticedRestart(t *testing.T) {
	tests := []struct {
		name string
		// before is how many batches the old process published; lost how
		// many of the new one's go to no one before the publisher is
		// back; reconnect whether it reconnects (a new PUB socket).
		before, lost int
		reconnect    bool
	}{
		{"a lower seq on the live stream", 5, 0, false},
		{"its first batches lost, then a lower seq", 5, 2, false},
		{"it reconnects and stays quiet", 2, 1, true},
		{"it reconnects past the old seq", 2, 5, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, setup{})
			for i := range tc.before {
				_, ev := h.eng.stored(nil, toks(100*i, 4))
				h.eng.publish(false, ev)
			}
			h.converged(t)
			h.eng.restartEngine()
			for i := range tc.lost {
				_, ev := h.eng.stored(nil, toks(1000+100*i, 4))
				h.eng.publish(true, ev)
			}
			if tc.reconnect {
				h.eng.reconnect(h.l.Endpoint())
			} else {
				_, ev := h.eng.stored(nil, toks(5000, 4))
				h.eng.publish(false, ev)
			}
			h.converged(t)
			if n := value(h.hub.metrics.resets.WithLabelValues("restart")); n != 1 {
				t.Errorf("restart resets = %v, want 1", n)
			}
		})
	}
}

// TestListenerReplayOvertakesLiveBatches: the batches a replay applied
// before their live copies arrive are recognised as repeats, not taken for
// a restarted engine's.
func TestListenerReplayOvertakesLiveBatches(t *testing.T) {
	h := start(t, setup{})
	_, ev := h.eng.stored(nil, toks(1, 4))
	h.eng.publish(true, ev) // lost: the next batch shows the gap
	for i := range 3 {
		_, ev := h.eng.stored(nil, toks(100*(i+1), 4))
		h.eng.publish(false, ev)
	}
	h.converged(t)
	// Every batch again, as a replay overtaking the queue would leave them.
	h.eng.mu.Lock()
	ring := slices.Clone(h.eng.ring)
	h.eng.mu.Unlock()
	for _, b := range ring {
		s, _ := vllm.ParseSeq(b[0])
		if err := h.eng.pub.SendMulti(zmq4.NewMsgFrom(vllm.PubFrames(h.eng.topic, s, b[1])...)); err != nil {
			t.Fatal(err)
		}
	}
	_, ev = h.eng.stored(nil, toks(900, 4))
	h.eng.publish(false, ev)
	h.converged(t)
	if n := value(h.hub.metrics.resets.WithLabelValues("restart")); n != 0 {
		t.Errorf("restart resets = %v, want 0: repeats are not a restart", n)
	}
}

// TestListenerWrappedReplay (issue 27): an engine whose replay buffer has
// wrapped gave a catch-up replay taken for its whole history when its
// buffer was smaller than vLLM's 10,000 the agent assumed, and a hot
// prompt's blocks were missing from the index. The size is the model's
// kv_events_buffer_steps now (ReplayBufferSteps): a replay that fills it
// may have lost the start, so the replica is untrusted, then exact after
// the engine clears its cache or restarts.
func TestListenerWrappedReplay(t *testing.T) {
	for _, after := range []string{"clear", "restart"} {
		t.Run(after, func(t *testing.T) {
			h := start(t, setup{buffer: 8}) // the listener is told 8 too
			for i := range 20 {
				_, ev := h.eng.stored(nil, toks(100*i, 4))
				h.eng.publish(false, ev)
			}
			h.converged(t)
			h.catchUp(t)
			h.untrusted(t)
			if got := h.reason(t); !strings.Contains(got, "replay cannot close the gap") {
				t.Errorf("reason %q; want the replay named", got)
			}
			switch after {
			case "clear":
				h.eng.publish(false, &vllm.AllBlocksCleared{})
			case "restart":
				h.eng.restartEngine()
			}
			_, ev := h.eng.stored(nil, toks(7000, 4))
			h.eng.publish(false, ev)
			h.converged(t)
		})
	}
}

// reason is the untrusted reason the hub's next full report carries.
func (h *harness) reason(t *testing.T) string {
	t.Helper()
	for _, b := range h.hub.Full() {
		if b.GetReplicaId() == "demo-0" {
			return b.GetUntrustedReason()
		}
	}
	t.Fatal("no report for demo-0")
	return ""
}

// TestListenerStreamTimeout (issue 27): an external engine whose publisher
// never connects — here an agent dialing a port where nothing publishes —
// left the replica trusted with an empty index. With a stream timeout the
// replica is untrusted once it passes, saying why; when a publisher comes
// and the engine's replay holds its whole history, it is exact again.
func TestListenerStreamTimeout(t *testing.T) {
	hub := newTestHub(t)
	eng, replay := newFakeEngine(t, 1000, vllm.EncodingMap, true, false)
	_ = eng.pub.Close() // this engine binds, later
	for i := range 3 {
		_, ev := eng.stored(nil, toks(100*i, 4))
		eng.publish(true, ev) // to no one: the agent is not connected
	}
	addr := freeTCP(t)
	cfg := DefaultListenerConfig()
	cfg.ReplicaID, cfg.UID, cfg.Endpoint, cfg.ReplayEndpoint, cfg.Topic, cfg.BlockSize = "demo-0", 7, "tcp://"+addr, replay, "kv", testBS
	cfg.Connect, cfg.StreamTimeout = true, 200*time.Millisecond
	l, err := hub.Listen(cfg, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	l.Engine(1)
	h := &harness{hub: hub, l: l, eng: eng}
	h.untrusted(t)
	if got := h.reason(t); !strings.Contains(got, "did not connect within 200ms") {
		t.Errorf("reason %q; want the stream timeout named", got)
	}
	eng.bindPub(addr)
	testkit.Wait(t, "the listener to connect and subscribe", eng.subscribed)
	h.converged(t)
	if got := h.reason(t); got != "" {
		t.Errorf("reason %q after recovery; want none", got)
	}
}

// TestListenerRedialsPaced (issue 27): with the publisher and replay ports
// swapped, every handshake is refused (a ROUTER is no publisher). zmq4
// redialed at once, about 2,000 times a second, each logged. Now redials
// back off (4 refusals take at least 50+100+200 ms, the least the jittered
// delays can be) and the refusal is logged once.
func TestListenerRedialsPaced(t *testing.T) {
	hub := newTestHub(t)
	_, replay := newFakeEngine(t, 1000, vllm.EncodingMap, true, false)
	logs := &countingHandler{}
	cfg := DefaultListenerConfig()
	cfg.ReplicaID, cfg.UID, cfg.Endpoint, cfg.Topic, cfg.BlockSize = "demo-0", 7, replay, "kv", testBS
	cfg.Connect = true
	began := time.Now()
	l, err := hub.Listen(cfg, slog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	testkit.Wait(t, "four refused handshakes", func() bool { return value(hub.metrics.framesRefused) >= 4 })
	if took := time.Since(began); took < 350*time.Millisecond {
		t.Errorf("4 refused dials in %v; want them spaced by the backoff (at least 350ms)", took)
	}
	if n := logs.warnings("peer refused"); n != 1 {
		t.Errorf("%d warnings of the refusal; want 1", n)
	}
}

// TestRedialPacer: the first dial and the first after a handshake go at
// once; the others wait delays doubling to redialMax.
func TestRedialPacer(t *testing.T) {
	p := newRedialPacer()
	var waits []time.Duration
	p.sleep = func(_ context.Context, d time.Duration) bool { waits = append(waits, d); return true }
	p.b = backoff.New(redialMin, redialMax, func() float64 { return 0 }) // each delay its least, d/2
	dial := p.wrap(func(context.Context, string, string) (net.Conn, error) { return nil, nil })
	for range 4 {
		_, _ = dial(t.Context(), "tcp", "x:1")
	}
	p.connected()
	_, _ = dial(t.Context(), "tcp", "x:1")
	_, _ = dial(t.Context(), "tcp", "x:1")
	// Six dials, four waits: none before the first dial or the first
	// after the handshake.
	want := []time.Duration{redialMin / 2, redialMin, 2 * redialMin, redialMin / 2}
	if !slices.Equal(waits, want) {
		t.Errorf("waits %v, want %v", waits, want)
	}
}

// countingHandler counts the records logged at Warn, by message.
type countingHandler struct {
	mu   sync.Mutex
	msgs []string
}

func (c *countingHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (c *countingHandler) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msgs = append(c.msgs, r.Message)
	return nil
}
func (c *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *countingHandler) WithGroup(string) slog.Handler      { return c }

func (c *countingHandler) warnings(part string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, m := range c.msgs {
		if strings.Contains(m, part) {
			n++
		}
	}
	return n
}

func newTestHub(t *testing.T) *Hub {
	t.Helper()
	hub, err := NewHub(quiet, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return hub
}

// freeTCP is a loopback address nothing listens on (for now).
func freeTCP(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}
