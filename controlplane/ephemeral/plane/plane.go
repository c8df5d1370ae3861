// Package plane is the ephemeral plane between control nodes (design §5.4):
// each control node owns the agent sessions attached to it and forwards
// their updates — unchanged, with the agent's own (node, epoch, seq) — to
// every other control node, so every node's watchers see every agent.
//
// How it stays whole without a reliable broadcast (memberlist's loses most
// messages on 5 nodes; Serf re-queues and Consul fans out with SendReliable, design §5.4):
//   - once per tick, one batched message per peer, over memberlist's
//     reliable (TCP) send; one sender goroutine per peer, so a dead peer
//     stalls only its own queue;
//   - a send that fails, or a queue that overflows, makes the next message
//     to that peer a full copy of every owned agent instead of deltas;
//   - receivers apply by the (epoch, seq) rule of package ephemeral; a delta
//     that arrives early (separate connections may reorder) waits in a small
//     per-agent buffer; a gap the buffer does not close within a few ticks
//     asks the owner for a full copy at once;
//   - every batch carries the sender's whole list of live sessions (node,
//     epoch, last seq), and push/pull state carries it as a digest every few
//     seconds: a receiver still behind a digest a few ticks later asks for a
//     full copy — the backstop for a loss nothing else revealed.
//
// The session lists are also how the cluster knows which agents are
// attached anywhere: a node is down only when no control node holds a live
// session for it (design §5.4 "grace").
package plane

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/chunking"
	"github.com/llmgw/llmgw/controlplane/ephemeral"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Store is where agents' data is kept on this node: ephemeral.Store. Safe
// for concurrent use.
type Store interface {
	// Apply applies an update by the (epoch, seq) rule.
	Apply(u *llmgwv1.EphemeralUpdate) ephemeral.Verdict
	// Held returns the (epoch, seq) held for a node.
	Held(node string) (epoch, seq uint64, ok bool)
	// FullCopy returns everything held for a node as a full update.
	FullCopy(node string) (*llmgwv1.EphemeralUpdate, bool)
}

// Transport reaches the other control nodes; the server implements it over
// memberlist.
type Transport interface {
	// Peers returns the ids of the other control nodes gossip sees alive.
	Peers() []string
	// Send delivers msg to peer reliably, or fails. It may block (a dial
	// and a write, bounded by the transport's timeout); the plane calls it
	// from one goroutine per peer.
	Send(peer string, msg []byte) error
}

