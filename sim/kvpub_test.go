package sim

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/llmgw/llmgw/internal/testkit"
	"github.com/llmgw/llmgw/vllm"
)

// kvHarness is a simulator serving on loopback with KV events on, and a
// SUB socket the test reads them from.
type kvHarness struct {
	t    *testing.T
	srv  *Server
	base string
	sub  zmq4.Socket
	msgs chan zmq4.Msg
	// replayAddr is the bound replay endpoint, when configured.
	replayAddr string
}

type kvSetup struct {
	// endpoint is the PUB endpoint; "connect" makes the test bind the SUB
	// first and the simulator connect to it, as the agent runs vLLM.
	endpoint string
	replay   bool
	buffer   int
	// bufferFlag is --sim-kv-buffer-steps (0: not given).
	bufferFlag int
	encoding   vllm.Encoding
	bytes      bool
	faults     Faults
	topic      string
	// seqStart and parentZero are the engine deviations
	// (--sim-kv-seq-start, --sim-kv-parent-zero).
	seqStart   uint64
	parentZero bool
	// cpuBlocks is the CPU tier's capacity (0: none).
	cpuBlocks int
}

func startKV(t *testing.T, k kvSetup) *kvHarness {
	t.Helper()
	h := &kvHarness{t: t, msgs: make(chan zmq4.Msg, 1024)}
	ctx, cancel := context.WithCancel(context.Background())
	h.sub = zmq4.NewSub(ctx)
	if err := h.sub.SetOption(zmq4.OptionSubscribe, k.topic); err != nil {
		t.Fatal(err)
	}
	endpoint := k.endpoint
	if endpoint == "connect" {
		if err := h.sub.Listen("tcp://127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		endpoint = "tcp://" + h.sub.Addr().String()
	}
	kv := map[string]any{"enable_kv_cache_events": true, "endpoint": endpoint, "topic": k.topic}
	if k.replay {
		kv["replay_endpoint"] = "tcp://127.0.0.1:0"
	}
	if k.buffer > 0 {
		kv["buffer_steps"] = k.buffer
	}
	raw, _ := json.Marshal(kv)
	cfg := testConfig()
	cfg.NumGPUBlocks, cfg.BlockSize, cfg.MaxModelLen = 24, 4, 96
	cfg.KVEventsConfig, cfg.KVEventsEncoding, cfg.KVEventsBytesHashes = string(raw), k.encoding, k.bytes
	cfg.Faults = k.faults
	cfg.KVBufferSteps = k.bufferFlag
	cfg.KVSeqStart, cfg.KVParentZero = k.seqStart, k.parentZero
	cfg.NumCPUBlocks = k.cpuBlocks
	srv, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.srv = srv
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.base = "http://" + ln.Addr().String()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	received := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
		_ = h.sub.Close()
		<-received
	})
	// Serve opens the sockets before it serves HTTP.
	testkit.Wait(t, "the simulator to serve", func() bool {
		resp, err := http.Get(h.base + "/health")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	pub, replay := srv.kv.addrs()
	if k.endpoint != "connect" {
		if err := h.sub.Dial(zmqAddr(pub)); err != nil {
			t.Fatal(err)
		}
	}
	if replay != nil {
		h.replayAddr = zmqAddr(replay)
	}
	go func() {
		defer close(received)
		for {
			m, err := h.sub.Recv()
			if err != nil {
				return
			}
			h.msgs <- m
		}
	}()
	// A PUB socket drops what no one has subscribed to yet.
	testkit.Wait(t, "the subscription to reach the publisher", srv.kv.subscribed)
	return h
}

func zmqAddr(a net.Addr) string {
	if a.Network() == "unix" {
		return "ipc://" + a.String()
	}
	return "tcp://" + a.String()
}

// complete sends a completion of a prompt of token ids.
func (h *kvHarness) complete(tokens ...int) {
	h.t.Helper()
	b, _ := json.Marshal(map[string]any{"model": "llama", "prompt": tokens, "max_tokens": 3})
	resp, body := post(h.t, h.base+"/v1/completions", string(b))
	if resp.StatusCode != http.StatusOK {
		h.t.Fatalf("completion: %d %s", resp.StatusCode, body)
	}
}

// settle waits until every cache change so far is in a batch and returns
// how many batches there have been.
func (h *kvHarness) settle() uint64 {
	var n uint64
	testkit.Wait(h.t, "the publisher to settle", func() (ok bool) { ok, n = h.srv.kv.quiet(); return ok })
	return n
}

func (h *kvHarness) setFaults(f Faults) {
	h.t.Helper()
	b, _ := json.Marshal(f)
	if resp, body := post(h.t, h.base+"/sim/faults", string(b)); resp.StatusCode != http.StatusOK {
		h.t.Fatalf("faults: %d %s", resp.StatusCode, body)
	}
}

// recv reads the next published message.
func (h *kvHarness) recv() (topic string, seq uint64, payload []byte) {
	h.t.Helper()
	select {
	case m := <-h.msgs:
		topic, seq, payload, err := vllm.ParsePubFrames(m.Frames)
		if err != nil {
			h.t.Fatal(err)
		}
		return topic, seq, payload
	case <-time.After(10 * time.Second):
		h.t.Fatal("timed out waiting for a kv event batch")
	}
	return "", 0, nil
}

// blocks is GET /sim/blocks.
func (h *kvHarness) blocks() BlocksResponse {
	h.t.Helper()
	resp, err := http.Get(h.base + "/sim/blocks")
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	var b BlocksResponse
	if err := json.NewDecoder(resp.Body).Decode(&b); err != nil {
		h.t.Fatal(err)
	}
	return b
}

// mirror is what a subscriber knows of the cache: the agent's job, in
// miniature.
type mirror map[uint64]bool

func (m mirror) apply(t *testing.T, payload []byte, wantBytes bool) {
	t.Helper()
	b, err := vllm.DecodeEventBatch(payload)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Skipped) > 0 || b.DataParallelRank == nil || *b.DataParallelRank != 0 {
		t.Errorf("batch: skipped %v, rank %v", b.Skipped, b.DataParallelRank)
	}
	hashes := func(hs []vllm.ExternalBlockHash) []uint64 {
		var out []uint64
		for _, h := range hs {
			if h.IsBytes() != wantBytes {
				t.Errorf("hash %v: bytes form %v, want %v", h, h.IsBytes(), wantBytes)
			}
			out = append(out, h.Uint64())
		}
		return out
	}
	for _, ev := range b.Events {
		switch e := ev.(type) {
		case *vllm.BlockStored:
			if !e.OnGPU() || !e.FullAttention() || len(e.TokenIDs) != e.BlockSize*len(e.BlockHashes) {
				t.Errorf("BlockStored %+v", e)
			}
			for _, h := range hashes(e.BlockHashes) {
				m[h] = true
			}
		case *vllm.BlockRemoved:
			for _, h := range hashes(e.BlockHashes) {
				if !m[h] {
					t.Errorf("removal of %d, which was never stored", h)
				}
				delete(m, h)
			}
		case *vllm.AllBlocksCleared:
			clear(m)
		}
	}
}

