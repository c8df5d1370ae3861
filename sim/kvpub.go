package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/llmgw/llmgw/vllm"
)

// KV-cache events (design §8): the simulator publishes what its prefix cache
// stores and evicts exactly as vLLM's ZmqEventPublisher does, so the
// agent's KV listener and mirror — and through them the router's precise
// index (design §7.5 tier 2) — can be built and tested without a GPU. The
// events are taken from the cache itself (CacheObserver), so they agree
// with what the simulator will actually hit, which is the property the
// whole tier rests on.

// KVEventsConfig is vLLM's KVEventsConfig, given as --kv-events-config
// JSON (vllm/config/kv_events.py). Unknown keys are refused, as vLLM's pydantic
// config refuses them.
type KVEventsConfig struct {
	EnableKVCacheEvents bool `json:"enable_kv_cache_events"`
	// Publisher is "zmq" or "null"; empty means "zmq" when events are
	// enabled, as vLLM since #26915.
	Publisher string `json:"publisher"`
	// Endpoint is where the PUB socket binds or connects (BindsEndpoint).
	Endpoint string `json:"endpoint"`
	// ReplayEndpoint, when set, is where the ROUTER socket that answers
	// replay requests binds.
	ReplayEndpoint *string `json:"replay_endpoint"`
	// BufferSteps is how many of the latest batches replay can return.
	BufferSteps int `json:"buffer_steps"`
	// HWM is the PUB socket's high-water mark in messages; past it, new
	// messages are dropped (0: no limit).
	HWM int `json:"hwm"`
	// MaxQueueSize is vLLM's in-process queue size; accepted and unused,
	// since the simulator's queue is the pending events of one step.
	MaxQueueSize int `json:"max_queue_size"`
	// Topic is frame 0 of every message; subscribers filter on it.
	Topic string `json:"topic"`
}

// DefaultKVEventsConfig is vLLM's defaults.
func DefaultKVEventsConfig() KVEventsConfig {
	return KVEventsConfig{Endpoint: "tcp://*:5557", BufferSteps: 10_000, HWM: 100_000, MaxQueueSize: 100_000}
}

// ParseKVEventsConfig reads --kv-events-config over vLLM's defaults. An
// empty string is the defaults: events off.
func ParseKVEventsConfig(raw string) (KVEventsConfig, error) {
	c := DefaultKVEventsConfig()
	if strings.TrimSpace(raw) != "" {
		dec := json.NewDecoder(strings.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			return c, fmt.Errorf("--kv-events-config: %w", err)
		}
		if dec.More() {
			return c, errors.New("--kv-events-config: data after the JSON object")
		}
	}
	if c.Publisher == "" {
		c.Publisher = "null"
		if c.EnableKVCacheEvents {
			c.Publisher = "zmq"
		}
	}
	return c, c.Validate()
}

// Enabled reports whether events are published.
func (c KVEventsConfig) Enabled() bool { return c.EnableKVCacheEvents && c.Publisher == "zmq" }

// Validate checks the fields vLLM would refuse or that cannot work.
func (c KVEventsConfig) Validate() error {
	var errs []error
	if c.Publisher != "zmq" && c.Publisher != "null" {
		errs = append(errs, fmt.Errorf("--kv-events-config: publisher %q: must be zmq or null", c.Publisher))
	}
	if err := checkZMQEndpoint(c.Endpoint); err != nil {
		errs = append(errs, fmt.Errorf("--kv-events-config: endpoint: %w", err))
	}
	if c.ReplayEndpoint != nil {
		if err := checkZMQEndpoint(*c.ReplayEndpoint); err != nil {
			errs = append(errs, fmt.Errorf("--kv-events-config: replay_endpoint: %w", err))
		}
	}
	if c.BufferSteps < 1 {
		errs = append(errs, fmt.Errorf("--kv-events-config: buffer_steps %d: must be at least 1", c.BufferSteps))
	}
	if c.HWM < 0 {
		errs = append(errs, fmt.Errorf("--kv-events-config: hwm %d: must not be negative", c.HWM))
	}
	return errors.Join(errs...)
}

