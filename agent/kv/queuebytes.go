package kv

import (
	"context"
	"sync"

	"github.com/go-zeromq/zmq4"
)

// DefaultQueueBytes bounds the bytes of the messages waiting while a replay
// runs: four of the largest message a peer may send (MaxMessageBytes), so
// the queue's count bound (QueueSize) is not what lets 4096 such messages
// sit in memory at once.
const DefaultQueueBytes = 64 << 20

// byteBudget bounds the bytes of queued messages. A message waits for room
// unless nothing is queued, so one larger than the whole budget still
// passes rather than wait forever. One goroutine reserves, another releases.
type byteBudget struct {
	max  int
	room chan struct{} // a token after each release

	mu   sync.Mutex
	used int
}

func newByteBudget(max int) *byteBudget {
	return &byteBudget{max: max, room: make(chan struct{}, 1)}
}

// reserve waits until n bytes fit, or ctx ends.
func (b *byteBudget) reserve(ctx context.Context, n int) error {
	for {
		b.mu.Lock()
		if b.used == 0 || b.used+n <= b.max {
			b.used += n
			b.mu.Unlock()
			return nil
		}
		b.mu.Unlock()
		select {
		case <-b.room:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// release returns n bytes reserve took.
func (b *byteBudget) release(n int) {
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
	select {
	case b.room <- struct{}{}:
	default:
	}
}

// msgBytes is what a queued message holds of the frames' memory.
func msgBytes(m zmq4.Msg) int {
	n := 0
	for _, f := range m.Frames {
		n += len(f)
	}
	return n
}
