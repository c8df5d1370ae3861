package kv

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/llmgw/llmgw/agent/kv/zmtp"
	"github.com/llmgw/llmgw/internal/backoff"
	"github.com/llmgw/llmgw/vllm"
)

// ListenerConfig describes one engine's KV-event sockets and hashing.
type ListenerConfig struct {
	// ReplicaID and UID name the replica whose leader shard the engine is.
	ReplicaID string
	UID       uint64
	// Endpoint is the engine's publisher. For an engine the agent runs it
	// is, by default, ipc://PATH in the agent's socket directory
	// (SocketDir, IPCEndpoints), which vLLM binds and the SUB socket
	// connects to; the directory's mode is what keeps every other user
	// out (design §6 "KV events"). The fallback is tcp://127.0.0.1:PORT,
	// where the SUB socket binds: vLLM connects rather than binds to a
	// non-wildcard TCP endpoint, so the agent binds first and the engine
	// may start, crash and restart against it.
	Endpoint string
	// Connect makes the SUB socket connect to Endpoint instead of binding
	// it: for an engine llmgw does not run, whose publisher binds (vLLM
	// binds a wildcard endpoint, tcp://*:5557 by default). The socket
	// reconnects whenever the engine goes away and comes back.
	Connect bool
	// ReplayEndpoint is the engine's replay ROUTER socket (tcp:// or
	// ipc://, which vLLM always binds); empty means the engine has none,
	// and every gap makes the replica untrusted.
	ReplayEndpoint string
	// SameUser refuses every peer of either socket that does not run as
	// the agent's user (zmtp.Policy.RequireUID): for engines the agent
	// runs, which run as it. On loopback TCP it is the guard that keeps
	// other users' processes off the SUB socket's port and from posing
	// as the engine's replay socket.
	SameUser bool
	// Topic is the engine's topic (a prefix match, as ZMQ subscribes).
	Topic string
	// BlockSize is the engine's block size in tokens, until its events say.
	BlockSize uint32
	// HashSeed is the engine's PYTHONHASHSEED: the first block's parent is
	// its hash, so the mirror derives canonical hashes with the same seed
	// the router hashes prompts with.
	HashSeed string
	// ReplayTimeout is how long a replay may go without a reply before the
	// gap counts as unrepairable.
	ReplayTimeout time.Duration
	// ReplayBufferSteps is how many batches the engine's replay buffer
	// holds (vLLM's buffer_steps; the agent leaves it at vLLM's default).
	// A replay of fewer batches is the engine's whole history: see repair.
	ReplayBufferSteps int
	// CatchUp asks for a replay from seq 0 at once: for an engine that was
	// running before this listener (re-adopted after an agent restart),
	// whose earlier batches the mirror never saw.
	CatchUp bool
	// QueueSize bounds the messages waiting while a replay runs, and
	// QueueBytes their bytes (queuebytes.go).
	QueueSize  int
	QueueBytes int
	// MaxMessageBytes caps what a peer of either socket may declare: each
	// frame's length and a message's total. A peer that declares more
	// loses its connection before zmq4 allocates anything (package zmtp).
	MaxMessageBytes uint64
	// MaxBlocks caps the blocks the mirror holds for the engine: what its
	// cache can hold (num_gpu_blocks), once the engine reports it
	// (SetEngineBlocks), at most this. An engine's events that would hold
	// more are not its cache's (a forged or broken stream): the replica
	// becomes untrusted and its mirror is emptied (design §7.5).
	MaxBlocks int
	// MaxOffloadBlocks caps the blocks the mirror holds in the engine's
	// offload tiers (CPU and storage, together; design §7.5 "Offload
	// tiers"), whose size vLLM does not report. Events that would hold more
	// make the replica untrusted, as MaxBlocks does; 0 mirrors no offload
	// tier (the agent reports GPU blocks only, as before tiers).
	MaxOffloadBlocks int
	// MaxBatchBytes caps one batch's decoded size, checked against what
	// its msgpack headers declare before anything is allocated; a batch
	// over it is undecodable (the replica becomes untrusted). A batch also
	// names at most twice the block cap in hashes: a step can evict and
	// store the whole cache, no more.
	MaxBatchBytes int
	// MaxReplayBytes caps the payloads of one replay's reply, held until
	// its end marker; a longer reply fails the replay.
	MaxReplayBytes int
	// Dial, if set, makes the sockets' TCP connections (the publisher's
	// with Connect, and the replay socket's): for an external engine, the
	// agent's endpoint guard, which resolves the engine's host and refuses
	// an address the model policy refuses each time it connects (design §6
	// "External engines"). Nil dials directly.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// AllowFrom are the addresses that may connect to a bound TCP
	// endpoint: for an external engine whose publisher connects out
	// (kv_events_listen), where no peer's user can be checked. A bound
	// endpoint beyond loopback needs it or SameUser (Validate).
	AllowFrom []netip.Prefix
	// StreamTimeout, if set, is how long the engine's publisher has to
	// complete a handshake after the listener starts: for an external
	// engine, running already, whose events could otherwise be missing in
	// silence (issue 27: an agent that only dials meeting a publisher that
	// only dials, or a port that answers nothing, left the replica trusted
	// with an empty index). Past it the replica is untrusted, with that
	// reason, until a publisher connects and the engine's replay gives
	// its whole history, or the engine clears its cache.
	StreamTimeout time.Duration
}

