// Package ephemeral holds the agents' high-churn data on a control node —
// replica status, KV-cache blocks and adapter status — outside
// Raft (design §5.4).
//
// Each agent's data is ordered by (node, epoch, seq), and every hop applies
// the same acceptance rule: a full copy newer than what is held replaces it;
// a delta of the same epoch whose seq is exactly the next is applied;
// anything else is dropped. So a newer agent session supersedes an older one
// everywhere, even when the old one comes back with late deltas.
package ephemeral

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/chunking"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Verdict is what Apply did with an update.
type Verdict int

const (
	// Accepted: the update was applied and sent to every subscriber.
	Accepted Verdict = iota
	// Stale: older than what is held (an old session, a duplicate); dropped
	// with nothing to ask for.
	Stale
	// Gap: something between what is held and this update is missing;
	// dropped, and the sender should be asked for a full copy.
	Gap
	// OverBudget: applying the update would hold more for its node than
	// the Budget allows; everything held for the node was dropped and
	// nothing was sent to subscribers (ApplyWithin).
	OverBudget
)

func (v Verdict) String() string {
	switch v {
	case Accepted:
		return "accepted"
	case Stale:
		return "stale"
	case Gap:
		return "gap"
	case OverBudget:
		return "over_budget"
	}
	return "unknown"
}

// ErrOverflow ends a subscription whose reader fell too far behind. The
// reader resumes with a new subscription (and so a full copy); the others
// never wait for it.
var ErrOverflow = errors.New("ephemeral subscriber fell behind")

type nodeData struct {
	epoch, seq uint64
	statuses   map[string]*llmgwv1.ReplicaStatus
	kv         map[string]*kvState // by replica id
	// adapters is the latest AdapterStatus per replica id and adapter name
	// (design §7.6): a status replaces the one held for its pair.
	adapters map[string]map[string]*llmgwv1.AdapterStatus
}

// kvState is the KV-cache block set the agent's mirror last reported for one
// replica (design §7.5), kept so a watcher that connects later gets it whole.
type kvState struct {
	uid, incarnation uint64
	blockSize        uint32
	untrusted        bool
	reason           string // why untrusted, in the agent's words
	blocks           map[uint64]struct{}
	// cpu and storage are the offload tiers' sets (KVBlocks.stored_cpu,
	// stored_storage); nil while the replica reported none.
	cpu, storage map[uint64]struct{}
}

// applyTier applies one offload tier's lists to its set, which a reset
// has emptied already.
func applyTier(set *map[uint64]struct{}, stored, removed []uint64) {
	if len(stored) > 0 && *set == nil {
		*set = make(map[uint64]struct{}, len(stored))
	}
	for _, h := range stored {
		(*set)[h] = struct{}{}
	}
	for _, h := range removed {
		delete(*set, h)
	}
}

// held is how many hashes the replica's tiers hold, together: what the
// node's budget counts.
func (k *kvState) held() int { return len(k.blocks) + len(k.cpu) + len(k.storage) }

// keys returns a set's hashes, unsorted (see copy), or nil.
func keys(set map[uint64]struct{}) []uint64 {
	if len(set) == 0 {
		return nil
	}
	out := make([]uint64, 0, len(set))
	for h := range set {
		out = append(out, h)
	}
	return out
}

func (k *kvState) apply(b *llmgwv1.KVBlocks, reset bool) {
	if reset || k.blocks == nil || k.uid != b.Uid || k.incarnation != b.Incarnation {
		// A reset, or another engine's blocks: what was held says nothing
		// about this one. Sized for the set, as a full copy's 250 k
		// hashes a replica would otherwise grow the map a dozen times.
		k.blocks = make(map[uint64]struct{}, len(b.Stored))
		k.cpu, k.storage = nil, nil // a reset resets every tier
	}
	k.uid, k.incarnation, k.untrusted, k.reason = b.Uid, b.Incarnation, b.Untrusted, b.UntrustedReason
	if b.BlockSize != 0 {
		k.blockSize = b.BlockSize
	}
	for _, h := range b.Stored {
		k.blocks[h] = struct{}{}
	}
	for _, h := range b.Removed {
		delete(k.blocks, h)
	}
	applyTier(&k.cpu, b.StoredCpu, b.RemovedCpu)
	applyTier(&k.storage, b.StoredStorage, b.RemovedStorage)
}

