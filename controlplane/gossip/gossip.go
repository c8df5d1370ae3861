package gossip

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"maps"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/llmgw/llmgw/controlplane/logadapt"
	"github.com/llmgw/llmgw/internal/mtls"
	"github.com/llmgw/llmgw/internal/netlimit"
)

// Config tunes memberlist; the zero value keeps DefaultLANConfig's
// timings. Tests shorten them so deaths are noticed in about a second.
type Config struct {
	ProbeInterval    time.Duration `yaml:"probe_interval"`
	ProbeTimeout     time.Duration `yaml:"probe_timeout"`
	GossipInterval   time.Duration `yaml:"gossip_interval"`
	SuspicionMult    int           `yaml:"suspicion_mult"`
	PushPullInterval time.Duration `yaml:"push_pull_interval"`
	// ReconnectInterval is how often a failed (dead, not left) server is
	// retried, and ReconnectTimeout how long before it is reaped (see
	// Reconnect); zero keeps DefaultReconnectInterval and
	// DefaultReconnectTimeout.
	ReconnectInterval time.Duration `yaml:"reconnect_interval"`
	ReconnectTimeout  time.Duration `yaml:"reconnect_timeout"`
}

// Security is how gossip is protected (design §11); the zero value is
// plain text, for loopback and tests.
type Security struct {
	// Keyring encrypts and authenticates every gossip message; nil runs
	// gossip unencrypted. With it memberlist refuses anything not
	// encrypted with one of its keys, both ways.
	Keyring *Keyring
	// TLS carries memberlist's streams (joins, push/pull, reliable sends)
	// over mutual TLS with server certificates only; nil is plain TCP.
	TLS *mtls.Source
	// Conns bounds the incoming streams (design §11 "Limits"): in total
	// and per address, and the time to their handshake (its
	// HandshakeTimeout, or 10 s). Nil caps nothing.
	Conns *netlimit.Limiter
}

// Plane is the end of the ephemeral plane (package plane) that shares
// memberlist with the tombstones: its messages (those opening with
// PlaneBatchKind or PlaneDigestKind) arrive through Receive, and its digest
// rides in push/pull state. Its methods must not block.
type Plane interface {
	Receive(msg []byte)
	LocalState() []byte
	MergeRemoteState(digest []byte)
}

// Gossip is this server's memberlist member. It keeps its own view of every
// server ever seen and the tombstones of servers removed from Raft, which
// it spreads to the others. Its methods are safe for concurrent use.
type Gossip struct {
	log   *slog.Logger
	self  Meta
	ml    atomic.Pointer[memberlist.Memberlist]
	addr  atomic.Pointer[string] // the bound address, set by Start
	queue *memberlist.TransmitLimitedQueue
	// changed is signalled (without blocking) on every membership change,
	// to wake the bootstrapper and the leader's reconciler.
	changed chan struct{}
	now     func() time.Time
	plane   Plane
	tune    Config // as Start was given it
	// cluster is the cluster id once known (SetCluster), nil before.
	cluster atomic.Pointer[string]
	// refusedLogged keeps the refusals of foreign members logged once per
	// member and cluster id, so a refused server's gossip cannot flood the
	// log.
	refusedLogged sync.Map

	reconnectAttempts, reconnects atomic.Uint64

	mu      sync.Mutex
	members map[string]*Member // by server id
	// failedAt is when each member now dead was seen to fail, for the
	// reconnect window (Reconnect).
	failedAt map[string]time.Time
	// leftIntent holds the servers that announced a leave (see Leave):
	// their death is a leave. A server alive again drops it.
	leftIntent map[string]bool
	tombstones map[string]Tombstone
}

// Tombstone is a last-writer-wins record of a removal: Removed says whether
// the id is currently kept out of Raft; At (Unix ns, the clock of the
// server that wrote it) orders records for the same id, so a later explicit
// join (Removed false) clears an earlier removal. Package cluster weighs
// them against the replicated records (fsm) by the same clock.
type Tombstone struct {
	Removed bool  `json:"r"`
	At      int64 `json:"t"`
}

