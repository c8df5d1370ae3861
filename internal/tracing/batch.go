package tracing

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// batcher is the span processor of every component: ended spans are
// appended to a queue under a mutex, and its own goroutine exports them
// every tick, or as soon as a batch's worth is queued. The SDK's batch
// processor hands each ended span to its goroutine through a channel,
// which readies that goroutine once per span — on a router, two wake-ups
// and the scheduler's work per sampled request, on the request's own
// goroutine (docs/benchmarks.md, "Tracing cost"); here a request's span
// wakes nobody but every batch-th one. Spans past the queue's bound are
// dropped, never waited for: tracing costs spans, not requests.
type batcher struct {
	exp   sdktrace.SpanExporter
	tick  time.Duration
	batch int // most spans per export call; a full one wakes the goroutine
	max   int // most spans queued

	mu      sync.Mutex
	queue   []sdktrace.ReadOnlySpan
	spare   []sdktrace.ReadOnlySpan // the queue before, emptied, to reuse
	dropped int                     // since the last report
	stopped bool

	full  chan struct{}      // a batch is queued (capacity 1)
	flush chan chan struct{} // ForceFlush's request, closed once done
	stop  chan struct{}
	done  chan struct{}
}

// newBatcher starts a batcher exporting to exp.
func newBatcher(exp sdktrace.SpanExporter, tick time.Duration, batch, max int) *batcher {
	b := &batcher{exp: exp, tick: tick, batch: batch, max: max,
		full: make(chan struct{}, 1), flush: make(chan chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	go b.run()
	return b
}

// OnStart does nothing: spans are exported once ended.
func (*batcher) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

// OnEnd queues a sampled span.
func (b *batcher) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return
	}
	b.mu.Lock()
	switch {
	case b.stopped:
	case len(b.queue) >= b.max:
		b.dropped++
	default:
		b.queue = append(b.queue, s)
		if len(b.queue) == b.batch {
			select {
			case b.full <- struct{}{}:
			default:
			}
		}
	}
	b.mu.Unlock()
}

func (b *batcher) run() {
	defer close(b.done)
	t := time.NewTicker(b.tick)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			b.export(context.Background())
		case <-b.full:
			b.export(context.Background())
		case ack := <-b.flush:
			b.export(context.Background())
			close(ack)
		case <-b.stop:
			b.export(context.Background())
			return
		}
	}
}

// export sends what is queued, a batch at a time. Failures go to otel's
// error handler, as the SDK's batch processor's do.
func (b *batcher) export(ctx context.Context) {
	b.mu.Lock()
	q := b.queue
	b.queue, b.spare = b.spare[:0], nil
	dropped := b.dropped
	b.dropped = 0
	b.mu.Unlock()
	if dropped > 0 {
		otel.Handle(fmt.Errorf("tracing: %d spans dropped: the export queue was full", dropped))
	}
	for i := 0; i < len(q); i += b.batch {
		if err := b.exp.ExportSpans(ctx, q[i:min(i+b.batch, len(q))]); err != nil {
			otel.Handle(err)
		}
	}
	clear(q) // the spans are garbage now
	b.mu.Lock()
	if b.spare == nil && cap(q) <= 4*b.max {
		b.spare = q[:0]
	}
	b.mu.Unlock()
}

// ForceFlush exports what is queued, within ctx.
func (b *batcher) ForceFlush(ctx context.Context) error {
	ack := make(chan struct{})
	select {
	case b.flush <- ack:
	case <-b.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("tracing: flush: %w", ctx.Err())
	}
	select {
	case <-ack:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("tracing: flush: %w", ctx.Err())
	}
}

// Shutdown exports what is queued, stops the goroutine and shuts the
// exporter down, within ctx. Spans ended after it are dropped.
func (b *batcher) Shutdown(ctx context.Context) error {
	b.mu.Lock()
	first := !b.stopped
	b.stopped = true
	b.mu.Unlock()
	if !first {
		return nil
	}
	close(b.stop)
	select {
	case <-b.done:
	case <-ctx.Done():
		return fmt.Errorf("tracing: shutdown: %w", ctx.Err())
	}
	if err := b.exp.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: shutdown: %w", err)
	}
	return nil
}
