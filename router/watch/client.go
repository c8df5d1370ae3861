package watch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/llmgw/llmgw/chunking"
	"github.com/llmgw/llmgw/internal/addrs"
	"github.com/llmgw/llmgw/internal/backoff"
	"github.com/llmgw/llmgw/internal/mtls"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Config configures a Client. Zero durations take the defaults of
// DefaultConfig.
type Config struct {
	// ClientID names this router to the control plane (WatchRequest.client_id).
	ClientID string
	// Addrs are the control servers' gRPC addresses (host:port) to start
	// from; the client adds the servers it learns from the stream.
	Addrs []string
	// HeartbeatTimeout is how long a stream may stay silent before the
	// server is taken for dead: three missed 500 ms heartbeats (design §5.6).
	HeartbeatTimeout time.Duration
	// BackoffMin and BackoffMax bound the wait between attempts: it
	// doubles from BackoffMin to BackoffMax, drawn from [d/2, d)
	// (internal/backoff), and starts again at BackoffMin after a stream
	// that delivered anything.
	BackoffMin, BackoffMax time.Duration
	// StatePath, when set, is where the last state is saved and loaded from
	// at start, so a router started while the control plane is unreachable
	// still routes (design §7.1).
	StatePath string
	// SaveInterval bounds how often the state is written to StatePath.
	SaveInterval time.Duration
	// TLS, when set, is the router's certificate source: every control
	// server dialed must then present a server certificate of the
	// cluster's CA (design §11), whatever address the stream announced.
	// Nil is plain text.
	TLS *mtls.Source
	// DialOptions are added to the gRPC dial, after the credentials.
	DialOptions []grpc.DialOption
	// Jitter returns a number in [0, 1); it spreads reconnects so a fleet of
	// routers does not stampede a server. Nil uses math/rand/v2.
	Jitter func() float64
	// KV, when set, receives the KV part of every accepted ephemeral
	// update (design §7.5 tier 2), in stream order.
	KV KVSink
	// Now is the clock of the KV event lag metric; nil is time.Now.
	Now func() time.Time
}

// KVSink takes agents' KV-cache changes (kvindex.Index). ApplyNode is
// called from the client's one goroutine, in stream order, only for updates
// the (epoch, seq) rule accepted: a full update replaces all the node's KV
// state, removed lists replicas the node no longer runs. It returns one
// error per entry of kv (nil: applied), for the client's log.
type KVSink interface {
	ApplyNode(node string, full bool, kv []*llmgwv1.KVBlocks, removed []string) []error
}

// DefaultConfig returns the timings of design §5.6.
func DefaultConfig() Config {
	return Config{
		HeartbeatTimeout: 1500 * time.Millisecond,
		BackoffMin:       100 * time.Millisecond,
		BackoffMax:       5 * time.Second,
		SaveInterval:     2 * time.Second,
	}
}

// Validate reports the first bad field, named as the router's flag.
func (c Config) Validate() error {
	if len(c.Addrs) == 0 {
		return errors.New("--control: at least one control address is required")
	}
	for _, a := range c.Addrs {
		if a == "" {
			return errors.New("--control: empty address")
		}
	}
	if c.HeartbeatTimeout < 0 || c.BackoffMin < 0 || c.BackoffMax < 0 || c.SaveInterval < 0 {
		return errors.New("watch: durations must not be negative")
	}
	return nil
}

