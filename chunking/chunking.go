// Package chunking splits ephemeral updates into chunks and assembles them
// again (design §5.4 "Chunks"): an update larger than a receiver's chunk
// budget travels as several messages, so no message grows with the fleet —
// a warm node's KV set is some 500 k hashes, 4 MB, and one message per full
// copy once ended sessions at gRPC's receive limit and made memberlist
// sends outlast their timeout.
//
// It also holds the order every hop judges updates by (Position: the
// (epoch, seq) rule of design §5.4 "Epochs"), since a chunked update is
// judged only once whole, at the position its chunks share.
//
// Why a package of its own, outside the components: the framing and the
// order are part of the wire contract, spoken by the agent (splitting), the
// control plane (both, and judging) and the router (assembling and
// judging), which meet only in proto (design §3). It imports only proto, so
// each may import it; the alternative was three copies kept in step by
// hand.
package chunking

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// MinChunkBytes is the smallest chunk budget Split honours: room for the
// fixed fields and some hashes in every chunk.
const MinChunkBytes = 4 << 10

// MaxChunks bounds the chunks of one update an assembler takes: 65536
// chunks of the smallest budget hold 256 MiB.
const MaxChunks = 1 << 16

// fieldOverhead is the most a length-delimited field adds to its value's
// size: a tag and a length varint of a value under 4 GiB.
const fieldOverhead = 1 + 5

// Split returns u as chunks of at most maxBytes each (marshaled), or u
// itself when it fits (or maxBytes is 0). The chunks share u's node, epoch,
// seq and full; a replica's block set too big for one chunk goes on in the
// next as a continued entry. u is not modified.
func Split(u *llmgwv1.EphemeralUpdate, maxBytes int) []*llmgwv1.EphemeralUpdate {
	if maxBytes <= 0 || proto.Size(u) <= maxBytes {
		return []*llmgwv1.EphemeralUpdate{u}
	}
	maxBytes = max(maxBytes, MinChunkBytes)
	var out []*llmgwv1.EphemeralUpdate
	var cur *llmgwv1.EphemeralUpdate
	var size int
	head := func() *llmgwv1.EphemeralUpdate {
		return &llmgwv1.EphemeralUpdate{Node: u.Node, Epoch: u.Epoch, Seq: u.Seq, Full: u.Full}
	}
	// The fixed fields, and chunk and chunks once set.
	headSize := proto.Size(head()) + 2*(1+5)
	next := func() {
		cur, size = head(), headSize
		out = append(out, cur)
	}
	// room starts a new chunk when n more bytes do not fit in this one and
	// it holds something already (one item larger than the budget goes
	// alone).
	room := func(n int) {
		if size+n > maxBytes && size > headSize {
			next()
		}
	}
	next()
	for _, st := range u.Statuses {
		n := proto.Size(st) + fieldOverhead
		room(n)
		cur.Statuses = append(cur.Statuses, st)
		size += n
	}
	for _, a := range u.Adapters {
		n := proto.Size(a) + fieldOverhead
		room(n)
		cur.Adapters = append(cur.Adapters, a)
		size += n
	}
	for _, id := range u.RemovedReplicas {
		n := len(id) + fieldOverhead
		room(n)
		cur.RemovedReplicas = append(cur.RemovedReplicas, id)
		size += n
	}
	for _, b := range u.Kv {
		entry := func(continued bool) *llmgwv1.KVBlocks {
			e := &llmgwv1.KVBlocks{ReplicaId: b.ReplicaId, Uid: b.Uid, Incarnation: b.Incarnation, Reset_: b.Reset_,
				Untrusted: b.Untrusted, BlockSize: b.BlockSize, Continued: continued,
				OldestEventUnixNano: b.OldestEventUnixNano, NewestEventUnixNano: b.NewestEventUnixNano}
			return e
		}
		// An entry's fixed fields, its own framing and its six packed
		// lists' (the GPU tier's two and the offload tiers' four).
		fixed := proto.Size(entry(true)) + fieldOverhead + 6*fieldOverhead
		room(fixed + 8)
		e := entry(false)
		cur.Kv = append(cur.Kv, e)
		size += fixed
		for _, list := range []struct {
			from []uint64
			to   func(*llmgwv1.KVBlocks) *[]uint64
		}{
			{b.Stored, func(e *llmgwv1.KVBlocks) *[]uint64 { return &e.Stored }},
			{b.Removed, func(e *llmgwv1.KVBlocks) *[]uint64 { return &e.Removed }},
			{b.StoredCpu, func(e *llmgwv1.KVBlocks) *[]uint64 { return &e.StoredCpu }},
			{b.RemovedCpu, func(e *llmgwv1.KVBlocks) *[]uint64 { return &e.RemovedCpu }},
			{b.StoredStorage, func(e *llmgwv1.KVBlocks) *[]uint64 { return &e.StoredStorage }},
			{b.RemovedStorage, func(e *llmgwv1.KVBlocks) *[]uint64 { return &e.RemovedStorage }},
		} {
			rest := list.from
			for len(rest) > 0 {
				fit := (maxBytes - size) / 8
				if fit <= 0 && size > headSize+fixed {
					next()
					e = entry(true)
					cur.Kv = append(cur.Kv, e)
					size += fixed
					continue
				}
				// At least one a chunk, even when the fixed fields alone
				// fill the budget (ids longer than it): always progress.
				fit = min(max(fit, 1), len(rest))
				*list.to(e) = append(*list.to(e), rest[:fit]...)
				size += 8 * fit
				rest = rest[fit:]
			}
		}
	}
	if len(out) == 1 {
		return []*llmgwv1.EphemeralUpdate{u}
	}
	for i, c := range out {
		c.Chunk, c.Chunks = uint32(i), uint32(len(out))
	}
	return out
}

