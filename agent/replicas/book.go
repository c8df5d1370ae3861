package replicas

import (
	"sort"
	"sync"

	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Book is the agent's ephemeral data: the latest status of every replica it
// runs. Sessions read it as a full copy and then as the changes since the
// copy, so a status change made while no session exists is not lost: the
// next session's full copy carries it.
//
// Changes made between two reads are coalesced: a delta carries each
// replica's latest status, and a replica stopped and forgotten in between
// appears only as removed. Every hop keeps only the latest status anyway.
//
// One session reads it at a time (Since prunes what that reader has seen);
// any number of supervisors write.
type Book struct {
	mu      sync.Mutex
	version uint64
	entries map[string]bookEntry
	removed map[string]uint64
	// notify holds a token when something changed since the last read.
	notify chan struct{}
}

type bookEntry struct {
	st  *llmgwv1.ReplicaStatus
	ver uint64
}

func newBook() *Book {
	return &Book{entries: map[string]bookEntry{}, removed: map[string]uint64{}, notify: make(chan struct{}, 1)}
}

func (b *Book) signal() {
	select {
	case b.notify <- struct{}{}:
	default:
	}
}

// put records a replica's status.
func (b *Book) put(st *llmgwv1.ReplicaStatus) {
	b.mu.Lock()
	b.version++
	b.entries[st.GetReplicaId()] = bookEntry{st: proto.Clone(st).(*llmgwv1.ReplicaStatus), ver: b.version}
	delete(b.removed, st.GetReplicaId())
	b.mu.Unlock()
	b.signal()
}

// remove forgets a replica the agent no longer runs.
func (b *Book) remove(id string) {
	b.mu.Lock()
	if _, ok := b.entries[id]; !ok {
		b.mu.Unlock()
		return
	}
	b.version++
	delete(b.entries, id)
	b.removed[id] = b.version
	b.mu.Unlock()
	b.signal()
}

// Snapshot returns every status, sorted by replica id, and the version it
// reflects.
func (b *Book) Snapshot() ([]*llmgwv1.ReplicaStatus, uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]*llmgwv1.ReplicaStatus, 0, len(b.entries))
	for _, e := range b.entries {
		out = append(out, proto.Clone(e.st).(*llmgwv1.ReplicaStatus))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetReplicaId() < out[j].GetReplicaId() })
	// Removals up to here are in no one's future: the copy already lacks them.
	for id, v := range b.removed {
		if v <= b.version {
			delete(b.removed, id)
		}
	}
	return out, b.version
}

// Since returns what changed after version from: statuses upserted and
// replicas removed, and the version the answer reflects.
func (b *Book) Since(from uint64) ([]*llmgwv1.ReplicaStatus, []string, uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var ups []*llmgwv1.ReplicaStatus
	for _, e := range b.entries {
		if e.ver > from {
			ups = append(ups, proto.Clone(e.st).(*llmgwv1.ReplicaStatus))
		}
	}
	sort.Slice(ups, func(i, j int) bool { return ups[i].GetReplicaId() < ups[j].GetReplicaId() })
	var rm []string
	for id, v := range b.removed {
		if v > from {
			rm = append(rm, id)
		}
		delete(b.removed, id)
	}
	sort.Strings(rm)
	return ups, rm, b.version
}

// Notify holds a token when something changed since the last read.
func (b *Book) Notify() <-chan struct{} { return b.notify }

// status returns a replica's latest status without disturbing what
// sessions have read (the copy is shared: callers must not modify it), or
// nil.
func (b *Book) status(id string) *llmgwv1.ReplicaStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e, ok := b.entries[id]; ok {
		return e.st
	}
	return nil
}