func checkZMQEndpoint(ep string) error {
	scheme, addr, ok := strings.Cut(ep, "://")
	if !ok || addr == "" {
		return fmt.Errorf("%q: want tcp://host:port, ipc://path or inproc://name", ep)
	}
	switch scheme {
	case "tcp":
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return fmt.Errorf("%q: %w", ep, err)
		}
	case "ipc", "inproc":
	default:
		return fmt.Errorf("%q: scheme %q: want tcp, ipc or inproc", ep, scheme)
	}
	return nil
}

// BindsEndpoint is vLLM's rule (ZmqEventPublisher._socket_setup): the PUB
// socket binds when the endpoint has a wildcard ("*" or "::") or is ipc
// or inproc, and otherwise connects — so an engine given a plain address
// connects out to a subscriber that bound first, which is how the agent
// runs it (design §6).
func BindsEndpoint(ep string) bool {
	return strings.Contains(ep, "*") || strings.Contains(ep, "::") ||
		strings.HasPrefix(ep, "ipc://") || strings.HasPrefix(ep, "inproc://")
}

// kvBatch is one published batch, kept for replay.
type kvBatch struct {
	seq     uint64
	payload []byte
}

// kvPublisher turns prefix-cache changes into vLLM's KV-event batches and
// publishes them.
//
// The cache reports changes with the engine's lock held, so the observer
// methods only append to pending and wake the sender. The sender takes
// everything pending as one batch — the simulator's "engine step": what
// changed since the last batch — encodes it, numbers it and sends it.
// vLLM likewise sends at most one batch per step.
//
// Lifetime: open binds or dials the sockets; run owns every goroutine
// (sender, replay server, dialer) and returns once all have stopped.
// Shutdown order: the caller stops the HTTP server first, so no more
// changes arrive; run then sends what is pending (not after a crash: a
// dead process flushes nothing), closes the sockets, which ends the
// replay server and any dial, and waits for them.
type kvPublisher struct {
	cfg       KVEventsConfig
	enc       vllm.Encoding
	asInt     bool
	blockSize int
	// parentZero sends a first block's parent as 0 (--sim-kv-parent-zero).
	parentZero bool
	log        *slog.Logger
	now        func() time.Time
	faults     func() Faults
	rng        *rand.Rand // the sender's only

	mu      sync.Mutex // guards pending and flushing
	pending []vllm.Event
	// flushing is true from taking pending until the batch has its seq
	// and its fate (sent, dropped, held): for tests that wait for quiet.
	flushing bool
	wake     chan struct{}

	ringMu sync.Mutex // guards ring and nextSeq
	ring   []kvBatch  // the last BufferSteps batches, oldest first
	// nextSeq is the seq of the next batch: from 0 (or --sim-kv-seq-start),
	// per process.
	nextSeq uint64

	sockCtx    context.Context
	closeSocks context.CancelFunc
	pub        zmq4.Socket
	replay     zmq4.Socket // nil without a replay endpoint
	wg         sync.WaitGroup
}

func newKVPublisher(cfg *Config, kv KVEventsConfig, log *slog.Logger, now func() time.Time, faults func() Faults) *kvPublisher {
	return &kvPublisher{
		cfg: kv, enc: cfg.KVEventsEncoding, asInt: !cfg.KVEventsBytesHashes, blockSize: cfg.BlockSize,
		log: log.With("component", "kv-events"), now: now, faults: faults,
		rng:  rand.New(rand.NewPCG(uint64(cfg.Seed), 0x6b762d6576)),
		wake: make(chan struct{}, 1), nextSeq: cfg.KVSeqStart, parentZero: cfg.KVParentZero,
	}
}

