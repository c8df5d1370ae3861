package kvindex

import (
	"container/heap"
	"slices"
)

// BlocksPage returns replica id's status and, sorted, at most limit of its
// block hashes greater than after (from the smallest when first), and
// whether more follow: one page of the router's debug listing, whose size
// and memory are bounded by limit however many blocks a replica holds (a
// replica of 1 M blocks listed whole was 21 MB a request). The index is
// read once under its read lock, keeping the limit smallest hashes in a
// heap; false when the index holds nothing for id.
func (x *Index) BlocksPage(id string, after uint64, first bool, limit int) (st Status, hashes []uint64, more bool, ok bool) {
	if limit < 1 {
		limit = 1
	}
	x.mu.RLock()
	r := x.replicas[id]
	if r == nil {
		x.mu.RUnlock()
		return Status{}, nil, false, false
	}
	st = r.Status
	h := make(maxHeap, 0, min(limit, r.blocks.Len()))
	r.blocks.each(func(v uint64) {
		switch {
		case !first && v <= after:
		case len(h) < limit:
			heap.Push(&h, v)
		case v < h[0]:
			h[0] = v
			heap.Fix(&h, 0)
			more = true
		default:
			more = true
		}
	})
	x.mu.RUnlock()
	hashes = []uint64(h)
	slices.Sort(hashes)
	return st, hashes, more, true
}

// ReplicasPage returns, sorted by id, the status of at most limit replicas
// whose ids sort after after ("" from the first), and whether more follow.
func (x *Index) ReplicasPage(after string, limit int) ([]Status, bool) {
	if limit < 1 {
		limit = 1
	}
	x.mu.RLock()
	ids := make([]string, 0, len(x.replicas))
	for id := range x.replicas {
		if id > after {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	more := len(ids) > limit
	ids = ids[:min(len(ids), limit)]
	out := make([]Status, len(ids))
	for i, id := range ids {
		out[i] = x.replicas[id].Status
	}
	x.mu.RUnlock()
	return out, more
}

// maxHeap keeps the smallest hashes seen, the largest of them on top.
type maxHeap []uint64

func (h maxHeap) Len() int           { return len(h) }
func (h maxHeap) Less(i, j int) bool { return h[i] > h[j] }
func (h maxHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *maxHeap) Push(v any)        { *h = append(*h, v.(uint64)) }
func (h *maxHeap) Pop() any {
	old := *h
	v := old[len(old)-1]
	*h = old[:len(old)-1]
	return v
}