func (m mirror) sorted() []uint64 {
	out := make([]uint64, 0, len(m))
	for h := range m {
		out = append(out, h)
	}
	slices.Sort(out)
	return out
}

func prompt(prefix, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = prefix*1000 + i + 1
	}
	return out
}

// The events of a few requests — with shared prefixes, evictions (the
// cache holds 24 blocks) and a reset — rebuild exactly the simulator's
// block set, in every encoding, hash form and socket mode.
func TestKVEventsMirrorTheCache(t *testing.T) {
	ipc := "ipc://" + filepath.Join(t.TempDir(), "kv.sock")
	// An engine killed in the agent's socket directory leaves its socket
	// file behind; the next one binds over it, as libzmq does.
	stale, err := net.Listen("unix", strings.TrimPrefix(ipc, "ipc://"))
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = stale.Close()
	for _, tc := range []struct {
		name string
		k    kvSetup
	}{
		{"map ints bind ipv6 wildcard-like", kvSetup{endpoint: "tcp://[::1]:0", topic: "kv-events"}},
		{"array bytes connect", kvSetup{endpoint: "connect", encoding: vllm.EncodingArray, bytes: true}},
		{"map bytes ipc", kvSetup{endpoint: ipc, bytes: true, topic: "kv"}},
		{"array ints connect", kvSetup{endpoint: "connect", encoding: vllm.EncodingArray, topic: "kv"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startKV(t, tc.k)
			m := mirror{}
			var next uint64
			drain := func() {
				n := h.settle()
				for ; next < n; next++ {
					topic, seq, payload := h.recv()
					if topic != tc.k.topic || seq != next {
						t.Fatalf("message topic %q seq %d, want %q %d", topic, seq, tc.k.topic, next)
					}
					// The first event's header says which encoding it is
					// (read when the events array has a one-byte header).
					if first := payload[11]; payload[10]&0xf0 == 0x90 && (first&0xf0 == 0x90) != (tc.k.encoding == vllm.EncodingArray) {
						t.Errorf("event header 0x%02x for encoding %v", first, tc.k.encoding)
					}
					m.apply(t, payload, tc.k.bytes)
				}
			}
			for i, p := range [][]int{prompt(1, 20), prompt(1, 30), prompt(2, 40), prompt(3, 50), prompt(1, 20)} {
				h.complete(p...)
				drain()
				if got, want := m.sorted(), h.blocks().BlockHashes; !slices.Equal(got, want) {
					t.Fatalf("after request %d: mirror %v, simulator %v", i, got, want)
				}
			}
			if len(m) == 0 {
				t.Fatal("no blocks cached: the test proves nothing")
			}
			if resp, body := post(t, h.base+"/reset_prefix_cache", ""); resp.StatusCode != http.StatusOK {
				t.Fatalf("reset: %d %s", resp.StatusCode, body)
			}
			drain()
			if len(m) != 0 || len(h.blocks().BlockHashes) != 0 {
				t.Errorf("after reset: mirror %v, simulator %v", m.sorted(), h.blocks().BlockHashes)
			}
		})
	}
}