// Config tunes the plane; zero values take the documented defaults.
type Config struct {
	// Self is this control node's id; required.
	Self string
	// Tick is how often queued updates are sent (default 50 ms).
	Tick time.Duration
	// Keepalive is the longest a peer goes without a batch, so its view of
	// this node's sessions stays fresh (default 1 s).
	Keepalive time.Duration
	// ReorderTicks is how many ticks a gap may wait to be closed by a late
	// delta, or a digest's seq to arrive, before a full copy is asked for
	// (default 3).
	ReorderTicks int
	// ReorderBuffer bounds the early deltas kept per agent (default 256).
	ReorderBuffer int
	// MaxQueue bounds the updates queued for one peer; past it the queue
	// is dropped and the peer gets full copies instead (default 4096).
	MaxQueue int
	// ChunkBytes bounds the messages sent to a peer that assembles chunks
	// (it says so in its own messages): an update larger than it goes as
	// chunks, and a batch as several messages (design §5.4 "Chunks"). 0
	// sends whole updates in one message, as servers before chunks did.
	ChunkBytes int
	// Now is the clock of liveness judgements (when a remote session ended);
	// default time.Now. The leader's tests replace it.
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	if c.Tick <= 0 {
		c.Tick = 50 * time.Millisecond
	}
	if c.Keepalive <= 0 {
		c.Keepalive = time.Second
	}
	if c.ReorderTicks <= 0 {
		c.ReorderTicks = 3
	}
	if c.ReorderBuffer <= 0 {
		c.ReorderBuffer = 256
	}
	if c.MaxQueue <= 0 {
		c.MaxQueue = 4096
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Plane is one control node's end of the ephemeral plane. Create it with
// New, feed it with SessionStarted/SessionEnded/Forward (from the agent
// sessions this node owns) and Receive/MergeRemoteState (from memberlist),
// and run it with Run. Every method is safe for concurrent use.
type Plane struct {
	cfg   Config
	log   *slog.Logger
	store Store
	tr    Transport
	m     *Metrics

	mu sync.Mutex
	// counter numbers this node's messages (see message.Counter); it
	// starts at the start time so a restarted node's count is higher.
	counter uint64
	tick    int
	own     map[string]map[uint64]int // node -> epoch -> open sessions here
	// claims are the live sessions other nodes announce: node -> owner ->
	// epoch; lastCounter orders each owner's announcements.
	claims      map[string]map[string]uint64
	lastCounter map[string]uint64
	// endedAt is when a node last lost its last remote claim.
	endedAt map[string]time.Time
	peers   map[string]*peerQ
	reorder map[string]*pending // by agent node
	expect  map[string]*expectation
	asked   map[string]int // node -> tick of the last full-copy request
	// peerChunk is each peer's chunk budget as its last message said (0:
	// it assembles no chunks); chunks holds each peer's chunks until
	// their update is whole.
	peerChunk map[string]int
	chunks    map[string]*chunking.Assembler
	wg        sync.WaitGroup
}

// pending holds one agent's deltas that arrived before the one they follow.
type pending struct {
	from    string
	since   int // tick of the first
	updates map[chunking.Position]forwarded
}

// expectation is a digest's claim that an owner holds an agent's data up
// to (epoch, seq); if this node is still behind it a few ticks later, a
// full copy is asked for.
type expectation struct {
	from  string
	at    chunking.Position
	since int
}

// peerQ is what waits to be sent to one peer.
type peerQ struct {
	updates   []forwarded
	fullAll   bool
	fullNodes map[string]bool
	requests  []request
	lastSent  time.Time
	// added is when the peer was seen alive: full copies to it wait for
	// its first message (which says whether it takes chunks), up to
	// twice the keepalive.
	added time.Time
	wake  chan struct{}
	stop  chan struct{}
}

// New returns a plane; nothing runs until Run.
func New(cfg Config, store Store, tr Transport, m *Metrics, log *slog.Logger) *Plane {
	cfg = cfg.withDefaults()
	return &Plane{
		cfg: cfg, log: log, store: store, tr: tr, m: m,
		counter:     uint64(time.Now().UnixNano()),
		own:         map[string]map[uint64]int{},
		claims:      map[string]map[string]uint64{},
		lastCounter: map[string]uint64{},
		endedAt:     map[string]time.Time{},
		peers:       map[string]*peerQ{},
		reorder:     map[string]*pending{},
		expect:      map[string]*expectation{},
		asked:       map[string]int{},
		peerChunk:   map[string]int{},
		chunks:      map[string]*chunking.Assembler{},
	}
}

// Run sends and repairs until ctx is done, then stops every per-peer
// sender and waits for them. It returns only after all have stopped.
func (p *Plane) Run(ctx context.Context) {
	t := time.NewTicker(p.cfg.Tick)
	defer t.Stop()
	defer func() {
		p.mu.Lock()
		for id, q := range p.peers {
			close(q.stop)
			delete(p.peers, id)
		}
		p.mu.Unlock()
		p.wg.Wait()
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.onTick()
		}
	}
}

// SessionStarted records an agent session this node owns.
func (p *Plane) SessionStarted(node string, epoch uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.own[node] == nil {
		p.own[node] = map[uint64]int{}
	}
	p.own[node][epoch]++
	p.wakeAllLocked()
}

// SessionEnded records the end of an owned session; peers learn it from
// the next batch's session list.
func (p *Plane) SessionEnded(node string, epoch uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.own[node][epoch]--; p.own[node][epoch] <= 0 {
		delete(p.own[node], epoch)
	}
	if len(p.own[node]) == 0 {
		delete(p.own, node)
	}
	p.wakeAllLocked()
}

// Forward queues an update this node accepted from an agent it owns, for
// every peer, with the time it was received.
func (p *Plane) Forward(u *llmgwv1.EphemeralUpdate, received time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := forwarded{RecvUnixNano: received.UnixNano(), Update: u}
	for _, q := range p.peers {
		if q.fullAll {
			continue // the next send is a full copy anyway
		}
		if len(q.updates) >= p.cfg.MaxQueue {
			p.m.drops.WithLabelValues("queue_overflow").Add(float64(len(q.updates)))
			q.updates, q.fullAll = nil, true
			continue
		}
		q.updates = append(q.updates, f)
	}
}

// Live reports whether another control node announces a live session for
// node and, when none does, when the last one ended as seen here (zero if
// never seen).
func (p *Plane) Live(node string) (live bool, endedAt time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.claims[node]) > 0 {
		return true, time.Time{}
	}
	return false, p.endedAt[node]
}

