package kv

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/llmgw/llmgw/internal/testkit"
	"github.com/llmgw/llmgw/vllm"
)

var quiet = slog.New(slog.DiscardHandler)

// fakeEngine publishes KV events as vLLM does — a PUB socket connecting to
// the listener, seq from 0, a replay ROUTER serving its last `buffer`
// batches — with its cache kept in a set, the ground truth to compare.
type fakeEngine struct {
	t      *testing.T
	topic  string
	enc    vllm.Encoding
	asInt  bool
	pub    zmq4.Socket
	replay zmq4.Socket
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// silent makes the replay socket take requests and never answer.
	silent bool
	// parentZero sends a first block's parent as 0, not None (issue 14).
	parentZero bool

	mu     sync.Mutex
	seq    uint64
	buffer int
	ring   [][2][]byte // seq frame, payload
	held   map[uint64]int
	// off is the offload tiers' blocks by medium: sets, as vLLM's
	// offloading managers keep them.
	off map[string]map[uint64]bool
}

func newFakeEngine(t *testing.T, buffer int, enc vllm.Encoding, asInt, silent bool) (*fakeEngine, string) {
	t.Helper()
	return newFakeEngineOn(t, "tcp://127.0.0.1:0", buffer, enc, asInt, silent)
}

// newFakeEngineOn is newFakeEngine with its replay socket bound at replayEP.
func newFakeEngineOn(t *testing.T, replayEP string, buffer int, enc vllm.Encoding, asInt, silent bool) (*fakeEngine, string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	e := &fakeEngine{t: t, topic: "kv", enc: enc, asInt: asInt, buffer: buffer, cancel: cancel, silent: silent, held: map[uint64]int{}}
	e.replay = zmq4.NewRouter(ctx, zmq4.WithLogger(slog.NewLogLogger(quiet.Handler(), slog.LevelDebug)))
	if err := e.replay.Listen(replayEP); err != nil {
		t.Fatal(err)
	}
	e.pub = zmq4.NewPub(ctx, zmq4.WithLogger(slog.NewLogLogger(quiet.Handler(), slog.LevelDebug)))
	e.wg.Add(1)
	go e.serveReplay()
	t.Cleanup(e.close)
	if strings.HasPrefix(replayEP, "ipc://") {
		return e, replayEP
	}
	return e, "tcp://" + e.replay.Addr().String()
}

// connect connects the PUB socket to the listener, as vLLM does to a
// non-wildcard endpoint, and waits for the subscription: a PUB socket
// drops what no one has subscribed to.
func (e *fakeEngine) connect(endpoint string) {
	e.t.Helper()
	if err := e.pub.Dial(endpoint); err != nil {
		e.t.Fatal(err)
	}
	testkit.Wait(e.t, "the subscription to reach the engine", func() bool {
		return slices.Contains(e.pub.(zmq4.Topics).Topics(), "kv")
	})
}

func (e *fakeEngine) close() {
	e.cancel()
	_ = e.pub.Close()
	_ = e.replay.Close()
	e.wg.Wait()
}

func (e *fakeEngine) serveReplay() {
	defer e.wg.Done()
	for {
		msg, err := e.replay.Recv()
		if err != nil {
			if strings.Contains(err.Error(), "context canceled") {
				return
			}
			continue
		}
		id, start, err := vllm.ParseReplayRequest(msg.Frames)
		if err != nil || e.silent {
			continue
		}
		e.mu.Lock()
		var out [][2][]byte
		for _, b := range e.ring {
			if s, _ := vllm.ParseSeq(b[0]); s >= start {
				out = append(out, b)
			}
		}
		e.mu.Unlock()
		for _, b := range out {
			s, _ := vllm.ParseSeq(b[0])
			_ = e.replay.SendMulti(zmq4.NewMsgFrom(vllm.ReplayReplyFrames(id, e.topic, s, b[1])...))
		}
		_ = e.replay.SendMulti(zmq4.NewMsgFrom(vllm.ReplayReplyFrames(id, "", vllm.ReplayEndSeq, nil)...))
	}
}