// DefaultListenerConfig has vLLM's defaults (topic "", block size 16) and
// the agent's timings; the caller sets the replica and endpoints.
func DefaultListenerConfig() ListenerConfig {
	return ListenerConfig{BlockSize: 16, HashSeed: "0", ReplayTimeout: 2 * time.Second, ReplayBufferSteps: 10_000, QueueSize: 4096,
		QueueBytes: DefaultQueueBytes, MaxMessageBytes: zmtp.DefaultMaxMessageBytes,
		MaxBlocks: DefaultMaxBlocks, MaxOffloadBlocks: DefaultMaxOffloadBlocks, MaxBatchBytes: DefaultMaxBatchBytes, MaxReplayBytes: DefaultMaxReplayBytes}
}

// Bounds of one engine's KV state (design §7.5 "Bounds").
const (
	// DefaultMaxBlocks is the block cap before the engine reports its
	// num_gpu_blocks: 2^20 blocks of 16 tokens is 16 M tokens of cache,
	// past a small model's on the largest GPU, and a mirror of that many
	// blocks is about 150 MB.
	DefaultMaxBlocks = 1 << 20
	// DefaultMaxOffloadBlocks is the offload tiers' block cap: 2^20
	// blocks of 16 tokens is 16 M tokens, 192 GiB of host memory at a
	// 0.5B model's 12 KiB a token, and a mirror of about 150 MB. With
	// DefaultMaxBlocks it keeps a replica's hashes over all tiers within
	// the control plane's agent_kv_blocks_per_replica default (2 Mi), past
	// which the whole session would end rather than one replica go
	// untrusted.
	DefaultMaxOffloadBlocks = 1 << 20
	// DefaultMaxBatchBytes bounds one decoded batch. vLLM publishes a
	// batch per step, and a step's events are bounded by the tokens it
	// schedules (tens of thousands): a megabyte or two decoded. 32 MiB
	// is 4 M token ids.
	DefaultMaxBatchBytes = 32 << 20
	// DefaultMaxReplayBytes bounds one replay's reply: the engine's
	// buffer of 10,000 batches at 25 KiB each.
	DefaultMaxReplayBytes = 256 << 20
)

// Validate reports the first bad field by its name.
func (c ListenerConfig) Validate() error {
	switch {
	case c.ReplicaID == "":
		return errors.New("kv listener: replica_id: required")
	case !validEndpoint(c.Endpoint):
		return fmt.Errorf("kv listener: endpoint %q: must be tcp://HOST:PORT or ipc://PATH", c.Endpoint)
	case c.ReplayEndpoint != "" && !validEndpoint(c.ReplayEndpoint):
		return fmt.Errorf("kv listener: replay_endpoint %q: must be tcp://HOST:PORT or ipc://PATH", c.ReplayEndpoint)
	case c.BlockSize == 0:
		return errors.New("kv listener: block_size: must be at least 1")
	case c.ReplayTimeout <= 0:
		return errors.New("kv listener: replay_timeout: must be positive")
	case c.ReplayBufferSteps <= 0:
		return errors.New("kv listener: replay_buffer_steps: must be at least 1")
	case c.QueueSize <= 0:
		return errors.New("kv listener: queue_size: must be at least 1")
	case c.QueueBytes <= 0:
		return errors.New("kv listener: queue_bytes: must be at least 1")
	case c.MaxMessageBytes == 0:
		return errors.New("kv listener: max_message_bytes: must be at least 1")
	case c.MaxBlocks <= 0:
		return errors.New("kv listener: max_blocks: must be at least 1")
	case c.MaxOffloadBlocks < 0:
		return errors.New("kv listener: max_offload_blocks: must not be negative")
	case c.MaxBatchBytes <= 0:
		return errors.New("kv listener: max_batch_bytes: must be at least 1")
	case c.MaxReplayBytes <= 0:
		return errors.New("kv listener: max_replay_bytes: must be at least 1")
	case c.StreamTimeout < 0:
		return errors.New("kv listener: stream_timeout: must not be negative")
	case !c.connects() && !c.SameUser && len(c.AllowFrom) == 0 && !loopbackEndpoint(c.Endpoint):
		return fmt.Errorf("kv listener: allow_from: required to bind %s beyond loopback without a user check", c.Endpoint)
	}
	return nil
}