// copy returns the set as a reset, its hashes unsorted: the caller holds
// the store's lock, and sortCopy sorts them after it lets go (a warm
// replica's 250 k hashes take 20 ms to sort).
func (k *kvState) copy(replicaID string) *llmgwv1.KVBlocks {
	out := &llmgwv1.KVBlocks{ReplicaId: replicaID, Uid: k.uid, Incarnation: k.incarnation, Reset_: true,
		Untrusted: k.untrusted, UntrustedReason: k.reason, BlockSize: k.blockSize, Stored: make([]uint64, 0, len(k.blocks))}
	for h := range k.blocks {
		out.Stored = append(out.Stored, h)
	}
	out.StoredCpu, out.StoredStorage = keys(k.cpu), keys(k.storage)
	return out
}

// sortCopy puts a full copy's block hashes in order, so copies of the
// same data are the same message.
func sortCopy(u *llmgwv1.EphemeralUpdate) {
	for _, k := range u.Kv {
		slices.Sort(k.Stored)
		slices.Sort(k.StoredCpu)
		slices.Sort(k.StoredStorage)
	}
}

// Store is safe for concurrent use.
type Store struct {
	mu    sync.Mutex
	nodes map[string]*nodeData
	subs  map[*Subscription]struct{}
	// changed is closed (and replaced) at every accepted update, for
	// readers that only need to know that something changed.
	changed chan struct{}
}

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{nodes: map[string]*nodeData{}, subs: map[*Subscription]struct{}{}, changed: make(chan struct{})}
}

// Changed returns a channel closed at the next accepted update.
func (s *Store) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// Budget bounds what the store holds for one node (design §11 "Limits"): an
// agent session's reports must stay within what its node can run. A zero
// field does not bound.
type Budget struct {
	Statuses int // replica statuses
	Adapters int // adapter statuses, over all replicas
	KVBlocks int // KV block hashes, over all replicas and all their tiers
}

// Usage is what the store holds for one node, in Budget's terms.
type Usage Budget

// OverBudgetError says which bound an update broke.
type OverBudgetError struct {
	What       string // "statuses", "adapters" or "kv_blocks"
	Held, Max  int
	Node       string
	Epoch, Seq uint64
}

func (e *OverBudgetError) Error() string {
	return fmt.Sprintf("update %d of node %s (epoch %d) would hold %d %s, above the %d allowed", e.Seq, e.Node, e.Epoch, e.Held, e.What, e.Max)
}

func (d *nodeData) usage() Usage {
	u := Usage{Statuses: len(d.statuses)}
	for _, k := range d.kv {
		u.KVBlocks += k.held()
	}
	for _, byName := range d.adapters {
		u.Adapters += len(byName)
	}
	return u
}

// over returns the first bound of b that u breaks.
func (b Budget) over(u Usage) (what string, held, limit int, ok bool) {
	for _, c := range []struct {
		what      string
		held, max int
	}{{"statuses", u.Statuses, b.Statuses}, {"adapters", u.Adapters, b.Adapters}, {"kv_blocks", u.KVBlocks, b.KVBlocks}} {
		if c.max > 0 && c.held > c.max {
			return c.what, c.held, c.max, true
		}
	}
	return "", 0, 0, false
}

// Apply applies u by the acceptance rule and, when accepted, queues it
// unchanged (same node, epoch, seq) for every subscriber.
func (s *Store) Apply(u *llmgwv1.EphemeralUpdate) Verdict {
	v, _ := s.ApplyWithin(u, Budget{})
	return v
}

