package tracing

import (
	"context"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// countingExporter counts the spans and calls it is given.
type countingExporter struct {
	mu           sync.Mutex
	spans, calls int
	largest      int
	shut         bool
}

func (e *countingExporter) ExportSpans(_ context.Context, s []sdktrace.ReadOnlySpan) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.spans += len(s)
	e.calls++
	e.largest = max(e.largest, len(s))
	return nil
}

func (e *countingExporter) Shutdown(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.shut = true
	return nil
}

func (e *countingExporter) counts() (spans, calls, largest int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.spans, e.calls, e.largest
}

// TestBatcher: a full batch is exported before the tick; ForceFlush and
// Shutdown export what is queued; calls hold at most a batch; spans past
// the queue's bound are dropped; a span ended after Shutdown is too.
func TestBatcher(t *testing.T) {
	tests := []struct {
		name             string
		batch, max, ends int
		flush            bool // ForceFlush, then count
		wantSpans        int  // once exported
		wantLargest      int
	}{
		{name: "a full batch before the tick", batch: 4, max: 16, ends: 4, wantSpans: 4, wantLargest: 4},
		{name: "flush exports a part", batch: 4, max: 16, ends: 3, flush: true, wantSpans: 3, wantLargest: 3},
		{name: "flush exports by batches", batch: 4, max: 16, ends: 10, flush: true, wantSpans: 10, wantLargest: 4},
		{name: "past the bound dropped", batch: 100, max: 5, ends: 8, flush: true, wantSpans: 5, wantLargest: 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			exp := &countingExporter{}
			b := newBatcher(exp, time.Hour, tt.batch, tt.max)
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(b))
			tr := tp.Tracer("t")
			for range tt.ends {
				_, sp := tr.Start(context.Background(), "s")
				sp.End()
			}
			if tt.flush {
				if err := tp.ForceFlush(context.Background()); err != nil {
					t.Fatal(err)
				}
			} else {
				deadline := time.Now().Add(10 * time.Second)
				for n, _, _ := exp.counts(); n < tt.wantSpans && time.Now().Before(deadline); n, _, _ = exp.counts() {
					time.Sleep(time.Millisecond)
				}
			}
			if n, _, largest := exp.counts(); n != tt.wantSpans || largest != tt.wantLargest {
				t.Errorf("exported %d spans, at most %d a call; want %d, %d", n, largest, tt.wantSpans, tt.wantLargest)
			}
			if err := tp.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			_, sp := tr.Start(context.Background(), "late")
			sp.End()
			if n, _, _ := exp.counts(); n != tt.wantSpans || !exp.shut {
				t.Errorf("after Shutdown: %d spans, exporter shut %v; want %d, true", n, exp.shut, tt.wantSpans)
			}
		})
	}
}

// TestBatcherShutdownExports: spans queued at Shutdown are sent.
func TestBatcherShutdownExports(t *testing.T) {
	exp := &countingExporter{}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(newBatcher(exp, time.Hour, 512, 2048)))
	_, sp := tp.Tracer("t").Start(context.Background(), "s")
	sp.End()
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n, calls, _ := exp.counts(); n != 1 || calls != 1 {
		t.Fatalf("Shutdown exported %d spans in %d calls, want 1 in 1", n, calls)
	}
}