// BlocksStored implements CacheObserver.
func (p *kvPublisher) BlocksStored(parent *vllm.BlockHash, blocks []StoredBlock) {
	e := &vllm.BlockStored{
		BlockHashes: make([]vllm.ExternalBlockHash, len(blocks)),
		BlockSize:   p.blockSize,
		Medium:      vllm.Ptr(vllm.MediumGPU),
		// One entry per block, None for blocks without extra keys, as
		// vLLM sends [None, ...] for a base-model request.
		ExtraKeys:       make([]vllm.ExtraKeys, len(blocks)),
		GroupIdx:        vllm.Ptr(0),
		KVCacheSpecKind: vllm.Ptr(vllm.KVCacheSpecFullAttention),
	}
	switch {
	case parent != nil:
		e.ParentBlockHash = vllm.Ptr(vllm.ExternalHash(*parent, p.asInt))
	case p.parentZero:
		// A vLLM-compatible engine's way of saying "none" (issue 14).
		e.ParentBlockHash = vllm.Ptr(vllm.IntBlockHash(0))
	}
	for i, b := range blocks {
		e.BlockHashes[i] = vllm.ExternalHash(b.Hash, p.asInt)
		e.TokenIDs = append(e.TokenIDs, b.Tokens...)
		if b.LoRAName != "" {
			// The adapter's name is every block's extra key.
			e.ExtraKeys[i] = vllm.ExtraKeys{b.LoRAName}
		}
	}
	if len(blocks) > 0 && blocks[0].LoRAName != "" {
		e.LoRAName, e.LoRAID = vllm.Ptr(blocks[0].LoRAName), vllm.Ptr(blocks[0].LoRAID)
	}
	p.add(e)
}

// BlocksRemoved implements CacheObserver; the cache reports one hash per
// call, as vLLM's block pool emits one event per evicted block.
func (p *kvPublisher) BlocksRemoved(hashes []vllm.BlockHash) {
	e := &vllm.BlockRemoved{BlockHashes: make([]vllm.ExternalBlockHash, len(hashes)),
		Medium: vllm.Ptr(vllm.MediumGPU), GroupIdx: vllm.Ptr(0)}
	for i, h := range hashes {
		e.BlockHashes[i] = vllm.ExternalHash(h, p.asInt)
	}
	p.add(e)
}

// OffloadStored implements TierObserver with the event vLLM's
// OffloadingConnector.take_events makes of a completed store: every block
// in one BlockStored with medium "CPU", no parent, no tokens, no adapter,
// the offloaded block size (the GPU's: the simulator offloads block for
// block), and the fields it leaves at their defaults (extra_keys,
// group_idx, the spec kind) None.
func (p *kvPublisher) OffloadStored(hashes []vllm.BlockHash) {
	e := &vllm.BlockStored{BlockHashes: make([]vllm.ExternalBlockHash, len(hashes)), TokenIDs: []int{},
		BlockSize: p.blockSize, Medium: vllm.Ptr(vllm.MediumCPU)}
	for i, h := range hashes {
		e.BlockHashes[i] = vllm.ExternalHash(h, p.asInt)
	}
	p.add(e)
}

// OffloadRemoved implements TierObserver: the blocks one store evicted, in
// one BlockRemoved with medium "CPU" and no group_idx, as the connector
// sends them.
func (p *kvPublisher) OffloadRemoved(hashes []vllm.BlockHash) {
	e := &vllm.BlockRemoved{BlockHashes: make([]vllm.ExternalBlockHash, len(hashes)), Medium: vllm.Ptr(vllm.MediumCPU)}
	for i, h := range hashes {
		e.BlockHashes[i] = vllm.ExternalHash(h, p.asInt)
	}
	p.add(e)
}

// AllBlocksCleared implements CacheObserver.
func (p *kvPublisher) AllBlocksCleared() { p.add(&vllm.AllBlocksCleared{}) }

func (p *kvPublisher) add(e vllm.Event) {
	p.mu.Lock()
	p.pending = append(p.pending, e)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default: // already woken; the sender will take this event too
	}
}