// loopbackEndpoint reports whether tcp://HOST:PORT names a loopback
// address, which only this node's processes can reach.
func loopbackEndpoint(ep string) bool {
	host, _, err := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
	if err != nil {
		return false
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}

func validEndpoint(ep string) bool {
	rest, tcp := strings.CutPrefix(ep, "tcp://")
	if !tcp {
		rest, _ = strings.CutPrefix(ep, "ipc://")
	}
	return rest != "" && rest != ep
}

// connects reports whether the SUB socket dials the endpoint: an engine's
// ipc:// publisher binds, as vLLM binds every ipc endpoint.
func (c ListenerConfig) connects() bool { return c.Connect || strings.HasPrefix(c.Endpoint, "ipc://") }

// Listener receives one engine's KV events into its mirror in the hub.
//
// It owns two goroutines: one receives from the SUB socket into a bounded
// queue; the other applies batches in seq order, and on a gap asks the
// engine's replay socket for what is missing (while live batches wait in
// the queue). Close stops both and waits.
type Listener struct {
	cfg    ListenerConfig
	log    *slog.Logger
	zlog   *log.Logger
	hub    *Hub
	mirror *mirror
	sub    zmq4.Socket
	msgs   chan zmq4.Msg
	queued *byteBudget // the bytes in msgs
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
	// connected is signalled (never blocking) when a publisher completes
	// its handshake with the SUB socket; process then polls the replay
	// socket (pollAfterConnect).
	connected chan struct{}
	// pace spaces the SUB socket's redials; refusals logs a refusal that
	// repeats once until a handshake goes through.
	pace     *redialPacer
	refusals onceLog
}

// Listen binds the engine's SUB socket and starts receiving. It must be
// called before the engine starts; an error (the port taken, say) is for
// the caller to log and start the engine without events — routers then use
// tier 1 for the replica rather than the replica not running at all.
func (h *Hub) Listen(cfg ListenerConfig, logger *slog.Logger) (*Listener, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = h.log
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Listener{
		cfg: cfg, log: logger.With("replica", cfg.ReplicaID), hub: h,
		mirror: newMirror(cfg.ReplicaID, cfg.UID, cfg.BlockSize, cfg.HashSeed, cfg.MaxBlocks, cfg.MaxOffloadBlocks, cfg.QueueSize+recentSlack),
		msgs:   make(chan zmq4.Msg, cfg.QueueSize), queued: newByteBudget(cfg.QueueBytes), cancel: cancel,
		connected: make(chan struct{}, 1), pace: newRedialPacer(),
	}
	l.zlog = slog.NewLogLogger(l.log.Handler(), slog.LevelDebug)
	subPolicy := l.policy(zmq4.Pub, zmq4.XPub)
	subPolicy.AllowFrom = cfg.AllowFrom
	if cfg.connects() {
		subPolicy.Dial = l.pace.wrap(subPolicy.Dial)
	}
	subPolicy.Handshaken = func(net.Addr) {
		l.pace.connected()
		l.refusals.forget()
		select {
		case l.connected <- struct{}{}:
		default:
		}
	}
	ctx = zmtp.WithPolicy(ctx, subPolicy)
	l.sub = zmq4.NewSub(ctx, l.socketOptions()...)
	if err := l.sub.SetOption(zmq4.OptionSubscribe, cfg.Topic); err != nil {
		cancel()
		_ = l.sub.Close()
		h.metrics.listenFailures.Inc()
		return nil, fmt.Errorf("kv listener: subscribe: %w", err)
	}
	if cfg.connects() {
		l.connect(ctx)
	} else if err := l.sub.Listen(zmtp.Endpoint(cfg.Endpoint)); err != nil {
		cancel()
		_ = l.sub.Close()
		h.metrics.listenFailures.Inc()
		return nil, fmt.Errorf("kv listener: bind %s: %w", cfg.Endpoint, err)
	}
	h.add(l.mirror)
	l.wg.Add(2)
	go l.receive(ctx)
	go l.process(ctx)
	l.log.Info("listening for kv cache events", "endpoint", l.Endpoint(), "replay", cfg.ReplayEndpoint)
	return l, nil
}

// recentSlack is how many batches past the queue's the mirror remembers
// (recentBatches): those in flight between the engine and the queue when a
// replay overtakes them.
const recentSlack = 1024

// socketOptions are the SUB socket's: a connecting one redials for as long
// as the listener lives, every connectRetry, since an external engine may
// be down when the listener starts or restart at any time.
func (l *Listener) socketOptions() []zmq4.Option {
	opts := []zmq4.Option{zmq4.WithLogger(l.zlog)}
	if l.cfg.connects() {
		opts = append(opts, zmq4.WithAutomaticReconnect(true), zmq4.WithDialerMaxRetries(-1), zmq4.WithDialerRetry(connectRetry))
	}
	return opts
}

// connectRetry spaces a connecting SUB socket's dials.
const connectRetry = 250 * time.Millisecond

// connect dials the engine's publisher in the background (zmq4's Dial
// blocks until it connects); the goroutine is the listener's and ends when
// the dial does, at the latest when Close cancels the socket's context.
func (l *Listener) connect(ctx context.Context) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		if err := safely(func() error { return l.sub.Dial(zmtp.Endpoint(l.cfg.Endpoint)) }); err != nil && ctx.Err() == nil {
			l.log.Warn("kv events: cannot connect to the engine's publisher", "endpoint", l.cfg.Endpoint, "err", err)
		}
	}()
}