// New returns a member for self that is not yet in any pool; p (may be
// nil) gets the ephemeral plane's messages; now stamps tombstones.
func New(self Meta, p Plane, log *slog.Logger, now func() time.Time) *Gossip {
	g := &Gossip{
		log:        log,
		self:       self,
		changed:    make(chan struct{}, 1),
		now:        now,
		plane:      p,
		members:    map[string]*Member{},
		failedAt:   map[string]time.Time{},
		leftIntent: map[string]bool{},
		tombstones: map[string]Tombstone{},
	}
	g.queue = &memberlist.TransmitLimitedQueue{
		NumNodes:       func() int { return max(1, g.numMembers()) },
		RetransmitMult: 4,
	}
	return g
}

// Start binds memberlist on addr (--gossip-addr), protected by sec.
func (g *Gossip) Start(addr string, tune Config, sec Security) error {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--gossip-addr: %w", err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return fmt.Errorf("--gossip-addr: port %q: %w", portStr, err)
	}
	g.tune = tune
	c := memberlist.DefaultLANConfig()
	// The plane's messages are mostly KV block hashes, which LZW grows by
	// a third, at 19 ms a MiB (both ends): a warm node's 16 MB full copy
	// took 1.0–1.2 s to reach a peer with it, 0.4–0.8 s without
	// (docs/benchmarks.md "Large KV caches"). Peers that still compress are
	// read as before: each message says whether it is compressed.
	c.EnableCompression = false
	c.Name = g.self.ID
	c.BindAddr, c.BindPort = host, port
	c.AdvertisePort = port
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		c.AdvertiseAddr = "" // memberlist picks a private address
	} else {
		c.AdvertiseAddr = host
	}
	if tune.ProbeInterval > 0 {
		c.ProbeInterval = tune.ProbeInterval
	}
	if tune.ProbeTimeout > 0 {
		c.ProbeTimeout = tune.ProbeTimeout
	}
	if tune.GossipInterval > 0 {
		c.GossipInterval = tune.GossipInterval
	}
	if tune.SuspicionMult > 0 {
		c.SuspicionMult = tune.SuspicionMult
	}
	if tune.PushPullInterval > 0 {
		c.PushPullInterval = tune.PushPullInterval
	}
	if sec.Keyring != nil {
		c.Keyring = sec.Keyring.Memberlist()
		c.GossipVerifyIncoming, c.GossipVerifyOutgoing = true, true
	}
	c.Delegate = (*delegate)(g)
	c.Events = (*events)(g)
	c.Merge, c.Alive = (*identityGuard)(g), (*identityGuard)(g)
	c.Logger = logadapt.NewMemberlistLogger(g.log.With("subsystem", "memberlist"))
	if _, err := g.self.Encode(); err != nil {
		return err
	}
	nt, err := newNetTransport(host, port, c.Logger)
	if err != nil {
		return fmt.Errorf("gossip on %s: %w", addr, err)
	}
	if port == 0 {
		c.BindPort = nt.GetAutoBindPort()
		c.AdvertisePort = c.BindPort
	}
	c.Transport = newStreamTransport(nt, sec.TLS, sec.Conns, c.Logger)
	switch {
	case sec.Keyring != nil:
	case sec.TLS != nil:
		g.log.Warn("gossip streams need a server certificate, but UDP gossip is not authenticated without --gossip-key-file", "gossip_addr", addr)
	case !mtls.IsLoopback(addr):
		g.log.Warn("gossip is neither encrypted nor authenticated: whoever reaches it can join; give --gossip-key-file and TLS", "gossip_addr", addr)
	}
	ml, err := memberlist.Create(c)
	if err != nil {
		if c.Transport != nil {
			_ = c.Transport.Shutdown()
		}
		return fmt.Errorf("gossip on %s: %w", addr, err)
	}
	n := ml.LocalNode()
	bound := net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
	g.addr.Store(&bound)
	g.ml.Store(ml)
	return nil
}

// newNetTransport binds memberlist's own transport on host:port, retrying
// a few times on port 0 as memberlist does: its TCP and UDP sockets take
// the same port, which another process may hold for one of them.
func newNetTransport(host string, port int, logger *log.Logger) (*memberlist.NetTransport, error) {
	tries := 1
	if port == 0 {
		tries = 10
	}
	var err error
	for range tries {
		var nt *memberlist.NetTransport
		if nt, err = memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{host}, BindPort: port, Logger: logger}); err == nil {
			return nt, nil
		}
	}
	return nil, err
}

// Self is this server's metadata.
func (g *Gossip) Self() Meta {
	m := g.self
	if id := g.cluster.Load(); id != nil {
		m.Cluster = *id
	}
	return m
}