// open creates the sockets: PUB bound or connected by vLLM's rule, and the
// replay ROUTER, always bound. A bind failure is returned; a connect is
// retried in the background for as long as the publisher runs, as libzmq
// does, since the subscriber may come up later.
func (p *kvPublisher) open() error {
	p.sockCtx, p.closeSocks = context.WithCancel(context.Background())
	zlog := slog.NewLogLogger(p.log.Handler(), slog.LevelDebug)
	bind := BindsEndpoint(p.cfg.Endpoint)
	// A connecting PUB redials when its subscriber goes away and comes
	// back (an agent restarting), as libzmq does. zmq4 would also "redial"
	// the address of a bound socket when a subscriber leaves, so only a
	// connecting socket gets it.
	p.pub = zmq4.NewPub(p.sockCtx, zmq4.WithLogger(zlog), zmq4.WithAutomaticReconnect(!bind),
		zmq4.WithDialerMaxRetries(-1), zmq4.WithDialerRetry(100*time.Millisecond))
	if err := p.pub.SetOption(zmq4.OptionHWM, p.cfg.HWM); err != nil {
		p.closeSocks()
		return fmt.Errorf("sim: kv events: set hwm: %w", err)
	}
	if bind {
		removeStaleSocket(p.cfg.Endpoint)
		if err := p.pub.Listen(p.cfg.Endpoint); err != nil {
			p.closeAll()
			return fmt.Errorf("sim: kv events: bind %s: %w", p.cfg.Endpoint, err)
		}
	} else {
		p.wg.Go(func() {
			if err := p.pub.Dial(p.cfg.Endpoint); err != nil && p.sockCtx.Err() == nil {
				p.log.Error("kv events: cannot connect", "endpoint", p.cfg.Endpoint, "err", err)
			}
		})
	}
	if p.cfg.ReplayEndpoint != nil {
		p.replay = zmq4.NewRouter(p.sockCtx, zmq4.WithLogger(zlog))
		removeStaleSocket(*p.cfg.ReplayEndpoint)
		if err := p.replay.Listen(*p.cfg.ReplayEndpoint); err != nil {
			p.closeAll()
			return fmt.Errorf("sim: kv events: bind replay %s: %w", *p.cfg.ReplayEndpoint, err)
		}
		p.wg.Go(p.serveReplay)
	}
	pubAddr, replayAddr := p.addrs()
	p.log.Info("publishing kv cache events", "endpoint", p.cfg.Endpoint, "bind", bind, "bound", fmt.Sprint(pubAddr),
		"replay_bound", fmt.Sprint(replayAddr), "topic", p.cfg.Topic, "encoding", p.enc.String(), "int_hashes", p.asInt)
	return nil
}