// Endpoint is the bound endpoint (with the port chosen for port 0).
func (l *Listener) Endpoint() string {
	if a, ok := l.sub.Addr().(*net.TCPAddr); ok && a != nil && !l.cfg.connects() {
		return "tcp://" + a.String()
	}
	return l.cfg.Endpoint
}

// Engine tells the listener which engine process publishes now, by the
// incarnation the supervisor gives each start. A new incarnation resets
// the mirror: a new process has an empty cache and counts seq from 0.
// The supervisor reports a start before the engine can publish, so no
// batch of the new process is applied to the old mirror.
func (l *Listener) Engine(incarnation uint64) {
	m := l.mirror
	m.mu.Lock()
	defer m.mu.Unlock()
	switch m.incarnation {
	case incarnation:
		return
	case 0:
		// The listener's first engine: whatever the mirror holds already
		// came from this process (a catch-up replay of a re-adopted engine
		// may have run before the supervisor named it). Resetting here
		// would throw that away, and nothing would replay it again. The
		// set goes up whole under its incarnation (a reset holding what
		// the mirror has), woken here: nothing else announces a new
		// mirror, and a report before its incarnation was known is one
		// routers cannot place.
		m.incarnation = incarnation
		m.reset = true
		l.hub.pacer.changed()
		return
	}
	l.hub.metrics.resets.WithLabelValues("restart").Inc()
	l.log.Info("engine restarted; kv mirror reset", "incarnation", incarnation)
	m.newEngine(incarnation)
	l.hub.pacer.changed()
}

// SetEngineBlocks lowers the mirror's block cap to what the engine's
// cache holds, num_gpu_blocks from its vllm:cache_config_info (at most
// MaxBlocks; n <= 0 restores MaxBlocks). A mirror already holding more is
// not this engine's cache: the replica becomes untrusted.
func (l *Listener) SetEngineBlocks(n int) {
	if n <= 0 || n > l.cfg.MaxBlocks {
		n = l.cfg.MaxBlocks
	}
	m := l.mirror
	m.mu.Lock()
	defer m.mu.Unlock()
	m.maxBlocks = n
	if m.gpuBlocks > n && !m.untrusted {
		l.untrustLocked("the mirror holds more blocks than the engine's cache", "blocks", m.gpuBlocks, "num_gpu_blocks", n)
	}
}

// Close stops receiving, waits for the listener's goroutines and drops the
// replica's mirror from the hub. It is idempotent.
func (l *Listener) Close() {
	l.once.Do(func() {
		l.cancel()
		_ = l.sub.Close()
		l.wg.Wait()
		l.hub.drop(l.mirror)
	})
}

// policy is the limits on the peers of the listener's sockets: the engine,
// or whatever else connects to the SUB's port or listens on the replay
// port (design §6: both stay on loopback, which bounds who, not what).
func (l *Listener) policy(peers ...zmq4.SocketType) zmtp.Policy {
	p := zmtp.Policy{MaxMessageBytes: l.cfg.MaxMessageBytes, PeerTypes: peers, Dial: l.cfg.Dial, Refused: func(remote net.Addr, err error) {
		l.hub.metrics.framesRefused.Inc()
		level := slog.LevelWarn
		if !l.refusals.first(err.Error()) {
			level = slog.LevelDebug // logged once already (llmgw_agent_kv_frames_refused_total counts them all)
		}
		l.log.Log(context.Background(), level, "kv socket: peer refused, connection closed", "remote", fmt.Sprint(remote), "err", err)
	}}
	if l.cfg.SameUser {
		p.RequireUID, p.UID = true, uint32(os.Geteuid())
	}
	return p
}

// errLibraryPanic marks a panic of zmq4 caught on a goroutine of ours.
var errLibraryPanic = errors.New("zmq4 panicked")

// safely runs a zmq4 call on this goroutine with a panic turned into an
// error: zmq4's own goroutines are out of reach (package zmtp keeps the
// peer's bytes from them), but the calls the listener makes are not.
func safely(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", errLibraryPanic, r)
		}
	}()
	return f()
}

func (l *Listener) receive(ctx context.Context) {
	defer l.wg.Done()
	for {
		var msg zmq4.Msg
		err := safely(func() (err error) { msg, err = l.sub.Recv(); return err })
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errLibraryPanic) {
			// The socket's state is unknown now: stop receiving rather
			// than panic again on every call. The replica is served by
			// tier 1 until its listener is made anew.
			l.mirror.mu.Lock()
			l.untrustLocked("kv socket failed", "err", err)
			l.mirror.mu.Unlock()
			l.log.Error("kv events: receiving stopped", "err", err)
			return
		}
		if err != nil {
			// One connection ended (the engine exited); the socket stays
			// bound for the next process.
			l.log.Debug("kv events: receive", "err", err)
			continue
		}
		if l.queued.reserve(ctx, msgBytes(msg)) != nil {
			return
		}
		select {
		case l.msgs <- msg:
		case <-ctx.Done():
			return
		}
	}
}

