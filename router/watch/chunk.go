package watch

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Chunks (design §5.4 "Chunks"): the server sends an ephemeral update larger
// than the chunk budget this client asked for (WatchRequest.max_chunk_bytes)
// as several messages, so a router joining a large cluster gets every node's
// full copy however big; before chunks, a 46 MB state made every new
// router's watch fail with ResourceExhausted. This is controlplane/
// ephemeral's Assembler, mirrored (router and control plane meet only in
// proto, design §3).

// maxChunks bounds the chunks of one update the assembler takes.
const maxChunks = 1 << 16

// errChunk is wrapped by every error an Assembler returns for a chunk that
// cannot belong to a valid update.
var errChunk = errors.New("malformed chunked update")

// assembler puts chunked updates back together, one in progress per node.
// The zero value is not usable: make one with newAssembler. Not safe for
// concurrent use.
type assembler struct {
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

// newAssembler returns an assembler holding at most maxBytes of chunks
// (marshaled size) over all nodes; 0 does not bound.
func newAssembler(maxBytes int) *assembler {
	return &assembler{maxBytes: maxBytes, partial: map[string]*partial{}}
}

// Pending reports how many updates are partly assembled.
func (a *assembler) Pending() int { return len(a.partial) }

// Add takes one message. A whole update (chunks 0 or 1) comes back as it
// is. A chunk is held; the chunk that completes its update returns the
// update assembled, with no chunk fields. Otherwise the result is nil. A
// chunk of a different (epoch, seq, full) than the one in progress for its
// node replaces it: the sender moved on (a newer copy, a new session), and
// the acceptance rule judges what arrives whole. An error means the chunk
// cannot be part of a valid update, or holding it would pass the bound;
// what was held for its node is dropped.
func (a *assembler) Add(u *llmgwv1.EphemeralUpdate) (*llmgwv1.EphemeralUpdate, error) {
	if u.GetChunks() <= 1 {
		if u.GetChunk() != 0 {
			return nil, fmt.Errorf("%w: chunk %d of %d", errChunk, u.GetChunk(), u.GetChunks())
		}
		return u, nil
	}
	node := u.GetNode()
	if u.Chunks > maxChunks || u.Chunk >= u.Chunks {
		a.drop(node)
		return nil, fmt.Errorf("%w: chunk %d of %d (at most %d)", errChunk, u.Chunk, u.Chunks, maxChunks)
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
		return nil, fmt.Errorf("%w: node %s's chunks would hold %d bytes, above the %d allowed", errChunk, node, a.held+n, a.maxBytes)
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

func (a *assembler) drop(node string) {
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
				return nil, fmt.Errorf("%w: chunk %d entry %d of replica %.64q continues nothing", errChunk, i, j, b.GetReplicaId())
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
		}
		prevEnd = len(c.Kv) > 0
	}
	return out, nil
}
