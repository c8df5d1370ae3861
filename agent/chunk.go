package agent

import (
	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Chunks (design §5.4 "Chunks"): an update larger than the control
// server's chunk budget (Welcome.max_chunk_bytes) goes as several
// messages, so a warm node's KV set — some 500 k hashes, 4 MB — no longer
// ends its session at the server's 4 MiB receive limit. This is
// controlplane/ephemeral's Split, mirrored (agent and control plane meet
// only in proto, design §3); the server assembles.

// minChunkBytes is the smallest chunk budget Split honours: room for the
// fixed fields and some hashes in every chunk.
const minChunkBytes = 4 << 10

// fieldOverhead is the most a length-delimited field adds to its value's
// size: a tag and a length varint of a value under 4 GiB.
const fieldOverhead = 1 + 5

// splitUpdate returns u as chunks of at most maxBytes each (marshaled), or u
// itself when it fits (or maxBytes is 0). The chunks share u's node, epoch,
// seq and full; a replica's block set too big for one chunk goes on in the
// next as a continued entry. u is not modified.
func splitUpdate(u *llmgwv1.EphemeralUpdate, maxBytes int) []*llmgwv1.EphemeralUpdate {
	if maxBytes <= 0 || proto.Size(u) <= maxBytes {
		return []*llmgwv1.EphemeralUpdate{u}
	}
	maxBytes = max(maxBytes, minChunkBytes)
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
				Untrusted: b.Untrusted, BlockSize: b.BlockSize, Continued: continued}
			return e
		}
		// An entry's fixed fields, its own framing and its two packed lists'.
		fixed := proto.Size(entry(true)) + fieldOverhead + 2*fieldOverhead
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