// publish sends one batch (or, with drop, loses it on the way while keeping
// it in the replay buffer) and applies it to the ground truth.
func (e *fakeEngine) publish(drop bool, events ...vllm.Event) {
	e.t.Helper()
	payload, err := vllm.EncodeEventBatch(vllm.EventBatch{TS: 1, Events: events, DataParallelRank: vllm.Ptr(0)}, e.enc)
	if err != nil {
		e.t.Fatal(err)
	}
	e.mu.Lock()
	seq := e.seq
	e.seq++
	e.ring = append(e.ring, [2][]byte{vllm.SeqFrame(seq), payload})
	if len(e.ring) > e.buffer {
		e.ring = e.ring[1:]
	}
	for _, ev := range events {
		switch x := ev.(type) {
		case *vllm.BlockStored:
			if !x.OnGPU() {
				e.offTier(*x.Medium, x.BlockHashes, true)
				continue
			}
			for _, h := range x.BlockHashes {
				e.held[h.Uint64()]++
			}
		case *vllm.BlockRemoved:
			if !x.OnGPU() {
				e.offTier(*x.Medium, x.BlockHashes, false)
				continue
			}
			for _, h := range x.BlockHashes {
				if e.held[h.Uint64()]--; e.held[h.Uint64()] <= 0 {
					delete(e.held, h.Uint64())
				}
			}
		case *vllm.AllBlocksCleared:
			clear(e.held)
			clear(e.off)
		}
	}
	e.mu.Unlock()
	if drop {
		return
	}
	if err := e.pub.SendMulti(zmq4.NewMsgFrom(vllm.PubFrames(e.topic, seq, payload)...)); err != nil {
		e.t.Fatal(err)
	}
}

// offTier applies an offload tier's store or removal to the ground truth.
func (e *fakeEngine) offTier(medium string, hs []vllm.ExternalBlockHash, stored bool) {
	if e.off == nil {
		e.off = map[string]map[uint64]bool{}
	}
	if e.off[medium] == nil {
		e.off[medium] = map[uint64]bool{}
	}
	for _, h := range hs {
		if stored {
			e.off[medium][h.Uint64()] = true
		} else {
			delete(e.off[medium], h.Uint64())
		}
	}
}

// offTruth is offload tier medium's blocks, sorted.
func (e *fakeEngine) offTruth(medium string) []uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := []uint64{}
	for h := range e.off[medium] {
		out = append(out, h)
	}
	slices.Sort(out)
	return out
}

func (e *fakeEngine) truth() []uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]uint64, 0, len(e.held))
	for h := range e.held {
		out = append(out, h)
	}
	slices.Sort(out)
	return out
}

// stored builds the event for a prompt of tokens, in the engine's hash form.
func (e *fakeEngine) stored(parent *vllm.BlockHash, tokens []int) ([]vllm.BlockHash, *vllm.BlockStored) {
	e.t.Helper()
	p := vllm.NoneHash("0")
	if parent != nil {
		p = *parent
	}
	hs := chain(e.t, p, tokens)
	ev := storedEv(parent, hs, tokens)
	for i, h := range hs {
		ev.BlockHashes[i] = vllm.ExternalHash(h, e.asInt)
	}
	if parent != nil {
		ev.ParentBlockHash = vllm.Ptr(vllm.ExternalHash(*parent, e.asInt))
	} else if e.parentZero {
		ev.ParentBlockHash = vllm.Ptr(vllm.IntBlockHash(0))
	}
	return hs, ev
}

type harness struct {
	hub *Hub
	reg *prometheus.Registry
	l   *Listener
	eng *fakeEngine
}

type setup struct {
	buffer        int
	enc           vllm.Encoding
	bytes, silent bool
	noReplay      bool
	// The deviations of issue 14: batches from seqStart, parents of 0.
	seqStart   uint64
	parentZero bool
	// late leaves the engine's PUB unconnected: the test connects it.
	late bool
}

