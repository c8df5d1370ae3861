package leader

import (
	"sync"
	"time"
)

// adapterDemand is what a router says of the requests behind one
// EnsureAdapter call (design §7.6).
type adapterDemand struct {
	// Queue: when no slot may be taken now, wait in the model's queue for
	// one instead of answering busy at once.
	Queue bool
	// Waiting is how many requests wait in the router for the adapter;
	// Since is when the oldest of them arrived (zero: now), its place in
	// the queue.
	Waiting int
	Since   time.Time
}

// adapterQueue holds the EnsureAdapter calls waiting for a slot, per model.
// A freed slot goes to the head: the call whose oldest request arrived
// first, whatever adapter it is for (FIFO by the oldest waiter, which ages
// with every moment it waits), so a hot adapter's many requests cannot keep
// a cold one out. Calls for an adapter already placed are not in it: they
// wait for the agent's report, not for a slot.
type adapterQueue struct {
	mu    sync.Mutex
	next  uint64
	calls map[string]map[uint64]queuedCall // model -> call id
}

type queuedCall struct {
	adapter string
	waiting int
	since   time.Time
}

func newAdapterQueue() *adapterQueue {
	return &adapterQueue{calls: map[string]map[uint64]queuedCall{}}
}

// join puts a call in model's queue and returns its id for leave.
func (q *adapterQueue) join(model string, c queuedCall) uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.next++
	if q.calls[model] == nil {
		q.calls[model] = map[uint64]queuedCall{}
	}
	q.calls[model][q.next] = c
	return q.next
}

// leave takes a call out of model's queue; id 0 is no call.
func (q *adapterQueue) leave(model string, id uint64) {
	if id == 0 {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.calls[model], id)
	if len(q.calls[model]) == 0 {
		delete(q.calls, model)
	}
}

// ahead reports whether a call for another adapter of model has waited
// longer than since (ties go to the lower adapter name, so two leaders'
// worth of routers agree): the slot is then that call's to take.
func (q *adapterQueue) ahead(model, adapter string, since time.Time) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, c := range q.calls[model] {
		if c.adapter == adapter {
			continue
		}
		if c.since.Before(since) || (c.since.Equal(since) && c.adapter < adapter) {
			return true
		}
	}
	return false
}

// length is the number of calls waiting for a slot for model's adapters.
func (q *adapterQueue) length(model string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.calls[model])
}