// removeStaleSocket removes the socket file an ipc:// endpoint names, left
// by an earlier process, as libzmq does before it binds one: otherwise the
// bind fails with the address in use, and an engine restarted by the agent
// in its socket directory (design §6 "KV events") could not publish. Only
// a socket is removed.
func removeStaleSocket(ep string) {
	path, ok := strings.CutPrefix(ep, "ipc://")
	if !ok {
		return
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() == os.ModeSocket {
		_ = os.Remove(path)
	}
}

// closeAll closes the sockets and waits for the goroutines they end.
func (p *kvPublisher) closeAll() {
	p.closeSocks()
	_ = p.pub.Close()
	if p.replay != nil {
		_ = p.replay.Close()
	}
	p.wg.Wait()
}

// run sends batches until ctx ends, then — unless crashed is closed —
// sends what is pending, and closes everything open started.
func (p *kvPublisher) run(ctx context.Context, crashed <-chan struct{}) {
	defer p.closeAll()
	var held *kvBatch // a batch held back by the reorder fault
	for {
		select {
		case <-p.wake:
			p.flush(&held)
		case <-ctx.Done():
			select {
			case <-crashed:
				return
			default:
			}
			p.flush(&held)
			if held != nil {
				p.send(*held)
			}
			return
		}
	}
}

// flush publishes everything pending as one batch, applying the faults.
func (p *kvPublisher) flush(held **kvBatch) {
	p.mu.Lock()
	events := p.pending
	p.pending = nil
	p.flushing = len(events) > 0
	p.mu.Unlock()
	if len(events) == 0 {
		return
	}
	defer func() {
		p.mu.Lock()
		p.flushing = false
		p.mu.Unlock()
	}()
	f := p.faults()
	ts := float64(p.now().UnixNano()) / 1e9
	payload, err := vllm.EncodeEventBatch(vllm.EventBatch{TS: ts, Events: events, DataParallelRank: vllm.Ptr(0)}, p.enc)
	if err != nil {
		// Cannot happen for events built above; losing the batch would
		// silently desynchronise subscribers, so say so loudly.
		p.log.Error("kv events: encode batch", "err", err)
		return
	}
	p.ringMu.Lock()
	b := kvBatch{seq: p.nextSeq, payload: payload}
	p.nextSeq++
	p.ring = append(p.ring, b)
	if over := len(p.ring) - p.cfg.BufferSteps; over > 0 {
		p.ring = append(p.ring[:0], p.ring[over:]...)
	}
	p.ringMu.Unlock()

	switch {
	case f.KVDropRate > 0 && p.rng.Float64() < f.KVDropRate:
		// Lost on the way: the seq is used, so subscribers see a gap,
		// and the batch stays in the replay buffer to repair it.
		p.log.Debug("kv events: dropped batch (fault injection)", "seq", b.seq)
	case *held == nil && f.KVReorderRate > 0 && p.rng.Float64() < f.KVReorderRate:
		*held = &b // goes out after the next one
	default:
		p.send(b)
		if *held != nil {
			p.send(**held)
			*held = nil
		}
	}
}

func (p *kvPublisher) send(b kvBatch) {
	msg := zmq4.NewMsgFrom(vllm.PubFrames(p.cfg.Topic, b.seq, b.payload)...)
	if err := p.pub.SendMulti(msg); err != nil && p.sockCtx.Err() == nil {
		p.log.Warn("kv events: send", "seq", b.seq, "err", err)
	}
}

// serveReplay answers replay requests until the socket closes: every
// buffered batch from the asked seq on, then the end marker.
func (p *kvPublisher) serveReplay() {
	for {
		msg, err := p.replay.Recv()
		if err != nil {
			if p.sockCtx.Err() != nil {
				return
			}
			p.log.Debug("kv events: replay receive", "err", err)
			continue
		}
		id, start, err := vllm.ParseReplayRequest(msg.Frames)
		if err != nil {
			p.log.Warn("kv events: invalid replay request", "err", err)
			continue
		}
		p.ringMu.Lock()
		var batches []kvBatch
		for _, b := range p.ring {
			if b.seq >= start {
				batches = append(batches, b)
			}
		}
		p.ringMu.Unlock()
		for _, b := range batches {
			if err := p.replay.SendMulti(zmq4.NewMsgFrom(vllm.ReplayReplyFrames(id, p.cfg.Topic, b.seq, b.payload)...)); err != nil {
				p.log.Debug("kv events: replay send", "err", err)
				break
			}
		}
		end := vllm.ReplayReplyFrames(id, "", vllm.ReplayEndSeq, nil)
		if err := p.replay.SendMulti(zmq4.NewMsgFrom(end...)); err != nil {
			p.log.Debug("kv events: replay send end", "err", err)
		}
	}
}

// quiet reports whether every change so far has been made a batch (sent,
// dropped or held), and next is the seq the next batch will have.
func (p *kvPublisher) quiet() (ok bool, next uint64) {
	p.mu.Lock()
	ok = len(p.pending) == 0 && !p.flushing
	p.mu.Unlock()
	p.ringMu.Lock()
	defer p.ringMu.Unlock()
	return ok, p.nextSeq
}

// addrs are the bound addresses, for tests that bind port 0.
func (p *kvPublisher) addrs() (pub, replay net.Addr) {
	if BindsEndpoint(p.cfg.Endpoint) {
		pub = p.pub.Addr()
	}
	if p.replay != nil {
		replay = p.replay.Addr()
	}
	return pub, replay
}

// subscribed reports whether some subscriber has subscribed to a prefix
// of the topic: until then a PUB socket drops what it is given.
func (p *kvPublisher) subscribed() bool {
	t, ok := p.pub.(zmq4.Topics)
	if !ok {
		return false
	}
	for _, s := range t.Topics() {
		if strings.HasPrefix(p.cfg.Topic, s) {
			return true
		}
	}
	return false
}