func start(t *testing.T, s setup) *harness {
	t.Helper()
	reg := prometheus.NewRegistry()
	hub, err := NewHub(quiet, reg)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultListenerConfig()
	cfg.ReplicaID, cfg.UID, cfg.Endpoint, cfg.Topic, cfg.BlockSize = "demo-0", 7, "tcp://127.0.0.1:0", "kv", testBS
	cfg.ReplayTimeout = 300 * time.Millisecond
	if s.buffer == 0 {
		s.buffer = 1000
	}
	cfg.ReplayBufferSteps = s.buffer
	eng, replay := newFakeEngine(t, s.buffer, s.enc, !s.bytes, s.silent)
	eng.seq, eng.parentZero = s.seqStart, s.parentZero
	if !s.noReplay {
		cfg.ReplayEndpoint = replay
	}
	l, err := hub.Listen(cfg, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	l.Engine(1)
	if !s.late {
		eng.connect(l.Endpoint())
	}
	return &harness{hub: hub, reg: reg, l: l, eng: eng}
}

// converged waits until the mirror holds the engine's set (trusted).
func (h *harness) converged(t *testing.T) {
	t.Helper()
	want := h.eng.truth()
	testkit.Wait(t, "the mirror to match the engine", func() bool {
		got, untrusted, _ := h.hub.Blocks("demo-0")
		return !untrusted && slices.Equal(got, want)
	})
}

func (h *harness) untrusted(t *testing.T) {
	t.Helper()
	testkit.Wait(t, "the replica to become untrusted", func() bool {
		_, u, _ := h.hub.Blocks("demo-0")
		return u
	})
}

func TestListenerMirrorsPublishedSet(t *testing.T) {
	for _, s := range []setup{{enc: vllm.EncodingMap}, {enc: vllm.EncodingArray}, {enc: vllm.EncodingMap, bytes: true}} {
		t.Run(s.enc.String()+map[bool]string{true: "-bytes", false: "-ints"}[s.bytes], func(t *testing.T) {
			h := start(t, s)
			a, ev := h.eng.stored(nil, toks(1, 12))
			h.eng.publish(false, ev)
			_, ev = h.eng.stored(&a[0], toks(100, 8))
			h.eng.publish(false, ev)
			// A second copy of a[0], then one removal: still held.
			_, ev = h.eng.stored(nil, toks(1, 4))
			h.eng.publish(false, ev, removedEv(a[0].Uint64()))
			h.eng.publish(false, &vllm.BlockRemoved{BlockHashes: []vllm.ExternalBlockHash{vllm.ExternalHash(a[2], !s.bytes)}})
			h.converged(t)
			if got, _, _ := h.hub.Blocks("demo-0"); !slices.Contains(got, a[0].Uint64()) || slices.Contains(got, a[2].Uint64()) {
				t.Errorf("copy counting: %v", got)
			}
			if n := value(h.hub.metrics.batches); n != 4 {
				t.Errorf("batches = %v, want 4", n)
			}
		})
	}
}

func TestListenerReplayRepairsDrop(t *testing.T) {
	h := start(t, setup{})
	a, ev := h.eng.stored(nil, toks(1, 8))
	h.eng.publish(false, ev)
	_, ev = h.eng.stored(&a[1], toks(50, 4))
	h.eng.publish(true, ev) // lost
	h.eng.publish(true, removedEv(a[0].Uint64()))
	_, ev = h.eng.stored(nil, toks(200, 8))
	h.eng.publish(false, ev)
	h.converged(t)
	if n := value(h.hub.metrics.replays.WithLabelValues("repaired")); n != 1 {
		t.Errorf("repaired replays = %v, want 1", n)
	}
	if n := value(h.hub.metrics.gaps); n != 1 {
		t.Errorf("gaps = %v, want 1", n)
	}
}

// TestListenerPollsAfterConnect: batches an engine published while its PUB
// had no subscriber went to no one, and an engine that then goes quiet
// publishes no live batch to show the gap. The poll after the publisher's
// handshake (pollAfterConnect) catches the mirror up by replay, and a
// later poll that finds nothing missing says so.
func TestListenerPollsAfterConnect(t *testing.T) {
	h := start(t, setup{late: true})
	a, ev := h.eng.stored(nil, toks(1, 8))
	h.eng.publish(true, ev) // no subscriber: lost on the way
	_, ev = h.eng.stored(&a[1], toks(50, 4))
	h.eng.publish(true, ev, removedEv(a[0].Uint64()))
	h.eng.connect(h.l.Endpoint())
	h.converged(t)
	if n := value(h.hub.metrics.replays.WithLabelValues("repaired")); n != 1 {
		t.Errorf("repaired replays = %v, want 1", n)
	}
	testkit.Wait(t, "a second poll finding nothing missed", func() bool {
		return value(h.hub.metrics.replays.WithLabelValues("current")) >= 1
	})
	if n := value(h.hub.metrics.gaps); n != 0 {
		t.Errorf("gaps = %v, want 0: no live batch showed one", n)
	}
	// Live batches after the poll apply in order, with no gap.
	_, ev = h.eng.stored(nil, toks(300, 4))
	h.eng.publish(false, ev)
	h.converged(t)
	if n := value(h.hub.metrics.gaps); n != 0 {
		t.Errorf("gaps = %v after a live batch, want 0", n)
	}
}

func TestListenerUnrepairableGap(t *testing.T) {
	tests := []struct {
		name   string
		s      setup
		result string
	}{
		{"buffer too small", setup{buffer: 1}, "unrepairable"},
		{"replay never answers", setup{silent: true}, "failed"},
		{"no replay endpoint", setup{noReplay: true}, "failed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, tc.s)
			a, ev := h.eng.stored(nil, toks(1, 8))
			h.eng.publish(false, ev)
			h.eng.publish(true, removedEv(a[0].Uint64()))
			h.eng.publish(true, removedEv(a[1].Uint64()))
			_, ev = h.eng.stored(nil, toks(300, 4))
			h.eng.publish(false, ev)
			h.untrusted(t)
			if n := value(h.hub.metrics.replays.WithLabelValues(tc.result)); n != 1 {
				t.Errorf("%s replays = %v, want 1", tc.result, n)
			}
			if got := testkit.Metric(t, h.reg, "llmgw_agent_kv_untrusted_replicas", nil); got != 1 {
				t.Errorf("untrusted gauge = %v", got)
			}
			// Reported as an untrusted reset with nothing held.
			full := h.hub.Full()
			if len(full) != 1 || !full[0].Untrusted || !full[0].Reset_ || len(full[0].Stored) != 0 {
				t.Fatalf("full copy while untrusted: %v", full)
			}
			// Events before a clear change nothing; the clear makes the set
			// known again.
			_, ev = h.eng.stored(nil, toks(400, 4))
			h.eng.publish(false, ev)
			h.eng.publish(false, &vllm.AllBlocksCleared{})
			_, ev = h.eng.stored(nil, toks(500, 8))
			h.eng.publish(false, ev)
			h.converged(t)
		})
	}
}