// Addr is the bound gossip address (useful with port 0). It is read once,
// at Start: memberlist's LocalNode hands out its own node record, which
// UpdateNode (a new cluster id in the metadata) rewrites under its lock,
// not ours.
func (g *Gossip) Addr() string {
	if a := g.addr.Load(); a != nil {
		return *a
	}
	return ""
}

// Join contacts the given gossip addresses; it reports how many answered.
func (g *Gossip) Join(addrs []string) (int, error) {
	n, err := g.ml.Load().Join(addrs)
	if err != nil {
		// Memberlist flattens the delegates' errors into text; a refusal
		// by the identity guard (either side's) is told apart by its words,
		// so the operator reads "refused", not "unreachable".
		if strings.Contains(err.Error(), foreignWords) {
			return n, fmt.Errorf("gossip join %v: %w: %w", addrs, ErrForeignCluster, err)
		}
		return n, fmt.Errorf("gossip join %v: %w", addrs, err)
	}
	return n, nil
}

// Leave tells the others this server leaves on purpose (status left, not
// dead), so the leader removes it from Raft and never adds it back, and no
// server's reconnect loop retries it.
//
// Memberlist itself cannot say so: its leave is a "dead" message the node
// sends about itself, and the event delegate is handed the node without
// the state that records it (memberlist sets nodeState.State, never
// Node.State), so every leave used to arrive as a death. A leave intent of
// this package's own (leaveKind, the id) is broadcast first; a server that
// holds it sees the death that follows as a leave, in either order.
func (g *Gossip) Leave(timeout time.Duration) error {
	g.queue.QueueBroadcast(leaveBroadcast(append([]byte{leaveKind}, g.self.ID...)))
	return g.ml.Load().Leave(timeout)
}

// leaveKind marks a leave intent among the gossip messages: the kind
// byte, then the leaving server's id. Servers before it read it as
// undecodable tombstones and log it.
const leaveKind byte = 0xC2

// PlaneBatchKind and PlaneDigestKind are the kind bytes that open the
// ephemeral plane's messages (its batches, and its digest in push/pull
// state): a message that starts with one is the Plane's, and is handed to
// it whole. Every kind byte on memberlist's channels is allocated here,
// beside this package's own (stateKind, leaveKind, tombstones' '{'), so
// none collides; the plane writes these (package plane imports them), and
// gossip knows nothing of the plane but the Plane interface: membership
// does not depend on the ephemeral plane (design §3).
const (
	PlaneBatchKind  byte = 0xB1
	PlaneDigestKind byte = 0xD1
)

// isPlaneMessage reports whether a gossip message belongs to the plane.
func isPlaneMessage(b []byte) bool {
	return len(b) > 0 && (b[0] == PlaneBatchKind || b[0] == PlaneDigestKind)
}

// leaveBroadcast is a leave intent; a newer one for the same server
// replaces it in the queue.
type leaveBroadcast []byte

func (b leaveBroadcast) Invalidates(o memberlist.Broadcast) bool {
	ob, ok := o.(leaveBroadcast)
	return ok && string(ob) == string(b)
}
func (b leaveBroadcast) Message() []byte { return b }
func (b leaveBroadcast) Finished()       {}

// leaving records another server's leave intent; a member already dead is
// left now. The message is outside input: an intent for a server this
// table does not hold is dropped, so forged ones cannot grow the map (a
// leaving server was alive, hence known, before it left).
func (g *Gossip) leaving(id string) {
	if id == "" || id == g.self.ID {
		return
	}
	g.mu.Lock()
	m, ok := g.members[id]
	if !ok {
		g.mu.Unlock()
		return
	}
	g.leftIntent[id] = true
	changed := m.Status == StatusDead
	if changed {
		m.Status = StatusLeft
		delete(g.failedAt, id)
	}
	g.mu.Unlock()
	if changed {
		g.log.Info("gossip member", "member", id, "status", string(StatusLeft), "gossip_addr", m.GossipAddr)
		g.notify()
	}
}

// Shutdown stops memberlist without a leave: the others see this server
// dead, not gone.
func (g *Gossip) Shutdown() error {
	ml := g.ml.Load()
	if ml == nil {
		return nil
	}
	if err := ml.Shutdown(); err != nil {
		return fmt.Errorf("gossip shutdown: %w", err)
	}
	return nil
}