// pollAfterConnect is when, after a publisher's handshake, the listener
// asks the replay socket for what it may have missed.
//
// A PUB socket drops what it publishes while it has no subscriber: while
// the agent restarts, or between an engine's reconnect and its receipt of
// the SUB's subscription. A later live batch shows such a loss as a gap,
// but an engine that goes quiet right after publishes none, and its last
// batches would be missing from the mirror for as long as it stays quiet
// (seen: an agent restarted under load caught up by replay, then missed
// the batches of requests served before the engine's PUB reconnected, and
// the routers' indexes stayed wrong). A replay from the seq wanted next,
// once the connection is up and again later (the subscription reaches the
// publisher some time after the handshake, later on a loaded machine),
// closes that window; it returns nothing when nothing was missed.
var pollAfterConnect = [...]time.Duration{100 * time.Millisecond, time.Second, 5 * time.Second}

func (l *Listener) process(ctx context.Context) {
	defer l.wg.Done()
	if l.cfg.CatchUp {
		l.repair(ctx, l.gen(), 0, replayCatchUp)
	}
	// poll counts the polls made since the last handshake.
	poll := len(pollAfterConnect)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	// stream fires if no publisher has connected by StreamTimeout.
	var stream <-chan time.Time
	if l.cfg.StreamTimeout > 0 {
		st := time.NewTimer(l.cfg.StreamTimeout)
		defer st.Stop()
		stream = st.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case msg := <-l.msgs:
			l.queued.release(msgBytes(msg))
			l.handle(ctx, msg)
		case <-stream:
			l.mirror.mu.Lock()
			if !l.mirror.untrusted {
				l.untrustLocked(fmt.Sprintf("no event stream: the engine's publisher did not connect within %v", l.cfg.StreamTimeout),
					"endpoint", l.Endpoint())
			}
			l.mirror.mu.Unlock()
		case <-l.connected:
			stream = nil
			if l.cfg.ReplayEndpoint == "" {
				continue // nothing to poll: a loss shows as a gap, untrusted
			}
			poll = 0
			timer.Reset(pollAfterConnect[0])
		case <-timer.C:
			l.poll(ctx)
			if poll++; poll < len(pollAfterConnect) {
				timer.Reset(pollAfterConnect[poll] - pollAfterConnect[poll-1])
			}
		}
	}
}

// gen is the mirror's engine generation, for a replay to check against.
func (l *Listener) gen() uint64 {
	l.mirror.mu.Lock()
	defer l.mirror.mu.Unlock()
	return l.mirror.gen
}

// handle applies one live message, or repairs the gap before it.
func (l *Listener) handle(ctx context.Context, msg zmq4.Msg) {
	met := l.hub.metrics
	topic, seq, payload, err := vllm.ParsePubFrames(msg.Frames)
	if err != nil {
		// A message without a seq cannot be placed; if it carried a batch,
		// the next one shows the gap.
		met.badBatches.Inc()
		l.log.Warn("kv events: bad message", "err", err)
		return
	}
	if !strings.HasPrefix(topic, l.cfg.Topic) {
		return
	}
	m := l.mirror
	m.mu.Lock()
	if m.seq.started && seq < m.seq.next {
		if m.recent.applied(seq, payload) {
			// Already applied, from a replay that overtook the live stream.
			m.mu.Unlock()
			return
		}
		// Not a batch applied lately: another process of the engine,
		// counting from 0 again — restarted before any health check
		// noticed. Its cache is empty and its history starts over.
		l.restartLocked("its kv events count again from a lower seq", "seq", seq, "want_seq", m.seq.next)
	}
	switch {
	case m.untrusted:
		// Only an AllBlocksCleared can make the set known again; gaps
		// before it do not matter.
		m.seq = seqState{started: true, next: seq + 1}
		l.applyLocked(seq, payload)
		m.mu.Unlock()
		return
	case (!m.seq.started && seq == 0) || (m.seq.started && seq == m.seq.next):
		l.applyLocked(seq, payload)
		m.mu.Unlock()
		return
	}
	gen := m.gen
	m.mu.Unlock()
	met.gaps.Inc()
	l.repair(ctx, gen, seq, replayGap)
}