func (c *Config) fillDefaults() {
	d := DefaultConfig()
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = d.HeartbeatTimeout
	}
	if c.BackoffMin == 0 {
		c.BackoffMin = d.BackoffMin
	}
	if c.BackoffMax < c.BackoffMin {
		c.BackoffMax = max(d.BackoffMax, c.BackoffMin)
	}
	if c.SaveInterval == 0 {
		c.SaveInterval = d.SaveInterval
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// errResync ends a session so the next one starts with full copies: the
// stream showed the client missed something it cannot recover in place.
var errResync = errors.New("watch: resynchronising")

// chunkBytes is the chunk budget this client asks for
// (WatchRequest.max_chunk_bytes): well within what the client accepts in one
// message (chunking.MaxMessageBytes), so a node's full copy, however large,
// never ends the stream; the server may send smaller chunks.
const chunkBytes = 4 << 20

// maxChunkHeld bounds the chunks held for one update: what a node's full
// copy can hold with the servers' default bounds (4 Mi hashes a replica,
// 8 bytes each, for some dozens of replicas) is far under it.
const maxChunkHeld = 2 << 30

// published pairs a State with a channel closed when a newer one replaces it.
type published struct {
	state   *State
	changed chan struct{}
}

// Client follows the control plane's watch stream, one server at a time,
// and publishes the resulting State. Current and Changed are safe for
// concurrent use; Run is called once.
type Client struct {
	cfg Config
	log *slog.Logger
	m   *metrics

	cur atomic.Pointer[published]

	// Owned by the Run goroutine.
	work     *State // the state being built; published as clones
	aside    *State // a framed snapshot being received, or nil
	asideRev uint64
	// chunks holds the chunks of an ephemeral update until it is whole
	// (chunk.go); one per stream.
	chunks *chunking.Assembler
	dirty  bool // work has changes not yet published
	// seqAhead says work.Ephemeral holds a node's (epoch, seq) past the
	// published one: KV-only updates advance it without publishing. It
	// differs from the published Ephemeral in nothing else, since every
	// other accepted update publishes at once.
	seqAhead bool
	unsaved  bool // a published state or a seq advance not yet written to StatePath
	ring     addrs.Ring
}

// New makes a client and, when StatePath holds a saved state, publishes it
// at once. reg receives the client's metrics (it may be nil).
func New(cfg Config, log *slog.Logger, reg prometheus.Registerer) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.fillDefaults()
	c := &Client{cfg: cfg, log: log, m: newMetrics(reg), work: emptyState(), chunks: chunking.NewAssembler(maxChunkHeld)}
	c.cur.Store(&published{state: emptyState(), changed: make(chan struct{})})
	if cfg.StatePath != "" {
		st, err := loadState(cfg.StatePath)
		switch {
		case err == nil && st != nil:
			c.work = st
			c.publish()
			log.Info("watch: serving from saved state until the control plane answers",
				"revision", st.Revision, "path", cfg.StatePath)
		case err != nil:
			// A damaged file costs only the head start; the stream rebuilds it.
			log.Warn("watch: ignoring saved state", "path", cfg.StatePath, "err", err)
		}
	}
	return c, nil
}

// Current returns the last published State; never nil.
func (c *Client) Current() *State { return c.cur.Load().state }

// Changed returns a channel that is closed once a State newer than the one
// Current returned before the call is published.
func (c *Client) Changed() <-chan struct{} { return c.cur.Load().changed }

func (c *Client) publish() {
	c.dirty = false
	c.seqAhead = false
	c.unsaved = true
	next := &published{state: c.work.clone(), changed: make(chan struct{})}
	old := c.cur.Swap(next)
	close(old.changed)
	c.m.revision.Set(float64(c.work.Revision))
}

// Run follows the stream until ctx is cancelled, switching servers with
// jittered backoff on any error or silence. It returns nil once every
// goroutine it started has stopped; it saves the state a last time on the
// way out.
func (c *Client) Run(ctx context.Context) error {
	wait := backoff.New(c.cfg.BackoffMin, c.cfg.BackoffMax, c.cfg.Jitter)
	var lastSave time.Time
	defer c.save()
	for {
		addr := c.nextAddr()
		progressed, err := c.session(ctx, addr, func() {
			if c.unsaved && time.Since(lastSave) >= c.cfg.SaveInterval {
				c.save()
				lastSave = time.Now()
			}
		})
		if ctx.Err() != nil {
			return nil
		}
		c.m.reconnects.Inc()
		c.log.Warn("watch: stream ended; switching control server", "addr", addr, "err", err)
		if progressed {
			wait.Reset()
		}
		if !backoff.Sleep(ctx, wait.Next()) {
			return nil
		}
	}
}

// nextAddr rotates through the configured addresses and the servers the
// stream announced, so a router configured with one address still fails
// over to the rest of the cluster.
func (c *Client) nextAddr() string {
	var learned []string
	for _, s := range c.work.Servers {
		learned = append(learned, s.GetGrpcAddr())
	}
	return c.ring.Next(addrs.Merge(c.cfg.Addrs, learned))
}