// ApplyWithin is Apply for an update from an agent session, bounded by b:
// when the update, once applied, leaves the node holding more than b
// allows, everything held for the node is dropped (so the memory returns),
// nothing reaches the subscribers, and the verdict is OverBudget with an
// *OverBudgetError. The caller ends the session (package agent).
func (s *Store) ApplyWithin(u *llmgwv1.EphemeralUpdate, b Budget) (Verdict, error) {
	if u.GetNode() == "" {
		return Stale, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	held, ok := s.nodes[u.Node]
	v := verdict(held, ok, u)
	if v != Accepted {
		return v, nil
	}
	if u.Full || !ok {
		held = &nodeData{statuses: map[string]*llmgwv1.ReplicaStatus{}, kv: map[string]*kvState{}, adapters: map[string]map[string]*llmgwv1.AdapterStatus{}}
		s.nodes[u.Node] = held
	}
	held.epoch, held.seq = u.Epoch, u.Seq
	for _, st := range u.Statuses {
		if st.GetReplicaId() != "" {
			held.statuses[st.ReplicaId] = proto.Clone(st).(*llmgwv1.ReplicaStatus)
		}
	}
	for _, b := range u.Kv {
		if b.GetReplicaId() == "" {
			continue
		}
		k, ok := held.kv[b.ReplicaId]
		if !ok {
			k = &kvState{}
			held.kv[b.ReplicaId] = k
		}
		// In a full copy every entry is a reset (proto: KVBlocks).
		k.apply(b, b.Reset_ || u.Full)
	}
	for _, a := range u.Adapters {
		if a.GetReplicaId() == "" || a.GetAdapter() == "" {
			continue
		}
		byName, ok := held.adapters[a.ReplicaId]
		if !ok {
			byName = map[string]*llmgwv1.AdapterStatus{}
			held.adapters[a.ReplicaId] = byName
		}
		if a.State == llmgwv1.AdapterState_ADAPTER_STATE_UNSPECIFIED {
			// The agent's word for "no longer on this replica" (unloaded):
			// forwarded as sent, held no more.
			delete(byName, a.Adapter)
			continue
		}
		byName[a.Adapter] = proto.Clone(a).(*llmgwv1.AdapterStatus)
	}
	for _, id := range u.RemovedReplicas {
		delete(held.statuses, id)
		delete(held.kv, id)
		delete(held.adapters, id)
	}
	if what, n, limit, over := b.over(held.usage()); over {
		delete(s.nodes, u.Node)
		return OverBudget, &OverBudgetError{What: what, Held: n, Max: limit, Node: u.Node, Epoch: u.Epoch, Seq: u.Seq}
	}
	if len(s.subs) > 0 {
		// One copy shared by every subscriber, who only read it: a warm
		// node's full copy is 16 MB, once per update rather than once per
		// watcher.
		c := proto.Clone(u).(*llmgwv1.EphemeralUpdate)
		for sub := range s.subs {
			sub.offer(c)
		}
	}
	close(s.changed)
	s.changed = make(chan struct{})
	return Accepted, nil
}

// Drop forgets what is held for node when it is of epoch (a session that
// was ended for breaking a limit): a later session's data is kept. It
// reports whether anything was dropped. Subscribers are not told: what
// they hold was within bounds, and the agent's next session replaces it.
func (s *Store) Drop(node string, epoch uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d, ok := s.nodes[node]; ok && d.epoch == epoch {
		delete(s.nodes, node)
		return true
	}
	return false
}

// verdict is the acceptance rule (design §5.4 "Epochs"), in the order of
// chunking.Position: a full copy later than what is held, or the delta at
// exactly the next position, is accepted; anything at or before what is
// held is stale; any other delta is a gap.
func verdict(held *nodeData, ok bool, u *llmgwv1.EphemeralUpdate) Verdict {
	if !ok {
		if u.Full {
			return Accepted
		}
		return Gap
	}
	pos, at := chunking.PositionOf(u), chunking.Position{Epoch: held.epoch, Seq: held.seq}
	switch {
	case u.Full:
		if pos.Compare(at) > 0 {
			return Accepted
		}
		return Stale
	case pos.Compare(at) <= 0:
		return Stale
	case pos == at.Next():
		return Accepted
	default:
		return Gap
	}
}

// Held returns the (epoch, seq) held for a node; ok is false when none is.
func (s *Store) Held(node string) (epoch, seq uint64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.nodes[node]
	if !ok {
		return 0, 0, false
	}
	return d.epoch, d.seq, true
}

// Status returns a copy of the latest status a node reported for a replica.
// Callers look a replica up on the node its placement names, so an agent
// that reports another node's replica changes nothing anyone reads
// (design §11: an agent reports only its own replicas).
func (s *Store) Status(node, replicaID string) (*llmgwv1.ReplicaStatus, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.nodes[node]
	if !ok {
		return nil, false
	}
	st, ok := d.statuses[replicaID]
	if !ok {
		return nil, false
	}
	return proto.Clone(st).(*llmgwv1.ReplicaStatus), true
}

// StatusOf returns the latest status of replica r from its own node, only if
// it is for the same placement (uid): an older placement's status says
// nothing about this one.
func (s *Store) StatusOf(r *llmgwv1.Replica) *llmgwv1.ReplicaStatus {
	st, ok := s.Status(r.GetNode(), r.GetId())
	if !ok || st.Uid != r.GetUid() {
		return nil
	}
	return st
}

// KVOf summarises the KV-cache blocks replica r's own node last reported
// for it (design §7.5): how many, and whether routers may trust them; nil
// for another placement (uid) or none reported (no KV events).
func (s *Store) KVOf(r *llmgwv1.Replica) *llmgwv1.ReplicaKV {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.nodes[r.GetNode()]
	if !ok {
		return nil
	}
	k, ok := d.kv[r.GetId()]
	if !ok || k.uid != r.GetUid() {
		return nil
	}
	return &llmgwv1.ReplicaKV{Blocks: uint64(len(k.blocks)), Untrusted: k.untrusted, UntrustedReason: k.reason, Incarnation: k.incarnation}
}

// AdaptersOf returns copies of the adapter statuses replica r's own node
// last reported for it, by adapter name, only for the same placement (uid),
// as StatusOf does.
func (s *Store) AdaptersOf(r *llmgwv1.Replica) map[string]*llmgwv1.AdapterStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.nodes[r.GetNode()]
	if !ok {
		return nil
	}
	out := map[string]*llmgwv1.AdapterStatus{}
	for name, a := range d.adapters[r.GetId()] {
		if a.Uid == r.GetUid() {
			out[name] = proto.Clone(a).(*llmgwv1.AdapterStatus)
		}
	}
	return out
}