// IsChunk reports whether u is one chunk of a larger update, to be held
// aside until its update is whole (Assembler), rather than an update to
// judge and apply at once. A message that merely claims to be a chunk (a
// chunk number with no count) counts: the assembler refuses it, so it is
// never taken for a whole update.
func IsChunk(u *llmgwv1.EphemeralUpdate) bool {
	return u.GetChunks() > 1 || u.GetChunk() != 0
}

// ErrChunk is wrapped by every error an Assembler returns for a chunk that
// cannot belong to a valid update.
var ErrChunk = errors.New("malformed chunked update")

// Assembler puts chunked updates back together, one in progress per node.
// The zero value is not usable: make one with NewAssembler. Not safe for
// concurrent use.
type Assembler struct {
	maxBytes int
	held     int
	partial  map[string]*partial
}

type partial struct {
	epoch, seq uint64
	full       bool
	chunks     []*llmgwv1.EphemeralUpdate
	have       int
	bytes      int
}

// NewAssembler returns an assembler holding at most maxBytes of chunks
// (marshaled size) over all nodes; 0 does not bound.
func NewAssembler(maxBytes int) *Assembler {
	return &Assembler{maxBytes: maxBytes, partial: map[string]*partial{}}
}

// SetMax changes the bound on the bytes held; chunks held already count
// against the new one from the next Add.
func (a *Assembler) SetMax(maxBytes int) { a.maxBytes = maxBytes }

// Assembling reports whether chunks of an update of node are held.
func (a *Assembler) Assembling(node string) bool {
	_, ok := a.partial[node]
	return ok
}

// Pending reports how many updates are partly assembled.
func (a *Assembler) Pending() int { return len(a.partial) }