// replay asks the replay socket for every batch from start on.
func (h *kvHarness) replay(start uint64) []vllm.ReplayReply {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial(h.replayAddr); err != nil {
		h.t.Fatal(err)
	}
	if err := d.SendMulti(zmq4.NewMsgFrom(vllm.ReplayRequestFrames(start)...)); err != nil {
		h.t.Fatal(err)
	}
	var out []vllm.ReplayReply
	for {
		m, err := d.Recv()
		if err != nil {
			h.t.Fatal(err)
		}
		r, err := vllm.ParseReplayReply(m.Frames)
		if err != nil {
			h.t.Fatal(err)
		}
		out = append(out, r)
		if r.End {
			if r.Seq != vllm.ReplayEndSeq {
				h.t.Errorf("end marker seq %x", r.Seq)
			}
			return out
		}
	}
}

// A dropped batch leaves a gap in seq; the replay socket fills it, and the
// mirror is exact again. With a replay buffer too small, it cannot.
func TestKVEventsDropGapAndReplay(t *testing.T) {
	for _, tc := range []struct {
		name       string
		buffer     int
		bufferFlag int
		repairable bool
	}{
		{"repairable", 100, 0, true},
		{"buffer too small", 1, 0, false},
		// The agent writes --kv-events-config; the flag still shrinks it.
		{"buffer too small by flag", 100, 1, false},
		{"buffer grown by flag", 1, 100, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startKV(t, kvSetup{endpoint: "connect", replay: true, buffer: tc.buffer, bufferFlag: tc.bufferFlag, topic: "kv"})
			m := mirror{}
			h.complete(prompt(1, 20)...)
			n1 := h.settle()
			for range n1 {
				_, _, p := h.recv()
				m.apply(t, p, false)
			}

			h.setFaults(Faults{KVDropRate: 1})
			h.complete(prompt(2, 20)...)
			n2 := h.settle()
			h.setFaults(Faults{})
			h.complete(prompt(3, 20)...)
			n3 := h.settle()
			if n2 == n1 || n3 == n2 {
				t.Fatalf("batches: %d, %d, %d: each request should have made some", n1, n2, n3)
			}
			// The next message received is past the gap.
			_, seq, p := h.recv()
			if seq != n2 {
				t.Fatalf("first seq after the drop %d, want %d (a gap from %d)", seq, n2, n1)
			}
			later := [][]byte{p}
			for range n3 - n2 - 1 {
				_, _, p := h.recv()
				later = append(later, p)
			}

			replies := h.replay(n1)
			if !tc.repairable {
				if len(replies) != 2 || replies[0].Seq != n3-1 {
					t.Fatalf("replay with a 1-batch buffer: %+v, want only seq %d and the end", replies, n3-1)
				}
				return
			}
			if got := uint64(len(replies)); got != n3-n1+1 {
				t.Fatalf("replay from %d: %d replies, want %d and the end", n1, got, n3-n1)
			}
			for i, r := range replies[:len(replies)-1] {
				if r.Seq != n1+uint64(i) || r.Topic != "kv" {
					t.Fatalf("replay %d: seq %d topic %q", i, r.Seq, r.Topic)
				}
				if r.Seq < n2 {
					m.apply(t, r.Payload, false) // the lost batches
				}
			}
			for _, p := range later {
				m.apply(t, p, false)
			}
			if got, want := m.sorted(), h.blocks().BlockHashes; !slices.Equal(got, want) {
				t.Errorf("after replay: mirror %v, simulator %v", got, want)
			}
		})
	}
}