func (s *Store) copiesLocked() []*llmgwv1.EphemeralUpdate {
	out := make([]*llmgwv1.EphemeralUpdate, 0, len(s.nodes))
	for node, d := range s.nodes {
		out = append(out, d.fullCopy(node))
	}
	slices.SortFunc(out, func(a, b *llmgwv1.EphemeralUpdate) int { return cmp.Compare(a.Node, b.Node) })
	return out
}

func (d *nodeData) fullCopy(node string) *llmgwv1.EphemeralUpdate {
	u := &llmgwv1.EphemeralUpdate{Node: node, Epoch: d.epoch, Seq: d.seq, Full: true}
	for _, st := range d.statuses {
		u.Statuses = append(u.Statuses, proto.Clone(st).(*llmgwv1.ReplicaStatus))
	}
	slices.SortFunc(u.Statuses, func(a, b *llmgwv1.ReplicaStatus) int { return cmp.Compare(a.ReplicaId, b.ReplicaId) })
	for id, k := range d.kv {
		u.Kv = append(u.Kv, k.copy(id))
	}
	slices.SortFunc(u.Kv, func(a, b *llmgwv1.KVBlocks) int { return cmp.Compare(a.ReplicaId, b.ReplicaId) })
	for _, byName := range d.adapters {
		for _, a := range byName {
			u.Adapters = append(u.Adapters, proto.Clone(a).(*llmgwv1.AdapterStatus))
		}
	}
	slices.SortFunc(u.Adapters, func(a, b *llmgwv1.AdapterStatus) int {
		return cmp.Or(cmp.Compare(a.ReplicaId, b.ReplicaId), cmp.Compare(a.Adapter, b.Adapter))
	})
	return u
}

// FullCopy returns everything held for one node as a full update at the
// held (epoch, seq): what another hop needs to catch up with it (design §5.4).
func (s *Store) FullCopy(node string) (*llmgwv1.EphemeralUpdate, bool) {
	s.mu.Lock()
	d, ok := s.nodes[node]
	if !ok {
		s.mu.Unlock()
		return nil, false
	}
	u := d.fullCopy(node)
	s.mu.Unlock()
	sortCopy(u)
	return u, true
}

// Subscribe returns a full copy of every node's data, as of one instant, and
// a subscription that receives every update accepted after that instant —
// so the copies and the deltas join without gap or overlap. buffer bounds
// the queue; a subscriber that lets it fill is ended with ErrOverflow.
func (s *Store) Subscribe(buffer int) (*Subscription, []*llmgwv1.EphemeralUpdate) {
	if buffer < 1 {
		buffer = 1
	}
	sub := &Subscription{store: s, c: make(chan *llmgwv1.EphemeralUpdate, buffer), done: make(chan struct{})}
	s.mu.Lock()
	s.subs[sub] = struct{}{}
	copies := s.copiesLocked()
	s.mu.Unlock()
	for _, u := range copies {
		sortCopy(u)
	}
	return sub, copies
}

// Subscription is one reader's bounded queue of accepted updates.
type Subscription struct {
	store    *Store
	c        chan *llmgwv1.EphemeralUpdate
	done     chan struct{} // closed on overflow
	overflow bool          // guarded by store.mu
}

// Updates delivers the accepted updates in order. Every subscriber gets
// the same message: read it, never modify it.
func (s *Subscription) Updates() <-chan *llmgwv1.EphemeralUpdate { return s.c }

// Overflowed is closed when the queue overflowed: the reader must stop and
// resubscribe, since it has missed updates.
func (s *Subscription) Overflowed() <-chan struct{} { return s.done }

// Close ends the subscription. It is safe to call more than once.
func (s *Subscription) Close() {
	s.store.mu.Lock()
	defer s.store.mu.Unlock()
	delete(s.store.subs, s)
}

// offer is called with store.mu held, so it never blocks.
func (s *Subscription) offer(u *llmgwv1.EphemeralUpdate) {
	if s.overflow {
		return
	}
	select {
	case s.c <- u:
	default:
		s.overflow = true
		close(s.done)
		delete(s.store.subs, s)
	}
}
