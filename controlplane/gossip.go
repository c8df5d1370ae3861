package controlplane

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/llmgw/llmgw/controlplane/plane"
)

// serverMeta is what a control server tells the others about itself over
// gossip (plan §5.4): enough to add it to Raft, to forward to it, and to
// check that every server was started with the same bootstrap expectation.
// It travels as memberlist node metadata, which is capped at 512 bytes.
type serverMeta struct {
	ID      string `json:"id"`
	Version string `json:"v,omitempty"`
	GRPC    string `json:"g"`
	Raft    string `json:"r"`
	HTTP    string `json:"h,omitempty"`
	// Expect is --bootstrap-expect; Bootstrap is --bootstrap (a single-node
	// start, which no expectation matches).
	Expect    int  `json:"e,omitempty"`
	Bootstrap bool `json:"b,omitempty"`
}

func (m serverMeta) encode() ([]byte, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	if len(b) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("gossip metadata is %d bytes, over memberlist's %d: shorten --node-id or the addresses", len(b), memberlist.MetaMaxSize)
	}
	return b, nil
}

// decodeMeta reads another server's metadata: outside input, so a bad one
// is an error the caller logs, never a crash.
func decodeMeta(b []byte) (serverMeta, error) {
	var m serverMeta
	if len(b) == 0 {
		return m, errors.New("no metadata")
	}
	if len(b) > memberlist.MetaMaxSize {
		return m, fmt.Errorf("metadata of %d bytes exceeds %d", len(b), memberlist.MetaMaxSize)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return m, fmt.Errorf("decode metadata: %w", err)
	}
	if m.ID == "" || m.Raft == "" || m.GRPC == "" {
		return m, errors.New("metadata lacks id, raft or grpc address")
	}
	if m.Expect < 0 {
		return m, fmt.Errorf("bootstrap expect %d is negative", m.Expect)
	}
	return m, nil
}

// memberStatus is a server's gossip status as Members reports it.
type memberStatus string

const (
	statusAlive   memberStatus = "alive"
	statusSuspect memberStatus = "suspect"
	statusDead    memberStatus = "dead"
	statusLeft    memberStatus = "left"
)

// member is one control server as gossip knows it.
type member struct {
	meta       serverMeta
	gossipAddr string
	status     memberStatus
}

// GossipConfig tunes memberlist; the zero value keeps DefaultLANConfig's
// timings. Tests shorten them so deaths are noticed in about a second.
type GossipConfig struct {
	ProbeInterval    time.Duration `yaml:"probe_interval"`
	ProbeTimeout     time.Duration `yaml:"probe_timeout"`
	GossipInterval   time.Duration `yaml:"gossip_interval"`
	SuspicionMult    int           `yaml:"suspicion_mult"`
	PushPullInterval time.Duration `yaml:"push_pull_interval"`
}

// gossip is this server's memberlist member. It keeps its own view of every
// server ever seen (memberlist forgets dead ones from Members) and the
// tombstones of servers removed from Raft, which it spreads to the others
// (broadcast, and push/pull as the backstop) so any future leader honours
// them.
type gossip struct {
	log   *slog.Logger
	self  serverMeta
	ml    atomic.Pointer[memberlist.Memberlist]
	queue *memberlist.TransmitLimitedQueue
	// changed is signalled (without blocking) on every membership change,
	// to wake the bootstrapper and the leader's reconciler.
	changed chan struct{}
	now     func() time.Time
	// plane gets the ephemeral plane's messages and takes part in
	// push/pull with its digest; set before start.
	plane *plane.Plane

	mu         sync.Mutex
	members    map[string]*member // by server id
	tombstones map[string]tombstone
}

// tombstone is a last-writer-wins record of a removal: Removed says whether
// the id is currently kept out of Raft; At orders records for the same id,
// so a later explicit join (Removed false) clears an earlier removal.
type tombstone struct {
	Removed bool  `json:"r"`
	At      int64 `json:"t"`
}

func newGossip(self serverMeta, log *slog.Logger, now func() time.Time) *gossip {
	g := &gossip{
		log:        log,
		self:       self,
		changed:    make(chan struct{}, 1),
		now:        now,
		members:    map[string]*member{},
		tombstones: map[string]tombstone{},
	}
	g.queue = &memberlist.TransmitLimitedQueue{
		NumNodes:       func() int { return max(1, g.numMembers()) },
		RetransmitMult: 4,
	}
	return g
}