// Changed is signalled (at most one pending signal) on every membership
// change.
func (g *Gossip) Changed() <-chan struct{} { return g.changed }

func (g *Gossip) notify() {
	select {
	case g.changed <- struct{}{}:
	default:
	}
}

func (g *Gossip) numMembers() int {
	ml := g.ml.Load()
	if ml == nil {
		return 1
	}
	return ml.NumMembers()
}

// Snapshot returns every server ever seen, by id, with its status as the
// event delegate last reported it.
func (g *Gossip) Snapshot() map[string]Member {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string]Member, len(g.members))
	for id, m := range g.members {
		out[id] = *m
	}
	return out
}

// Member returns a server's gossip entry.
func (g *Gossip) Member(id string) (Member, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	m, ok := g.members[id]
	if !ok {
		return Member{}, false
	}
	return *m, true
}

func (g *Gossip) track(n *memberlist.Node, status Status) {
	meta, err := DecodeMeta(n.Meta)
	if err != nil {
		g.log.Warn("gossip member ignored: bad metadata", "member", n.Name, "err", err)
		return
	}
	if meta.ID != n.Name {
		g.log.Warn("gossip member ignored: name and id differ", "member", n.Name, "id", meta.ID)
		return
	}
	g.mu.Lock()
	prev, seen := g.members[meta.ID]
	switch {
	case status == StatusAlive:
		delete(g.leftIntent, meta.ID)
	case status == StatusDead && g.leftIntent[meta.ID]:
		status = StatusLeft
	}
	g.members[meta.ID] = &Member{Meta: meta, GossipAddr: n.Address(), Status: status}
	switch {
	case status != StatusDead:
		delete(g.failedAt, meta.ID)
	case !seen || prev.Status != StatusDead:
		g.failedAt[meta.ID] = g.now()
	}
	g.mu.Unlock()
	if !seen || prev.Status != status {
		g.log.Info("gossip member", "member", meta.ID, "status", string(status), "gossip_addr", n.Address(), "raft_addr", meta.Raft, "grpc_addr", meta.GRPC)
	}
	g.notify()
}

// Removed reports whether id is tombstoned (kept out of Raft).
func (g *Gossip) Removed(id string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.tombstones[id].Removed
}

// Tombstones returns a copy of every tombstone, by server id.
func (g *Gossip) Tombstones() map[string]Tombstone {
	g.mu.Lock()
	defer g.mu.Unlock()
	return maps.Clone(g.tombstones)
}

// SetRemoved records (or clears) a removal, spreads it to the others and
// returns its time: now, or just after the id's previous record, so it
// supersedes that one whatever the clock did.
func (g *Gossip) SetRemoved(id string, removed bool) int64 {
	t := Tombstone{Removed: removed, At: g.now().UnixNano()}
	g.mu.Lock()
	if old, ok := g.tombstones[id]; ok && old.At >= t.At {
		t.At = old.At + 1
	}
	g.tombstones[id] = t
	g.mu.Unlock()
	b, _ := json.Marshal(map[string]Tombstone{id: t})
	if g.queue != nil {
		g.queue.QueueBroadcast(tombstoneBroadcast(b))
	}
	return t.At
}

// mergeTombstones applies records from another server, newest per id wins.
func (g *Gossip) mergeTombstones(b []byte) {
	var in map[string]Tombstone
	if err := json.Unmarshal(b, &in); err != nil {
		g.log.Warn("gossip tombstones ignored: undecodable", "err", err)
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for id, t := range in {
		if id == "" {
			continue
		}
		if old, ok := g.tombstones[id]; !ok || t.At > old.At {
			g.tombstones[id] = t
		}
	}
}

func (g *Gossip) tombstonesJSON() []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	b, _ := json.Marshal(g.tombstones)
	return b
}

type tombstoneBroadcast []byte

func (b tombstoneBroadcast) Invalidates(memberlist.Broadcast) bool { return false }
func (b tombstoneBroadcast) Message() []byte                       { return b }
func (b tombstoneBroadcast) Finished()                             {}

// delegate is memberlist's Delegate: metadata out, tombstones both ways.
// Its methods run on memberlist's receive loop and must not block.
type delegate Gossip