// Add takes one message. A whole update (chunks 0 or 1) comes back as it
// is. A chunk is held; the chunk that completes its update returns the
// update assembled, with no chunk fields. Otherwise the result is nil. A
// chunk of a different (epoch, seq, full) than the one in progress for its
// node replaces it: the sender moved on (a newer copy, a new session), and
// the acceptance rule judges what arrives whole. An error means the chunk
// cannot be part of a valid update, or holding it would pass the bound;
// what was held for its node is dropped.
func (a *Assembler) Add(u *llmgwv1.EphemeralUpdate) (*llmgwv1.EphemeralUpdate, error) {
	if !IsChunk(u) {
		return u, nil
	}
	if u.GetChunks() <= 1 {
		return nil, fmt.Errorf("%w: chunk %d of %d", ErrChunk, u.GetChunk(), u.GetChunks())
	}
	node := u.GetNode()
	if u.Chunks > MaxChunks || u.Chunk >= u.Chunks {
		a.drop(node)
		return nil, fmt.Errorf("%w: chunk %d of %d (at most %d)", ErrChunk, u.Chunk, u.Chunks, MaxChunks)
	}
	p := a.partial[node]
	if p != nil && (p.epoch != u.Epoch || p.seq != u.Seq || p.full != u.Full || len(p.chunks) != int(u.Chunks)) {
		a.drop(node)
		p = nil
	}
	if p == nil {
		p = &partial{epoch: u.Epoch, seq: u.Seq, full: u.Full, chunks: make([]*llmgwv1.EphemeralUpdate, u.Chunks)}
		a.partial[node] = p
	}
	if p.chunks[u.Chunk] != nil {
		return nil, nil // a duplicate
	}
	n := proto.Size(u)
	if a.maxBytes > 0 && a.held+n > a.maxBytes {
		a.drop(node)
		return nil, fmt.Errorf("%w: node %s's chunks would hold %d bytes, above the %d allowed", ErrChunk, node, a.held+n, a.maxBytes)
	}
	p.chunks[u.Chunk] = u
	p.have++
	p.bytes += n
	a.held += n
	if p.have < len(p.chunks) {
		return nil, nil
	}
	a.drop(node)
	return join(p.chunks)
}

func (a *Assembler) drop(node string) {
	if p, ok := a.partial[node]; ok {
		a.held -= p.bytes
		delete(a.partial, node)
	}
}

// join concatenates chunks into the update they were split from. A
// continued entry must open its chunk and carry on the entry the previous
// chunk ended with.
func join(chunks []*llmgwv1.EphemeralUpdate) (*llmgwv1.EphemeralUpdate, error) {
	first := chunks[0]
	out := &llmgwv1.EphemeralUpdate{Node: first.Node, Epoch: first.Epoch, Seq: first.Seq, Full: first.Full}
	// The entries of out that are copies made here, so appending to them
	// never writes into a received message's slices.
	own := map[*llmgwv1.KVBlocks]bool{}
	prevEnd := false // the previous chunk ended with an entry
	for i, c := range chunks {
		out.Statuses = append(out.Statuses, c.Statuses...)
		out.Adapters = append(out.Adapters, c.Adapters...)
		out.RemovedReplicas = append(out.RemovedReplicas, c.RemovedReplicas...)
		for j, b := range c.Kv {
			if !b.GetContinued() {
				out.Kv = append(out.Kv, b)
				continue
			}
			last := out.Kv[max(len(out.Kv)-1, 0):]
			if j != 0 || i == 0 || !prevEnd || len(last) == 0 || last[0].ReplicaId != b.ReplicaId || last[0].Uid != b.Uid || last[0].Incarnation != b.Incarnation {
				return nil, fmt.Errorf("%w: chunk %d entry %d of replica %.64q continues nothing", ErrChunk, i, j, b.GetReplicaId())
			}
			m := last[0]
			if !own[m] {
				m = proto.Clone(m).(*llmgwv1.KVBlocks)
				m.Continued = false
				own[m] = true
				out.Kv[len(out.Kv)-1] = m
			}
			m.Stored = append(m.Stored, b.Stored...)
			m.Removed = append(m.Removed, b.Removed...)
			m.StoredCpu = append(m.StoredCpu, b.StoredCpu...)
			m.RemovedCpu = append(m.RemovedCpu, b.RemovedCpu...)
			m.StoredStorage = append(m.StoredStorage, b.StoredStorage...)
			m.RemovedStorage = append(m.RemovedStorage, b.RemovedStorage...)
		}
		prevEnd = len(c.Kv) > 0
	}
	return out, nil
}