// session runs one stream. progressed reports whether the server sent
// anything, which resets the backoff.
func (c *Client) session(ctx context.Context, addr string, afterEvent func()) (progressed bool, err error) {
	opts := append([]grpc.DialOption{mtls.DialOption(c.cfg.TLS, mtls.RoleServer)}, c.cfg.DialOptions...)
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return false, fmt.Errorf("dial %s: %w", addr, err)
	}
	defer conn.Close()

	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	errSilent := fmt.Errorf("watch: no event from %s for %s", addr, c.cfg.HeartbeatTimeout)
	watchdog := time.AfterFunc(c.cfg.HeartbeatTimeout, func() { cancel(errSilent) })
	defer watchdog.Stop()

	c.aside = nil // a snapshot half-received from another server is abandoned
	// Chunks of an update half-received from another server are abandoned.
	c.chunks = chunking.NewAssembler(maxChunkHeld)
	stream, err := llmgwv1.NewWatchServiceClient(conn).Watch(sctx, &llmgwv1.WatchRequest{
		FromRevision:  c.work.Revision,
		ClientId:      c.cfg.ClientID,
		MaxChunkBytes: chunkBytes,
	})
	if err != nil {
		return false, fmt.Errorf("watch %s: %w", addr, err)
	}
	c.log.Info("watch: stream open", "addr", addr, "from_revision", c.work.Revision)
	for {
		ev, err := stream.Recv()
		if err != nil {
			if cause := context.Cause(sctx); cause != nil && ctx.Err() == nil {
				err = cause
			}
			return progressed, fmt.Errorf("watch %s: recv: %w", addr, err)
		}
		progressed = true
		watchdog.Reset(c.cfg.HeartbeatTimeout)
		if err := c.handle(ev); err != nil {
			return progressed, err
		}
		afterEvent()
	}
}

// handle applies one event to the working state (design §5.3): changes after
// the held revision, framed snapshots built aside and swapped in whole,
// ephemeral data by the (epoch, seq) rule. A non-nil error ends the session.
func (c *Client) handle(ev *llmgwv1.WatchEvent) error {
	switch e := ev.GetEvent().(type) {
	case *llmgwv1.WatchEvent_SnapshotBegin:
		c.m.events.WithLabelValues("snapshot_begin").Inc()
		c.aside = emptyState()
		c.asideRev = e.SnapshotBegin.GetRevision()
	case *llmgwv1.WatchEvent_Change:
		c.m.events.WithLabelValues("change").Inc()
		if c.aside != nil {
			c.aside.applyChange(e.Change)
			return nil
		}
		// One command may change several objects, so several changes share
		// a revision: the held revision advances only at the mark that ends
		// a batch. A stream cut mid-batch resumes from the last complete
		// revision and gets the batch again; puts and deletes are idempotent.
		if e.Change.GetRevision() <= c.work.Revision {
			return nil // already applied: a client never moves backwards
		}
		c.work.applyChange(e.Change)
		c.dirty = true
	case *llmgwv1.WatchEvent_SnapshotEnd:
		c.m.events.WithLabelValues("snapshot_end").Inc()
		r := e.SnapshotEnd.GetRevision()
		if c.aside == nil || r != c.asideRev {
			return fmt.Errorf("watch: snapshot_end %d does not close a snapshot_begin (%d): %w", r, c.asideRev, errResync)
		}
		snap := c.aside
		c.aside = nil
		if r < c.work.Revision {
			c.log.Warn("watch: dropping snapshot older than the held state", "snapshot_revision", r, "revision", c.work.Revision)
			return nil
		}
		snap.Revision = r
		snap.Synced = true
		snap.Ephemeral = c.work.Ephemeral
		snap.Servers = c.work.Servers
		c.work = snap
		c.publish()
	case *llmgwv1.WatchEvent_Mark:
		c.m.events.WithLabelValues("mark").Inc()
		if c.aside != nil {
			return fmt.Errorf("watch: mark inside a snapshot: %w", errResync)
		}
		c.work.Revision = max(c.work.Revision, e.Mark.GetRevision())
		c.work.Synced = true
		c.publish()
	case *llmgwv1.WatchEvent_Ephemeral:
		c.m.events.WithLabelValues("ephemeral").Inc()
		u := e.Ephemeral
		if chunking.IsChunk(u) {
			whole, err := c.chunks.Add(u)
			if err != nil {
				return fmt.Errorf("watch: %w: %w", err, errResync)
			}
			if whole == nil {
				return nil // more chunks to come
			}
			u = whole
		}
		switch judgeEphemeral(c.work.Ephemeral[u.GetNode()], u) {
		case accept:
			if kvOnly(u) {
				// Nothing routable changed: only the held (epoch, seq)
				// moves, so the next delta is judged against it, and the
				// KV sink takes the blocks. No clone, no publish, so no
				// registry rebuild: O(replicas) per update at fleet scale
				// (docs/benchmarks.md "Fleet scale").
				held := c.work.Ephemeral[u.GetNode()]
				c.work.Ephemeral[u.GetNode()] = &NodeEphemeral{Epoch: u.GetEpoch(), Seq: u.GetSeq(),
					Statuses: held.Statuses, Adapters: held.Adapters}
				c.seqAhead = true
				c.unsaved = true
			} else {
				c.work.applyEphemeral(u)
				c.publish()
			}
			if c.cfg.KV != nil {
				now := c.cfg.Now()
				for i, err := range c.cfg.KV.ApplyNode(u.GetNode(), u.GetFull(), u.GetKv(), u.GetRemovedReplicas()) {
					if err != nil {
						c.log.Debug("watch: kv update not applied", "node", u.GetNode(),
							"replica", u.GetKv()[i].GetReplicaId(), "err", err)
						continue
					}
					c.m.observeLag(now, u.GetKv()[i])
				}
			}
		case stale:
			c.m.dropped.WithLabelValues("stale").Inc()
		case gap:
			c.m.dropped.WithLabelValues("gap").Inc()
			return fmt.Errorf("watch: node %s update epoch %d seq %d does not follow the held copy: %w",
				u.GetNode(), u.GetEpoch(), u.GetSeq(), errResync)
		}
	case *llmgwv1.WatchEvent_Servers:
		c.m.events.WithLabelValues("servers").Inc()
		c.work.Servers = e.Servers.GetServers()
		c.publish()
	case *llmgwv1.WatchEvent_Heartbeat:
		c.m.events.WithLabelValues("heartbeat").Inc()
		if c.dirty {
			c.publish() // a batch of changes the server did not close with a mark
		}
	}
	return nil
}