func (d *delegate) NodeMeta(int) []byte {
	b, err := (*Gossip)(d).Self().Encode()
	if err != nil {
		return nil // Start refused it already
	}
	return b
}
func (d *delegate) NotifyMsg(b []byte) {
	if isPlaneMessage(b) {
		if d.plane != nil {
			d.plane.Receive(b)
		}
		return
	}
	if len(b) > 0 && b[0] == leaveKind {
		(*Gossip)(d).leaving(string(b[1:]))
		return
	}
	(*Gossip)(d).mergeTombstones(b)
}
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte {
	return d.queue.GetBroadcasts(overhead, limit)
}

// LocalState is this server's push/pull state: its tombstones and the
// ephemeral plane's digest (see encodeState).
func (d *delegate) LocalState(bool) []byte {
	var digest []byte
	if d.plane != nil {
		digest = d.plane.LocalState()
	}
	return encodeState((*Gossip)(d).tombstonesJSON(), digest)
}
func (d *delegate) MergeRemoteState(b []byte, _ bool) {
	tombstones, digest, err := decodeState(b)
	if err != nil {
		d.log.Warn("gossip state ignored: undecodable", "err", err)
		return
	}
	if len(tombstones) > 0 {
		(*Gossip)(d).mergeTombstones(tombstones)
	}
	if len(digest) > 0 && d.plane != nil {
		d.plane.MergeRemoteState(digest)
	}
}

// stateKind marks push/pull state that carries both tombstones and the
// plane's digest: the kind byte, the tombstones' length (uvarint), the
// tombstones (JSON), then the digest. State starting with '{' is
// tombstones alone, as servers before the plane sent it.
const stateKind byte = 0xC1

func encodeState(tombstones, digest []byte) []byte {
	b := []byte{stateKind}
	b = binary.AppendUvarint(b, uint64(len(tombstones)))
	b = append(b, tombstones...)
	return append(b, digest...)
}

// decodeState splits push/pull state from another server: outside input.
func decodeState(b []byte) (tombstones, digest []byte, err error) {
	if len(b) == 0 {
		return nil, nil, nil
	}
	if b[0] != stateKind {
		return b, nil, nil
	}
	n, l := binary.Uvarint(b[1:])
	if l <= 0 || n > uint64(len(b)-1-l) {
		return nil, nil, errors.New("gossip state: bad tombstone length")
	}
	rest := b[1+l:]
	return rest[:n], rest[n:], nil
}

// events is memberlist's EventDelegate.
type events Gossip

func (e *events) NotifyJoin(n *memberlist.Node)   { (*Gossip)(e).track(n, StatusAlive) }
func (e *events) NotifyUpdate(n *memberlist.Node) { (*Gossip)(e).track(n, StatusAlive) }

// NotifyLeave is a death or a leave; memberlist does not say which (see
// Leave), the leave intents do.
func (e *events) NotifyLeave(n *memberlist.Node) { (*Gossip)(e).track(n, StatusDead) }

// errNotAlive is a plane send to a server gossip does not see alive.
var errNotAlive = errors.New("not alive in gossip")

// Peers and Send are the ephemeral plane's transport (plane.Transport)
// over memberlist's reliable send (design §5.4: plain broadcast loses
// messages). They read the servers from this package's own table (kept by
// the event delegate, which hands over copies), not from memberlist's
// Members(): its node structs are mutated under memberlist's lock, and
// reading them here raced.
func (g *Gossip) Peers() []string {
	var out []string
	for id, m := range g.Snapshot() {
		if id != g.self.ID && m.Status == StatusAlive {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

// Send delivers msg to peer over a reliable (TCP) memberlist message.
func (g *Gossip) Send(peer string, msg []byte) error {
	ml := g.ml.Load()
	m, ok := g.Member(peer)
	if ml == nil || !ok || m.Status != StatusAlive {
		return fmt.Errorf("send to %s: %w", peer, errNotAlive)
	}
	host, port, err := net.SplitHostPort(m.GossipAddr)
	p, perr := strconv.ParseUint(port, 10, 16)
	if err != nil || perr != nil || net.ParseIP(host) == nil {
		return fmt.Errorf("send to %s: bad gossip address %q", peer, m.GossipAddr)
	}
	// SendReliable reads only the node's name and address: a node of our own
	// making is enough, and reliable (a stream per message) is what the
	// plane needs (design §5.4).
	to := &memberlist.Node{Name: peer, Addr: net.ParseIP(host), Port: uint16(p)}
	if err := ml.SendReliable(to, msg); err != nil {
		return fmt.Errorf("send to %s: %w", peer, err)
	}
	return nil
}