// The reorder fault sends a batch after the one that follows it.
func TestKVEventsReorder(t *testing.T) {
	h := startKV(t, kvSetup{endpoint: "connect", faults: Faults{KVReorderRate: 1}})
	h.complete(prompt(1, 8)...)
	h.settle()
	h.complete(prompt(2, 8)...)
	if n := h.settle(); n < 2 {
		t.Fatalf("%d batches", n)
	}
	_, first, _ := h.recv()
	_, second, _ := h.recv()
	if first != second+1 {
		t.Errorf("received seq %d then %d: want a later batch first", first, second)
	}
}

func TestBindsEndpoint(t *testing.T) {
	for _, tc := range []struct {
		ep   string
		bind bool
	}{
		{"tcp://*:5557", true},
		{"tcp://[::]:5557", true},
		{"tcp://[::1]:5557", true},
		{"ipc:///tmp/kv.sock", true},
		{"inproc://kv", true},
		{"tcp://127.0.0.1:5557", false},
		{"tcp://indexer:5557", false},
	} {
		if got := BindsEndpoint(tc.ep); got != tc.bind {
			t.Errorf("BindsEndpoint(%q) = %v, want %v", tc.ep, got, tc.bind)
		}
	}
}

func TestParseKVEventsConfig(t *testing.T) {
	replay := "tcp://*:5558"
	for _, tc := range []struct {
		name    string
		raw     string
		want    KVEventsConfig
		enabled bool
		err     string
	}{
		{"empty is off", "", KVEventsConfig{Publisher: "null", Endpoint: "tcp://*:5557", BufferSteps: 10000, HWM: 100000, MaxQueueSize: 100000}, false, ""},
		{"enabled defaults to zmq", `{"enable_kv_cache_events":true,"replay_endpoint":"tcp://*:5558","topic":"kv"}`,
			KVEventsConfig{EnableKVCacheEvents: true, Publisher: "zmq", Endpoint: "tcp://*:5557", ReplayEndpoint: &replay,
				BufferSteps: 10000, HWM: 100000, MaxQueueSize: 100000, Topic: "kv"}, true, ""},
		{"null publisher", `{"enable_kv_cache_events":true,"publisher":"null"}`,
			KVEventsConfig{EnableKVCacheEvents: true, Publisher: "null", Endpoint: "tcp://*:5557", BufferSteps: 10000, HWM: 100000, MaxQueueSize: 100000}, false, ""},
		{"unknown key", `{"enable_kv_cache_events":true,"endpont":"x"}`, KVEventsConfig{}, false, "unknown field"},
		{"bad publisher", `{"publisher":"kafka"}`, KVEventsConfig{}, false, "publisher"},
		{"bad endpoint", `{"endpoint":"127.0.0.1:5557"}`, KVEventsConfig{}, false, "endpoint"},
		{"bad scheme", `{"replay_endpoint":"udp://x:1"}`, KVEventsConfig{}, false, "replay_endpoint"},
		{"buffer", `{"buffer_steps":0}`, KVEventsConfig{}, false, "buffer_steps"},
		{"not json", `{`, KVEventsConfig{}, false, "--kv-events-config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseKVEventsConfig(tc.raw)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "--kv-events-config") {
					t.Fatalf("error %v, want one naming --kv-events-config and %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
			if got.Enabled() != tc.enabled {
				t.Errorf("Enabled() = %v", got.Enabled())
			}
		})
	}
}

