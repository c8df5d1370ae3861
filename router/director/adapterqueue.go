package director

import (
	"sync"
	"time"
)

// Clock is the adapter queue's time: how long a request has waited and
// when its wait ends. Tests replace it (newFakeClock); RealClock is the
// default.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

// RealClock is the wall clock.
type RealClock struct{}

// Now is time.Now.
func (RealClock) Now() time.Time { return time.Now() }

// After is time.After.
func (RealClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// DefaultAdapterQueue is how many requests may wait for adapter slots per
// model: enough for bursts of a few hundred (each costs a goroutine and
// its body), few enough that a router with no slot in sight answers 503
// rather than holding thousands of connections.
const DefaultAdapterQueue = 256

// adapterQueue holds the requests waiting for a cold adapter, per model,
// bounded by a length per model (design §7.6). Its order is the control
// plane's: each EnsureAdapter call carries its adapter's oldest waiting
// request's arrival, and a freed slot goes to the adapter whose oldest
// request has waited longest, across every router — FIFO by the oldest
// waiter, so however many requests a hot adapter brings, a cold one that
// has waited longer goes first.
type adapterQueue struct {
	max int

	mu     sync.Mutex
	models map[string]*modelQueue
}

// modelQueue is one model's waiting requests, by adapter.
type modelQueue struct {
	n        int
	adapters map[string]map[*waiter]struct{}
}

// waiter is one request's place in the queue.
type waiter struct {
	model, adapter string
	since          time.Time
}

func newAdapterQueue(maxLen int) *adapterQueue {
	if maxLen <= 0 {
		maxLen = DefaultAdapterQueue
	}
	return &adapterQueue{max: maxLen, models: map[string]*modelQueue{}}
}

// join puts a request for adapter in model's queue, or returns nil and the
// queue's length when it is full.
func (q *adapterQueue) join(model, adapter string, now time.Time) (*waiter, int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	mq := q.models[model]
	if mq == nil {
		mq = &modelQueue{adapters: map[string]map[*waiter]struct{}{}}
		q.models[model] = mq
	}
	if mq.n >= q.max {
		return nil, mq.n
	}
	w := &waiter{model: model, adapter: adapter, since: now}
	if mq.adapters[adapter] == nil {
		mq.adapters[adapter] = map[*waiter]struct{}{}
	}
	mq.adapters[adapter][w] = struct{}{}
	mq.n++
	return w, mq.n
}

// leave takes w out of its queue and returns the model's queue length.
func (q *adapterQueue) leave(w *waiter) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	mq := q.models[w.model]
	if mq == nil {
		return 0
	}
	if ws := mq.adapters[w.adapter]; ws != nil {
		if _, ok := ws[w]; ok {
			delete(ws, w)
			mq.n--
		}
		if len(ws) == 0 {
			delete(mq.adapters, w.adapter)
		}
	}
	n := mq.n
	if n == 0 {
		delete(q.models, w.model)
	}
	return n
}

// demand is how many requests wait for adapter of model and when the
// oldest arrived (zero when none waits).
func (q *adapterQueue) demand(model, adapter string) (n int, since time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	mq := q.models[model]
	if mq == nil {
		return 0, time.Time{}
	}
	for w := range mq.adapters[adapter] {
		if n == 0 || w.since.Before(since) {
			since = w.since
		}
		n++
	}
	return n, since
}