// applyLocked applies the batch with seq and advances the expected seq. A
// batch that cannot be decoded is lost for good — replaying it would give
// the same bytes — so the replica becomes untrusted.
func (l *Listener) applyLocked(seq uint64, payload []byte) {
	m := l.mirror
	met := l.hub.metrics
	m.seq = seqState{started: true, next: seq + 1}
	m.recent.add(seq, payload)
	b, err := vllm.DecodeEventBatchLimited(payload, vllm.DecodeLimits{MaxDecodedBytes: l.cfg.MaxBatchBytes,
		MaxBlockHashes: 2 * (m.maxBlocks + m.maxOffload)})
	if err != nil {
		met.badBatches.Inc()
		if !m.untrusted {
			l.untrustLocked("undecodable batch", "seq", seq, "err", err)
		}
		return
	}
	met.batches.Inc()
	wasUntrusted := m.untrusted
	st := m.applyBatch(b)
	if len(b.Events) > 0 {
		m.noteBatch(b.TS)
		l.hub.pacer.changed()
	}
	if st.stored > 0 {
		met.events.WithLabelValues("stored").Add(float64(st.stored))
	}
	if st.removed > 0 {
		met.events.WithLabelValues("removed").Add(float64(st.removed))
	}
	if st.cleared > 0 {
		met.events.WithLabelValues("cleared").Add(float64(st.cleared))
		met.resets.WithLabelValues("cleared").Add(float64(st.cleared))
	}
	if st.skipped > 0 {
		met.events.WithLabelValues("unknown").Add(float64(st.skipped))
	}
	if st.mismatches > 0 {
		met.mismatches.Add(float64(st.mismatches))
	}
	if st.overCap {
		met.overCap.Inc()
		l.untrustLocked("the engine's events hold more blocks than its cache", "seq", seq, "max_blocks", m.maxBlocks, "max_offload_blocks", m.maxOffload)
		return
	}
	if wasUntrusted && st.regainedTrust {
		l.log.Info("engine cleared its cache; kv state trusted again", "seq", seq)
	}
}

// untrustLocked marks the replica untrusted: why, with the error among
// args if there is one, is the reason its report carries (shown by
// llmgwctl replica list and the console). Logged once: every caller checks
// the mirror is trusted first, and it stays untrusted until a restart, a
// clear or a whole history replayed.
func (l *Listener) untrustLocked(why string, args ...any) {
	reason := why
	for i := 0; i+1 < len(args); i += 2 {
		if args[i] == "err" {
			reason += ": " + fmt.Sprint(args[i+1])
		}
	}
	l.mirror.markUntrusted(reason)
	l.hub.pacer.changed()
	l.hub.metrics.resets.WithLabelValues("untrusted").Inc()
	l.log.Warn("kv state untrusted until the engine restarts or clears its cache", append([]any{"why", why}, args...)...)
}

// restartLocked starts the mirror over for a restart of the engine that
// its own events showed (mirror.restart).
func (l *Listener) restartLocked(why string, args ...any) {
	l.hub.metrics.resets.WithLabelValues("restart").Inc()
	l.log.Info("engine restarted; kv mirror reset", append([]any{"why", why}, args...)...)
	l.mirror.restart()
	l.hub.pacer.changed()
}

// repair asks the replay socket for every batch from the wanted seq on and
// applies them. seen, for a gap (replayGap), is the live seq that showed it:
// the replay must reach it. A replay that starts past the wanted seq (the
// engine's buffer no longer holds it), has holes, or does not answer in
// time leaves the gap open, and the replica untrusted (design §7.5).
//
// One exception (issue 14): before any batch of the engine is applied, a
// replay that is the engine's whole history (wholeHistory) starting at 1
// means the engine numbers from there (a vLLM-compatible engine counting
// from 1), not that batches were lost. The history is complete.
//
// A poll (replayPoll) asks the same of an engine that showed no gap, in
// case batches went to no one (pollAfterConnect): one the engine cannot
// answer leaves the replica trusted — the next live batch shows any gap —
// and is counted apart, as is one that finds nothing missing.
func (l *Listener) repair(ctx context.Context, gen, seen uint64, why replayReason) {
	met := l.hub.metrics
	m := l.mirror
	m.mu.Lock()
	want := m.seq.next
	untrusted := m.untrusted
	m.mu.Unlock()
	if why == replayPoll && untrusted {
		return // only a clear or a restart makes it known again
	}

	var replies []vllm.ReplayReply
	var err error
	if l.cfg.ReplayEndpoint == "" {
		err = errors.New("the engine has no replay endpoint")
	} else {
		replies, err = l.fetchReplay(ctx, want)
	}
	if ctx.Err() != nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.gen != gen || m.untrusted {
		// The engine restarted meanwhile: its successor starts afresh.
		return
	}
	if err != nil && why == replayPoll {
		met.replays.WithLabelValues("poll_failed").Inc()
		l.log.Debug("kv events: replay poll failed", "from_seq", want, "err", err)
		return
	}
	if err != nil {
		met.replays.WithLabelValues("failed").Inc()
		l.untrustLocked("replay failed", "from_seq", want, "err", err)
		return
	}
	complete := false
	applied := 0
	for _, r := range replies {
		if r.Seq < m.seq.next && m.seq.started {
			continue
		}
		if r.Seq != m.seq.next && !m.seq.started && l.wholeHistory(replies) {
			complete = true
			l.log.Debug("kv events: the replay is the engine's whole history", "first_seq", r.Seq, "batches", len(replies))
			m.seq.next = r.Seq
		}
		if r.Seq != m.seq.next {
			met.replays.WithLabelValues("unrepairable").Inc()
			l.untrustLocked("replay cannot close the gap", "want_seq", m.seq.next, "replayed_seq", r.Seq)
			return
		}
		l.applyLocked(r.Seq, r.Payload)
		applied++
		if m.untrusted {
			met.replays.WithLabelValues("unrepairable").Inc()
			return
		}
	}
	if why == replayGap && (!m.seq.started || m.seq.next <= seen) {
		met.replays.WithLabelValues("unrepairable").Inc()
		l.untrustLocked("replay ended before the batch that showed the gap", "want_seq", m.seq.next, "seen_seq", seen)
		return
	}
	if complete {
		met.replays.WithLabelValues("complete").Inc()
		return
	}
	if why == replayPoll {
		if applied == 0 {
			met.replays.WithLabelValues("current").Inc()
			return
		}
		l.log.Info("kv events: batches no one received, caught up by replay", "from_seq", want, "batches", applied)
	}
	met.replays.WithLabelValues("repaired").Inc()
	l.log.Debug("kv events: gap repaired by replay", "from_seq", want, "batches", len(replies))
}