// --sim-kv-buffer-steps replaces the config's buffer_steps, and only
// that; 0 keeps it and a negative value is refused, naming the flag.
func TestConfigKVBufferSteps(t *testing.T) {
	for _, tc := range []struct {
		name   string
		raw    string
		flag   int
		buffer int
		err    string
	}{
		{"not given keeps vLLM's default", `{"enable_kv_cache_events":true}`, 0, 10000, ""},
		{"not given keeps the config's", `{"enable_kv_cache_events":true,"buffer_steps":7}`, 0, 7, ""},
		{"overrides the config's", `{"enable_kv_cache_events":true,"buffer_steps":7}`, 1, 1, ""},
		{"overrides the default", `{"enable_kv_cache_events":true}`, 3, 3, ""},
		{"negative", `{"enable_kv_cache_events":true}`, -1, 0, "--sim-kv-buffer-steps"},
		{"a bad config is still refused", `{"buffer_steps":0}`, 5, 0, "buffer_steps"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.KVEventsConfig, cfg.KVBufferSteps = tc.raw, tc.flag
			err := cfg.Validate()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Validate: %v, want an error naming %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			kv, err := cfg.KVEvents()
			if err != nil {
				t.Fatal(err)
			}
			if kv.BufferSteps != tc.buffer || !kv.Enabled() {
				t.Errorf("buffer_steps %d (enabled %v), want %d", kv.BufferSteps, kv.Enabled(), tc.buffer)
			}
		})
	}
}

// A config the simulator cannot publish with is refused up front, naming
// the flag; a PUB endpoint already taken fails Serve, not silently.
func TestKVEventsConfigErrors(t *testing.T) {
	cfg := testConfig()
	cfg.KVEventsConfig = `{"enable_kv_cache_events":true,"buffer_steps":-1}`
	cfg.Faults.KVDropRate = 2
	cfg.KVSeqStart = vllm.ReplayEndSeq // the end marker's seq
	_, err := New(cfg, nil)
	for _, want := range []string{"buffer_steps", "--sim-kv-drop-rate", "--sim-kv-seq-start"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New: %v, want an error naming %s", err, want)
		}
	}

	taken, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg = testConfig()
	cfg.KVEventsConfig = `{"enable_kv_cache_events":true,"endpoint":"tcp://` + taken.Addr().String() + `"}`
	srv, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(context.Background(), ln); err == nil || !strings.Contains(err.Error(), "bind") {
		t.Errorf("Serve with the PUB port taken: %v", err)
	}
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("listener left open: %v", err)
	}
}

// --sim-kv-seq-start and --sim-kv-parent-zero make the simulator the
// vLLM-compatible engine of issue 14: batches numbered from 1, live and in
// replay, and a first block's parent sent as 0 in the array form. The
// events still describe the cache exactly.
func TestKVEventsDeviations(t *testing.T) {
	h := startKV(t, kvSetup{endpoint: "connect", replay: true, encoding: vllm.EncodingArray, topic: "kv",
		seqStart: 1, parentZero: true})
	h.complete(prompt(1, 8)...)  // two blocks of 4, from the prompt's start
	h.complete(prompt(1, 12)...) // one more, chained to the second
	n := h.settle()
	if n != 1+2 {
		t.Errorf("next seq %d after two batches from 1, want 3", n)
	}
	m := mirror{}
	var parents []any
	for want := uint64(1); want < n; want++ {
		_, seq, payload := h.recv()
		if seq != want {
			t.Fatalf("batch seq %d, want %d", seq, want)
		}
		m.apply(t, payload, false)
		var batch []any
		if err := msgpack.Unmarshal(payload, &batch); err != nil {
			t.Fatal(err)
		}
		for _, ev := range batch[1].([]any) {
			if e := ev.([]any); e[0] == vllm.TagBlockStored {
				parents = append(parents, e[2])
			}
		}
	}
	if len(parents) != 2 || !isZero(parents[0]) || isZero(parents[1]) || parents[1] == nil {
		t.Errorf("parents sent %v: want 0 for the first block, then a hash", parents)
	}
	if got, want := m.sorted(), h.blocks().BlockHashes; !slices.Equal(got, want) {
		t.Errorf("mirror %v, simulator %v", got, want)
	}
	// The replay buffer is the engine's whole history: from 1.
	rs := h.replay(0)
	if len(rs) != 3 || rs[0].Seq != 1 || rs[1].Seq != 2 || !rs[2].End {
		t.Errorf("replay from 0: %d replies, first seq %v", len(rs), rs)
	}
}

func isZero(v any) bool {
	switch x := v.(type) {
	case int8:
		return x == 0
	case uint8:
		return x == 0
	case int64:
		return x == 0
	case uint64:
		return x == 0
	}
	return false
}