func TestListenerEngineRestart(t *testing.T) {
	h := start(t, setup{})
	_, ev := h.eng.stored(nil, toks(1, 8))
	h.eng.publish(false, ev)
	h.converged(t)
	h.hub.Changes()
	// The new process: empty cache, seq from 0 again.
	h.l.Engine(2)
	h.eng.mu.Lock()
	h.eng.seq, h.eng.ring = 0, nil
	clear(h.eng.held)
	h.eng.mu.Unlock()
	ch := h.hub.Changes()
	if len(ch) != 1 || !ch[0].Reset_ || ch[0].Incarnation != 2 || len(ch[0].Stored) != 0 {
		t.Fatalf("changes after restart: %v", ch)
	}
	_, ev = h.eng.stored(nil, toks(70, 4))
	h.eng.publish(false, ev)
	h.converged(t)
	if n := value(h.hub.metrics.gaps); n != 0 {
		t.Errorf("gaps = %v, want 0 (a restart is not a gap)", n)
	}
}

func TestListenerCatchUp(t *testing.T) {
	tests := []struct {
		name      string
		buffer    int
		untrusted bool
	}{
		{"whole history in the buffer", 100, false},
		{"history lost", 2, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// An engine that published before this listener existed: the
			// first listener sees it all, a second one (an agent restart)
			// must replay it.
			h := start(t, setup{buffer: tc.buffer})
			for i := range 4 {
				_, ev := h.eng.stored(nil, toks(10*i, 4))
				h.eng.publish(false, ev)
			}
			h.converged(t)
			h.catchUp(t)
			if tc.untrusted {
				h.untrusted(t)
				return
			}
			h.converged(t)
		})
	}
}