// wholeHistory reports whether a replay from seq 0 is everything the
// engine published: fewer batches than its buffer holds, so the buffer
// never dropped one. It is only as good as ReplayBufferSteps, the model's
// kv_events_buffer_steps: an engine whose buffer is smaller than the agent
// was told, and wrapped, gives a replay taken for its whole history (issue
// 27: a hot prompt's blocks missing from the index). Its first seq cannot
// tell, as vLLM-compatible engines may number from anywhere (issue 14).
func (l *Listener) wholeHistory(replies []vllm.ReplayReply) bool {
	return len(replies) < l.cfg.ReplayBufferSteps
}

// poll is what a handshake's polls do (pollAfterConnect). For a trusted
// mirror, it first checks that the publisher is the engine process whose
// batches the mirror applied: its replay must still hold the last of
// them, byte for byte. An engine restarted between two health checks
// (issue 27) holds another batch at that seq, or none; the mirror then
// starts over from the new process's whole history. For an untrusted
// mirror, a publisher's return is the chance to rebuild it whole
// (recover).
func (l *Listener) poll(ctx context.Context) {
	m := l.mirror
	m.mu.Lock()
	gen, untrusted, started, last := m.gen, m.untrusted, m.seq.started, m.seq.next-1
	m.mu.Unlock()
	switch {
	case untrusted:
		l.recover(ctx, gen)
		return
	case !started || last == math.MaxUint64:
		l.repair(ctx, gen, 0, replayPoll)
		return
	}
	replies, err := l.fetchReplay(ctx, last)
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		l.hub.metrics.replays.WithLabelValues("poll_failed").Inc()
		l.log.Debug("kv events: replay poll failed", "from_seq", last, "err", err)
		return
	}
	m.mu.Lock()
	if m.gen != gen || m.untrusted || m.seq.next-1 != last {
		m.mu.Unlock()
		return // the mirror moved on meanwhile; the next poll or batch tells
	}
	if len(replies) == 0 || replies[0].Seq != last || !m.recent.applied(last, replies[0].Payload) {
		l.restartLocked("its replay no longer holds the last batch applied", "seq", last)
		gen = m.gen
		m.mu.Unlock()
		l.repair(ctx, gen, 0, replayCatchUp)
		return
	}
	m.mu.Unlock()
	l.repair(ctx, gen, 0, replayPoll)
}

// recover rebuilds an untrusted mirror from the engine's replay when that
// is its whole history (wholeHistory): then nothing the engine ever did is
// missing, whatever made the mirror untrusted. Anything less leaves it
// untrusted until the engine clears or restarts.
func (l *Listener) recover(ctx context.Context, gen uint64) {
	if l.cfg.ReplayEndpoint == "" {
		return
	}
	met := l.hub.metrics
	replies, err := l.fetchReplay(ctx, 0)
	if ctx.Err() != nil {
		return
	}
	m := l.mirror
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.gen != gen || !m.untrusted {
		return
	}
	if err != nil || !l.wholeHistory(replies) {
		met.replays.WithLabelValues("unrecovered").Inc()
		l.log.Debug("kv events: the engine's replay is not its whole history; kv state stays untrusted", "batches", len(replies), "err", err)
		return
	}
	was := m.why
	m.restart()
	l.hub.pacer.changed()
	for i, r := range replies {
		if i == 0 {
			m.seq.next = r.Seq
		}
		if r.Seq != m.seq.next {
			met.replays.WithLabelValues("unrepairable").Inc()
			l.untrustLocked("the engine's replay has holes", "want_seq", m.seq.next, "replayed_seq", r.Seq)
			return
		}
		if l.applyLocked(r.Seq, r.Payload); m.untrusted {
			met.replays.WithLabelValues("unrepairable").Inc()
			return
		}
	}
	met.replays.WithLabelValues("recovered").Inc()
	l.log.Info("kv state trusted again: the engine's replay holds its whole history", "batches", len(replies), "was", was)
}