// kvOnly reports whether an update carries nothing but KV blocks: a delta
// with no status, adapter or removed replica. Such an update leaves every
// replica's routability as it was, so it need not be published. A full copy
// always is: it replaces the node's statuses even when it lists none.
func kvOnly(u *llmgwv1.EphemeralUpdate) bool {
	return !u.GetFull() && len(u.GetStatuses()) == 0 && len(u.GetAdapters()) == 0 &&
		len(u.GetRemovedReplicas()) == 0
}

func (c *Client) save() {
	if c.cfg.StatePath == "" || !c.unsaved {
		return
	}
	st := c.Current()
	if c.seqAhead {
		// The published state with the (epoch, seq) KV-only updates
		// advanced: what a publish after each would have saved. save runs
		// on the Run goroutine, which owns work.
		ahead := *st
		ahead.Ephemeral = c.work.Ephemeral
		st = &ahead
	}
	if err := saveState(c.cfg.StatePath, st); err != nil {
		c.log.Warn("watch: saving state", "path", c.cfg.StatePath, "err", err)
		return
	}
	c.unsaved = false
}

type metrics struct {
	events     *prometheus.CounterVec
	dropped    *prometheus.CounterVec
	reconnects prometheus.Counter
	revision   prometheus.Gauge
	kvLag      *prometheus.HistogramVec
}

// observeLag observes, for a KV entry the index applied, the time since
// the engine events it carries (the KVBlocks event times), by edge: the
// oldest batch (the longest any change in the entry waited) and the
// newest. The times are the engine's clock: exact when engine and router
// share a host, off by the two hosts' clock skew otherwise (NTP keeps it
// to milliseconds on a LAN, which is the figure's resolution); a negative
// difference, a clock ahead, counts as 0.
func (m *metrics) observeLag(now time.Time, b *llmgwv1.KVBlocks) {
	for _, e := range []struct {
		edge string
		ns   int64
	}{{"oldest", b.GetOldestEventUnixNano()}, {"newest", b.GetNewestEventUnixNano()}} {
		if e.ns != 0 {
			m.kvLag.WithLabelValues(e.edge).Observe(max(now.Sub(time.Unix(0, e.ns)).Seconds(), 0))
		}
	}
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_watch_events_total",
			Help: "Watch stream events received, by type.",
		}, []string{"type"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_router_watch_ephemeral_dropped_total",
			Help: "Ephemeral updates dropped by the (epoch, seq) rule: stale (old or duplicate) or gap (forces a resync).",
		}, []string{"reason"}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgw_router_watch_reconnects_total",
			Help: "Watch streams that ended and were reopened.",
		}),
		revision: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmgw_router_watch_revision",
			Help: "Desired-state revision the router routes from.",
		}),
		kvLag: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "llmgw_router_kv_event_lag_seconds",
			Help: "Time from an engine's KV-event batch (its ts, on the engine's clock) to the change applied to this router's KV index, by edge: the oldest and the newest batch an update carries.",
			// 1 ms to 8 s, each √2 times the last, as the agent's
			// llmgw_agent_kv_event_lag_seconds.
			Buckets: prometheus.ExponentialBuckets(0.001, math.Sqrt2, 27),
		}, []string{"edge"}),
	}
	if reg != nil {
		reg.MustRegister(m.events, m.dropped, m.reconnects, m.revision, m.kvLag)
	}
	return m
}