// start binds memberlist on addr. The node name is the server id, so a
// restarted server replaces its old entry rather than appearing twice.
func (g *gossip) start(addr string, tune GossipConfig) error {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--gossip-addr: %w", err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return fmt.Errorf("--gossip-addr: port %q: %w", portStr, err)
	}
	c := memberlist.DefaultLANConfig()
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
	c.Delegate = (*gossipDelegate)(g)
	c.Events = (*gossipEvents)(g)
	c.Logger = log.New(&memberlistLogWriter{log: g.log.With("subsystem", "memberlist")}, "", 0)
	if _, err := g.self.encode(); err != nil {
		return err
	}
	ml, err := memberlist.Create(c)
	if err != nil {
		return fmt.Errorf("gossip on %s: %w", addr, err)
	}
	g.ml.Store(ml)
	return nil
}

// addr is the bound gossip address (useful with port 0).
func (g *gossip) addr() string {
	n := g.ml.Load().LocalNode()
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}

// join contacts the given gossip addresses; it reports how many answered.
func (g *gossip) join(addrs []string) (int, error) {
	n, err := g.ml.Load().Join(addrs)
	if err != nil {
		return n, fmt.Errorf("gossip join %v: %w", addrs, err)
	}
	return n, nil
}

// retryJoin joins addrs in the background until one answers (plan §5.2:
// every server is started with the same --join list, in any order).
func (g *gossip) retryJoin(ctx context.Context, addrs []string, every time.Duration) {
	for attempt := 1; ; attempt++ {
		n, err := g.join(addrs)
		if n > 0 {
			g.log.Info("joined the gossip pool", "contacted", n, "addrs", addrs)
			return
		}
		if attempt == 1 || attempt%30 == 0 {
			g.log.Warn("gossip join failed; retrying", "addrs", addrs, "attempt", attempt, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

// leave tells the others this server leaves on purpose (status left, not
// dead), so the leader removes it from Raft and never adds it back.
func (g *gossip) leave(timeout time.Duration) error {
	return g.ml.Load().Leave(timeout)
}

func (g *gossip) shutdown() error {
	ml := g.ml.Load()
	if ml == nil {
		return nil
	}
	if err := ml.Shutdown(); err != nil {
		return fmt.Errorf("gossip shutdown: %w", err)
	}
	return nil
}

func (g *gossip) notify() {
	select {
	case g.changed <- struct{}{}:
	default:
	}
}

func (g *gossip) numMembers() int {
	ml := g.ml.Load()
	if ml == nil {
		return 1
	}
	return ml.NumMembers()
}

// snapshot returns every server ever seen, by id, with its status as the
// event delegate last reported it. memberlist's suspicion is not read: it
// is only visible through Members(), whose node structs memberlist mutates
// under its own lock, so reading their State races (go test -race saw it).
// A suspect server therefore shows as alive until it is declared dead.
func (g *gossip) snapshot() map[string]member {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string]member, len(g.members))
	for id, m := range g.members {
		out[id] = *m
	}
	return out
}

// memberByID returns a server's gossip entry.
func (g *gossip) memberByID(id string) (member, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	m, ok := g.members[id]
	if !ok {
		return member{}, false
	}
	return *m, true
}

func (g *gossip) track(n *memberlist.Node, status memberStatus) {
	meta, err := decodeMeta(n.Meta)
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
	g.members[meta.ID] = &member{meta: meta, gossipAddr: n.Address(), status: status}
	g.mu.Unlock()
	if !seen || prev.status != status {
		g.log.Info("gossip member", "member", meta.ID, "status", string(status), "gossip_addr", n.Address(), "raft_addr", meta.Raft, "grpc_addr", meta.GRPC)
	}
	g.notify()
}

// removed reports whether id is tombstoned (kept out of Raft).
func (g *gossip) removed(id string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.tombstones[id].Removed
}

// setRemoved records (or clears) a removal and spreads it to the others.
func (g *gossip) setRemoved(id string, removed bool) {
	t := tombstone{Removed: removed, At: g.now().UnixNano()}
	g.mu.Lock()
	if old, ok := g.tombstones[id]; ok && old.At >= t.At {
		t.At = old.At + 1
	}
	g.tombstones[id] = t
	g.mu.Unlock()
	b, _ := json.Marshal(map[string]tombstone{id: t})
	if g.queue != nil {
		g.queue.QueueBroadcast(tombstoneBroadcast(b))
	}
}

// mergeTombstones applies records from another server, newest per id wins.
func (g *gossip) mergeTombstones(b []byte) {
	var in map[string]tombstone
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

func (g *gossip) tombstonesJSON() []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	b, _ := json.Marshal(g.tombstones)
	return b
}

type tombstoneBroadcast []byte

func (b tombstoneBroadcast) Invalidates(memberlist.Broadcast) bool { return false }
func (b tombstoneBroadcast) Message() []byte                       { return b }
func (b tombstoneBroadcast) Finished()                             {}

// gossipDelegate is memberlist's Delegate: metadata out, tombstones both
// ways. Its methods run on memberlist's receive loop and must not block.
type gossipDelegate gossip

func (d *gossipDelegate) NodeMeta(int) []byte {
	b, err := d.self.encode()
	if err != nil {
		return nil // start refused it already
	}
	return b
}
func (d *gossipDelegate) NotifyMsg(b []byte) {
	if plane.IsPlaneMessage(b) {
		if d.plane != nil {
			d.plane.Receive(b)
		}
		return
	}
	(*gossip)(d).mergeTombstones(b)
}
func (d *gossipDelegate) GetBroadcasts(overhead, limit int) [][]byte {
	return d.queue.GetBroadcasts(overhead, limit)
}

// LocalState is this server's push/pull state: its tombstones and the
// ephemeral plane's digest (see encodeState).
func (d *gossipDelegate) LocalState(bool) []byte {
	var digest []byte
	if d.plane != nil {
		digest = d.plane.LocalState()
	}
	return encodeState((*gossip)(d).tombstonesJSON(), digest)
}
func (d *gossipDelegate) MergeRemoteState(b []byte, _ bool) {
	tombstones, digest, err := decodeState(b)
	if err != nil {
		d.log.Warn("gossip state ignored: undecodable", "err", err)
		return
	}
	if len(tombstones) > 0 {
		(*gossip)(d).mergeTombstones(tombstones)
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

// planeTransport reaches the other servers for the ephemeral plane over
// memberlist's reliable send (plan §5.4: plain broadcast loses messages).
type planeTransport Server

// Peers and Send read the servers from the gossip's own table (kept by the
// event delegate, which hands over copies), not from memberlist's
// Members(): its node structs are mutated under memberlist's lock, and
// reading them here raced.
func (t *planeTransport) Peers() []string {
	g := t.gossip
	if g == nil {
		return nil
	}
	var out []string
	for id, m := range g.snapshot() {
		if id != g.self.ID && m.status == statusAlive {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

func (t *planeTransport) Send(peer string, msg []byte) error {
	if t.dropForward != nil && t.dropForward(peer, msg) {
		return nil // lost, as a network would lose it
	}
	g := t.gossip
	if g == nil {
		return errNoGossip
	}
	ml := g.ml.Load()
	m, ok := g.memberByID(peer)
	if ml == nil || !ok || m.status != statusAlive {
		return fmt.Errorf("send to %s: %w", peer, errNotPeer)
	}
	host, port, err := net.SplitHostPort(m.gossipAddr)
	p, perr := strconv.ParseUint(port, 10, 16)
	if err != nil || perr != nil || net.ParseIP(host) == nil {
		return fmt.Errorf("send to %s: bad gossip address %q", peer, m.gossipAddr)
	}
	// SendReliable reads only the node's name and address: a node of our own
	// making is enough, and reliable (a stream per message) is what the
	// plane needs (plan §5.4).
	to := &memberlist.Node{Name: peer, Addr: net.ParseIP(host), Port: uint16(p)}
	if err := ml.SendReliable(to, msg); err != nil {
		return fmt.Errorf("send to %s: %w", peer, err)
	}
	return nil
}

// gossipEvents is memberlist's EventDelegate.
type gossipEvents gossip

func (e *gossipEvents) NotifyJoin(n *memberlist.Node)   { (*gossip)(e).track(n, statusAlive) }
func (e *gossipEvents) NotifyUpdate(n *memberlist.Node) { (*gossip)(e).track(n, statusAlive) }
func (e *gossipEvents) NotifyLeave(n *memberlist.Node) {
	st := statusDead
	if n.State == memberlist.StateLeft {
		st = statusLeft
	}
	(*gossip)(e).track(n, st)
}

// sortedIDs returns the ids of ms in order.
func sortedIDs(ms map[string]member) []string {
	ids := make([]string, 0, len(ms))
	for id := range ms {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// memberlistLogWriter re-logs memberlist's "[LEVEL] memberlist: msg" lines
// through slog at their level.
type memberlistLogWriter struct{ log *slog.Logger }

func (w *memberlistLogWriter) Write(p []byte) (int, error) {
	for _, line := range bytes.Split(p, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		level := slog.LevelInfo
		for prefix, l := range map[string]slog.Level{"[DEBUG]": slog.LevelDebug, "[INFO]": slog.LevelInfo, "[WARN]": slog.LevelWarn, "[ERR]": slog.LevelError, "[ERROR]": slog.LevelError} {
			if bytes.HasPrefix(line, []byte(prefix)) {
				level = l
				line = bytes.TrimSpace(line[len(prefix):])
				break
			}
		}
		line = bytes.TrimPrefix(line, []byte("memberlist: "))
		w.log.Log(context.Background(), level, string(line))
	}
	return len(p), nil
}

var _ io.Writer = (*memberlistLogWriter)(nil)