// replayReason is why a replay is asked for.
type replayReason int

const (
	// replayGap: a live batch's seq showed batches missing before it.
	replayGap replayReason = iota
	// replayCatchUp: a re-adopted engine's history, from seq 0.
	replayCatchUp
	// replayPoll: after a publisher's handshake (pollAfterConnect).
	replayPoll
)

var (
	errReplayTimeout  = errors.New("no reply in time")
	errReplayTooLarge = errors.New("reply over the bounds")
)

// fetchReplay runs one replay request through a fresh DEALER socket and
// returns the batches replied before the end marker.
func (l *Listener) fetchReplay(ctx context.Context, from uint64) ([]vllm.ReplayReply, error) {
	rctx, cancel := context.WithCancel(zmtp.WithPolicy(ctx, l.policy(zmq4.Router, zmq4.Dealer, zmq4.Rep)))
	defer cancel()
	idle := time.AfterFunc(l.cfg.ReplayTimeout, cancel)
	defer idle.Stop()
	d := zmq4.NewDealer(rctx, zmq4.WithLogger(l.zlog), zmq4.WithDialerMaxRetries(-1),
		zmq4.WithDialerRetry(50*time.Millisecond))
	defer d.Close()
	timedOut := func(err error) error {
		if rctx.Err() != nil && ctx.Err() == nil {
			return fmt.Errorf("replay from %s: %w", l.cfg.ReplayEndpoint, errReplayTimeout)
		}
		return fmt.Errorf("replay from %s: %w", l.cfg.ReplayEndpoint, err)
	}
	if err := safely(func() error { return d.Dial(zmtp.Endpoint(l.cfg.ReplayEndpoint)) }); err != nil {
		return nil, timedOut(err)
	}
	if err := safely(func() error { return d.SendMulti(zmq4.NewMsgFrom(vllm.ReplayRequestFrames(from)...)) }); err != nil {
		return nil, timedOut(err)
	}
	var out []vllm.ReplayReply
	held := 0 // payload bytes in out
	for {
		var msg zmq4.Msg
		err := safely(func() (err error) { msg, err = d.Recv(); return err })
		if err != nil {
			return nil, timedOut(err)
		}
		idle.Reset(l.cfg.ReplayTimeout)
		r, err := vllm.ParseReplayReply(msg.Frames)
		if err != nil {
			return nil, fmt.Errorf("replay from %s: %w", l.cfg.ReplayEndpoint, err)
		}
		if r.End {
			return out, nil
		}
		if l.cfg.Topic != "" && r.Topic != "" && !strings.HasPrefix(r.Topic, l.cfg.Topic) {
			continue
		}
		// The engine's buffer holds ReplayBufferSteps batches: a reply
		// of more, or of more bytes than the cap, is not its buffer's.
		if held += len(r.Payload); len(out) >= l.cfg.ReplayBufferSteps || held > l.cfg.MaxReplayBytes {
			return nil, fmt.Errorf("replay from %s: %w: more than %d batches or %d bytes", l.cfg.ReplayEndpoint,
				errReplayTooLarge, l.cfg.ReplayBufferSteps, l.cfg.MaxReplayBytes)
		}
		out = append(out, r)
	}
}

// redialPacer spaces a connecting SUB socket's dials. zmq4 redials at once
// a connection its peer ended, so a peer refused at every handshake — the
// publisher and replay ports swapped — was redialed, refused and logged
// about 2,000 times a second (issue 27). The first dial, and the first
// after a handshake went through, go at once; each further one waits the
// next delay of internal/backoff, from redialMin doubling to redialMax.
type redialPacer struct {
	mu     sync.Mutex
	b      *backoff.Backoff
	dialed bool // a dial was made since the last handshake
	sleep  func(ctx context.Context, d time.Duration) bool
}

const (
	redialMin = 100 * time.Millisecond
	redialMax = 5 * time.Second
)

func newRedialPacer() *redialPacer {
	return &redialPacer{b: backoff.New(redialMin, redialMax, nil), sleep: backoff.Sleep}
}

// wrap paces dial (nil: a plain net.Dialer's).
func (p *redialPacer) wrap(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		p.mu.Lock()
		var wait time.Duration
		if p.dialed {
			wait = p.b.Next()
		}
		p.dialed = true
		p.mu.Unlock()
		if wait > 0 && !p.sleep(ctx, wait) {
			return nil, ctx.Err()
		}
		return dial(ctx, network, addr)
	}
}

// connected is a handshake gone through: the next dial goes at once.
func (p *redialPacer) connected() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dialed = false
	p.b.Reset()
}

// onceLog tells the first of a repeating message from its repeats, until
// forget.
type onceLog struct {
	mu   sync.Mutex
	last string
}

// first reports whether msg differs from the last one seen, and keeps it.
func (o *onceLog) first(msg string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.last == msg {
		return false
	}
	o.last = msg
	return true
}

func (o *onceLog) forget() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.last = ""
}