// LiveNodes returns the nodes other control nodes hold live sessions for.
func (p *Plane) LiveNodes() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, 0, len(p.claims))
	for n := range p.claims {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Receive handles a plane message from memberlist (a reliable user
// message). It never blocks on the network: what it must send is queued.
func (p *Plane) Receive(b []byte) {
	m, err := decode(b)
	if err != nil || m.Kind != kindBatch {
		p.m.drops.WithLabelValues("undecodable").Inc()
		p.log.Warn("ephemeral plane: message dropped", "err", err)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if m.From == p.cfg.Self {
		return
	}
	p.setClaimsLocked(m.From, m.Counter, m.Sessions)
	p.peerChunk[m.From] = int(min(m.ChunkBytes, 1<<30))
	for _, f := range m.Updates {
		if chunking.IsChunk(f.Update) {
			a := p.chunks[m.From]
			if a == nil {
				// A peer is a certified server: its chunks are not bounded
				// beyond their count (chunking.MaxChunks).
				a = chunking.NewAssembler(0)
				p.chunks[m.From] = a
			}
			whole, err := a.Add(f.Update)
			if err != nil {
				p.m.drops.WithLabelValues("undecodable").Inc()
				p.log.Warn("ephemeral plane: chunk dropped", "peer", m.From, "agent_node", f.Update.GetNode(), "err", err)
				continue
			}
			if whole == nil {
				continue
			}
			f.Update = whole
		}
		p.applyLocked(m.From, f)
	}
	for _, r := range m.Requests {
		p.m.fullCopyRequests.WithLabelValues("received").Inc()
		if q := p.peers[m.From]; q != nil {
			if q.fullNodes == nil {
				q.fullNodes = map[string]bool{}
			}
			q.fullNodes[r.Node] = true
			wake(q)
		}
	}
}

// LocalState is this node's digest for memberlist's push/pull: the live
// sessions it owns, with the last seq it holds of each.
func (p *Plane) LocalState() []byte {
	p.mu.Lock()
	m := &message{Kind: kindDigest, From: p.cfg.Self, Counter: p.nextCounterLocked(), Sessions: p.ownSessionsLocked(), ChunkBytes: uint64(max(p.cfg.ChunkBytes, 0))}
	p.mu.Unlock()
	b, err := encode(m)
	if err != nil {
		return nil
	}
	return b
}

// MergeRemoteState reads another node's digest: its session list replaces
// what was known of it, and where this node is behind an expectation is
// set (see expectation).
func (p *Plane) MergeRemoteState(b []byte) {
	m, err := decode(b)
	if err != nil || m.Kind != kindDigest {
		p.m.drops.WithLabelValues("undecodable").Inc()
		p.log.Warn("ephemeral plane: digest dropped", "err", err)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if m.From == p.cfg.Self {
		return
	}
	p.setClaimsLocked(m.From, m.Counter, m.Sessions)
	p.peerChunk[m.From] = int(min(m.ChunkBytes, 1<<30))
	for _, s := range m.Sessions {
		at := chunking.Position{Epoch: s.Epoch, Seq: s.Seq}
		if !p.behindLocked(s.Node, at) {
			continue
		}
		if e := p.expect[s.Node]; e == nil || at.Compare(e.at) > 0 {
			p.expect[s.Node] = &expectation{from: m.From, at: at, since: p.tick}
		}
	}
}

// behindLocked reports whether this node holds less of node than at: an
// older epoch, or the same epoch and a lower seq (chunking.Position).
func (p *Plane) behindLocked(node string, at chunking.Position) bool {
	held, ok := p.heldLocked(node)
	return !ok || at.Compare(held) > 0
}

// heldLocked is the position the store holds for node.
func (p *Plane) heldLocked(node string) (chunking.Position, bool) {
	e, s, ok := p.store.Held(node)
	return chunking.Position{Epoch: e, Seq: s}, ok
}

func (p *Plane) nextCounterLocked() uint64 {
	p.counter++
	return p.counter
}

// ownSessionsLocked lists the sessions this node owns: per agent node the
// newest epoch, with the seq held for it.
func (p *Plane) ownSessionsLocked() []session {
	out := make([]session, 0, len(p.own))
	for node, epochs := range p.own {
		var e uint64
		for ep := range epochs {
			e = max(e, ep)
		}
		s := session{Node: node, Epoch: e}
		if he, hs, ok := p.store.Held(node); ok && he == e {
			s.Seq = hs
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b session) int {
		if a.Node < b.Node {
			return -1
		}
		if a.Node > b.Node {
			return 1
		}
		return 0
	})
	return out
}

// setClaimsLocked replaces what owner announced, unless an announcement
// numbered later was applied already.
func (p *Plane) setClaimsLocked(owner string, counter uint64, sessions []session) {
	if counter < p.lastCounter[owner] {
		return
	}
	p.lastCounter[owner] = counter
	now := p.cfg.Now()
	announced := map[string]uint64{}
	for _, s := range sessions {
		announced[s.Node] = s.Epoch
	}
	for node, owners := range p.claims {
		if _, ok := owners[owner]; ok {
			if _, still := announced[node]; !still {
				p.dropClaimLocked(node, owner, now)
			}
		}
	}
	for node, epoch := range announced {
		if p.claims[node] == nil {
			p.claims[node] = map[string]uint64{}
		}
		p.claims[node][owner] = epoch
	}
}

func (p *Plane) dropClaimLocked(node, owner string, now time.Time) {
	delete(p.claims[node], owner)
	if len(p.claims[node]) == 0 {
		delete(p.claims, node)
		p.endedAt[node] = now
	}
}

// ownerLocked is the control node that owns node's newest session, or ""
// when none is known.
func (p *Plane) ownerLocked(node string) string {
	var best string
	var epoch uint64
	for owner, e := range p.claims[node] {
		if e > epoch || (e == epoch && owner < best) {
			best, epoch = owner, e
		}
	}
	return best
}

func (p *Plane) applyLocked(from string, f forwarded) {
	u := f.Update
	v := p.store.Apply(u)
	p.m.peerUpdates.WithLabelValues(v.String()).Inc()
	switch v {
	case ephemeral.Accepted:
		p.observeLag(f)
		p.drainLocked(u.Node)
	case ephemeral.Gap:
		pend := p.reorder[u.Node]
		if pend == nil {
			pend = &pending{from: from, since: p.tick, updates: map[chunking.Position]forwarded{}}
			p.reorder[u.Node] = pend
		}
		if len(pend.updates) >= p.cfg.ReorderBuffer {
			p.m.drops.WithLabelValues("reorder_overflow").Add(float64(len(pend.updates)))
			delete(p.reorder, u.Node)
			p.m.gaps.WithLabelValues("sequence").Inc()
			p.requestLocked(from, u.Node, "reorder buffer full")
			return
		}
		pend.updates[chunking.PositionOf(u)] = f
	}
}

func (p *Plane) observeLag(f forwarded) {
	if f.RecvUnixNano > 0 {
		p.m.lag.Observe(max(time.Since(time.Unix(0, f.RecvUnixNano)).Seconds(), 0))
	}
}

// drainLocked applies buffered deltas that now follow what is held.
func (p *Plane) drainLocked(node string) {
	pend := p.reorder[node]
	if pend == nil {
		return
	}
	for {
		held, _ := p.heldLocked(node)
		next := held.Next()
		f, ok := pend.updates[next]
		if !ok {
			break
		}
		delete(pend.updates, next)
		if p.store.Apply(f.Update) != ephemeral.Accepted {
			break
		}
		p.m.peerUpdates.WithLabelValues("accepted_late").Inc()
		p.observeLag(f)
	}
	held, _ := p.heldLocked(node)
	for at := range pend.updates {
		if at.Compare(held) <= 0 {
			delete(pend.updates, at) // covered by what is held now
		}
	}
	if len(pend.updates) == 0 {
		delete(p.reorder, node)
	}
}

// requestLocked asks for a full copy of node: from its owner if known, else
// from the node that sent what revealed the gap. One request per node per
// ReorderTicks.
func (p *Plane) requestLocked(from, node, reason string) {
	if last, ok := p.asked[node]; ok && p.tick-last < p.cfg.ReorderTicks {
		return
	}
	to := p.ownerLocked(node)
	if to == "" || to == p.cfg.Self || p.peers[to] == nil {
		to = from
	}
	q := p.peers[to]
	if q == nil {
		return
	}
	p.asked[node] = p.tick
	q.requests = append(q.requests, request{Node: node, Reason: reason})
	p.m.fullCopyRequests.WithLabelValues("sent").Inc()
	p.log.Debug("ephemeral plane: full copy asked for", "agent_node", node, "peer", to, "reason", reason)
	wake(q)
}

func wake(q *peerQ) {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (p *Plane) wakeAllLocked() {
	for _, q := range p.peers {
		wake(q)
	}
}

// onTick follows membership, gives up on gaps and expectations that have
// waited long enough, and wakes the senders that have something to send.
func (p *Plane) onTick() {
	alive := p.tr.Peers()
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tick++
	isAlive := map[string]bool{}
	for _, id := range alive {
		if id == p.cfg.Self {
			continue
		}
		isAlive[id] = true
		if p.peers[id] == nil {
			// A new (or returning) peer starts from full copies.
			q := &peerQ{fullAll: true, added: now, wake: make(chan struct{}, 1), stop: make(chan struct{})}
			p.peers[id] = q
			p.wg.Go(func() { p.sender(id, q) })
		}
	}
	for id, q := range p.peers {
		if !isAlive[id] {
			close(q.stop)
			delete(p.peers, id)
			delete(p.chunks, id)    // its half-sent updates will not be finished
			delete(p.peerChunk, id) // a returning peer says again what it takes
		}
	}
	// A peer gossip no longer sees alive holds no live session: its agents
	// are moving elsewhere (or the peer is cut off and will close them).
	judged := p.cfg.Now()
	for node, owners := range p.claims {
		for owner := range owners {
			if !isAlive[owner] {
				p.dropClaimLocked(node, owner, judged)
			}
		}
	}
	for node, pend := range p.reorder {
		if p.tick-pend.since >= p.waitTicksLocked(node) {
			delete(p.reorder, node)
			p.m.gaps.WithLabelValues("sequence").Inc()
			p.requestLocked(pend.from, node, "sequence gap")
		}
	}
	for node, e := range p.expect {
		switch {
		case !p.behindLocked(node, e.at):
			delete(p.expect, node)
		case p.tick-e.since >= p.waitTicksLocked(node):
			delete(p.expect, node)
			p.m.gaps.WithLabelValues("digest").Inc()
			p.requestLocked(e.from, node, "behind the owner's digest")
		}
	}
	for _, q := range p.peers {
		if len(q.updates) > 0 || q.fullAll || len(q.fullNodes) > 0 || len(q.requests) > 0 || now.Sub(q.lastSent) >= p.cfg.Keepalive {
			wake(q)
		}
	}
}

// waitTicksLocked is how long a gap or an expectation for node waits
// before a full copy is asked for: ReorderTicks, or twenty times that
// while chunks of an update of node are held — a full copy most likely,
// which closes the gap when whole; asking for another would only send it
// twice. The longer wait still ends: a chunk that never comes must not
// keep the node behind for good.
func (p *Plane) waitTicksLocked(node string) int {
	for _, a := range p.chunks {
		if a.Assembling(node) {
			return 20 * p.cfg.ReorderTicks
		}
	}
	return p.cfg.ReorderTicks
}

// sender sends one peer's batches, one at a time, until stopped.
func (p *Plane) sender(peer string, q *peerQ) {
	for {
		select {
		case <-q.stop:
			return
		case <-q.wake:
		}
		p.flush(peer, q)
	}
}

func (p *Plane) flush(peer string, q *peerQ) {
	p.mu.Lock()
	updates, fullAll, fullNodes, requests := q.updates, q.fullAll, q.fullNodes, q.requests
	q.updates, q.fullAll, q.fullNodes, q.requests = nil, false, nil, nil
	if _, heard := p.peerChunk[peer]; !heard && p.cfg.ChunkBytes > 0 && time.Since(q.added) < 2*p.cfg.Keepalive {
		// Not yet known whether the peer takes chunks: the full copies
		// wait (a whole one may be larger than a send can carry in its
		// timeout); this batch carries the session list alone.
		q.fullAll, q.fullNodes = fullAll, fullNodes
		updates, fullAll, fullNodes = nil, false, nil
	}
	sessions := p.ownSessionsLocked()
	m := &message{Kind: kindBatch, From: p.cfg.Self, Sessions: sessions, Requests: requests, ChunkBytes: uint64(max(p.cfg.ChunkBytes, 0))}
	chunk := 0
	if p.cfg.ChunkBytes > 0 && p.peerChunk[peer] > 0 {
		chunk = min(p.cfg.ChunkBytes, p.peerChunk[peer])
	}
	p.mu.Unlock()

	now := time.Now()
	if fullAll {
		// Every owned agent's data as held now includes every delta that
		// was queued, so the copies replace them.
		updates = nil
		for _, s := range sessions {
			if c, ok := p.store.FullCopy(s.Node); ok && c.Epoch == s.Epoch {
				updates = append(updates, forwarded{RecvUnixNano: now.UnixNano(), Update: c})
			}
		}
	}
	for node := range fullNodes {
		if c, ok := p.store.FullCopy(node); ok {
			updates = append(updates, forwarded{RecvUnixNano: now.UnixNano(), Update: c})
		}
	}
	var err error
	for _, msg := range batches(m, updates, chunk) {
		p.mu.Lock()
		msg.Counter = p.nextCounterLocked()
		p.mu.Unlock()
		var b []byte
		if b, err = encode(msg); err == nil {
			err = p.tr.Send(peer, b)
		}
		if err != nil {
			break
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.m.drops.WithLabelValues("send_failed").Add(float64(len(updates)))
		p.log.Debug("ephemeral plane: send failed; the peer gets full copies next", "peer", peer, "updates", len(updates), "err", err)
		if len(updates) > 0 || fullAll {
			q.fullAll, q.updates = true, nil
		}
		q.requests = append(requests, q.requests...)
		for node := range fullNodes {
			if q.fullNodes == nil {
				q.fullNodes = map[string]bool{}
			}
			q.fullNodes[node] = true
		}
		return
	}
	q.lastSent = now
	p.m.forwarded.Add(float64(len(updates)))
}

// batches packs updates into messages like m: one when chunk is 0 (the
// peer assembles no chunks), else as many as keep each within about chunk
// bytes, an update larger than that split into chunks (design §5.4
// "Chunks"). Every message carries m's session list; the first its
// requests. The messages go over separate connections and may arrive in
// any order: the receiver's assembler takes chunks in any order, and its
// reorder buffer deltas.
func batches(m *message, updates []forwarded, chunk int) []*message {
	if chunk <= 0 {
		m.Updates = updates
		return []*message{m}
	}
	base, _ := encode(m)
	room := max(chunk-len(base), chunking.MinChunkBytes)
	var out []*message
	cur, size := m, 0
	for _, f := range updates {
		for _, part := range chunking.Split(f.Update, room-16) {
			n := proto.Size(part) + 16 // the forwarded entry's framing and receive time
			if size > 0 && size+n > room {
				out = append(out, cur)
				cur = &message{Kind: m.Kind, From: m.From, Sessions: m.Sessions, ChunkBytes: m.ChunkBytes}
				size = 0
			}
			cur.Updates = append(cur.Updates, forwarded{RecvUnixNano: f.RecvUnixNano, Update: part})
			size += n
		}
	}
	return append(out, cur)
}