func TestListenerBindFailure(t *testing.T) {
	reg := prometheus.NewRegistry()
	hub, err := NewHub(quiet, reg)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultListenerConfig()
	cfg.ReplicaID, cfg.Endpoint = "demo-0", "tcp://127.0.0.1:0"
	l, err := hub.Listen(cfg, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cfg.Endpoint = l.Endpoint()
	if _, err := hub.Listen(cfg, quiet); err == nil {
		t.Fatal("second bind of the same port succeeded")
	}
	if n := value(hub.metrics.listenFailures); n != 1 {
		t.Errorf("listen failures = %v", n)
	}
}

func TestListenerConfigValidate(t *testing.T) {
	ok := DefaultListenerConfig()
	ok.ReplicaID, ok.Endpoint = "r", "tcp://127.0.0.1:5557"
	tests := []struct {
		name  string
		mod   func(*ListenerConfig)
		field string
	}{
		{"ok", func(*ListenerConfig) {}, ""},
		{"no replica", func(c *ListenerConfig) { c.ReplicaID = "" }, "replica_id"},
		{"ipc endpoint", func(c *ListenerConfig) { c.Endpoint, c.ReplayEndpoint = "ipc:///tmp/x.pub", "ipc:///tmp/x.replay" }, ""},
		{"empty ipc path", func(c *ListenerConfig) { c.Endpoint = "ipc://" }, "endpoint"},
		{"other scheme", func(c *ListenerConfig) { c.Endpoint = "inproc://x" }, "endpoint"},
		{"block cap", func(c *ListenerConfig) { c.MaxBlocks = 0 }, "max_blocks"},
		{"batch cap", func(c *ListenerConfig) { c.MaxBatchBytes = 0 }, "max_batch_bytes"},
		{"replay cap", func(c *ListenerConfig) { c.MaxReplayBytes = 0 }, "max_replay_bytes"},
		{"bad replay", func(c *ListenerConfig) { c.ReplayEndpoint = "x" }, "replay_endpoint"},
		{"block size", func(c *ListenerConfig) { c.BlockSize = 0 }, "block_size"},
		{"timeout", func(c *ListenerConfig) { c.ReplayTimeout = 0 }, "replay_timeout"},
		{"queue", func(c *ListenerConfig) { c.QueueSize = 0 }, "queue_size"},
		{"message cap", func(c *ListenerConfig) { c.MaxMessageBytes = 0 }, "max_message_bytes"},
		{"bound beyond loopback", func(c *ListenerConfig) { c.Endpoint = "tcp://0.0.0.0:5557" }, "allow_from"},
		{"bound beyond loopback, allow-list", func(c *ListenerConfig) {
			c.Endpoint, c.AllowFrom = "tcp://0.0.0.0:5557", []netip.Prefix{netip.MustParsePrefix("10.0.0.7/32")}
		}, ""},
		{"bound beyond loopback, same user", func(c *ListenerConfig) { c.Endpoint, c.SameUser = "tcp://0.0.0.0:5557", true }, ""},
		{"connects beyond loopback", func(c *ListenerConfig) { c.Endpoint, c.Connect = "tcp://10.0.0.7:5557", true }, ""},
		{"stream timeout", func(c *ListenerConfig) { c.StreamTimeout = -1 }, "stream_timeout"},
	}
	for _, tc := range tests {
		c := ok
		tc.mod(&c)
		err := c.Validate()
		if (err == nil) != (tc.field == "") || (err != nil && !strings.Contains(err.Error(), tc.field)) {
			t.Errorf("%s: %v, want an error naming %q", tc.name, err, tc.field)
		}
	}
}

// value reads a counter or gauge with a single series.
func value(c prometheus.Collector) float64 {
	ch := make(chan prometheus.Metric, 1)
	go func() { c.Collect(ch); close(ch) }()
	var v float64
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err == nil {
			v = d.GetCounter().GetValue() + d.GetGauge().GetValue()
		}
	}
	return v
}
