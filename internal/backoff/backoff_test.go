package backoff

import (
	"context"
	"testing"
	"time"
)

func TestNextDoublesWithinBoundsAndResets(t *testing.T) {
	tests := []struct {
		name   string
		jitter float64
		want   []time.Duration
	}{
		{"low end", 0, []time.Duration{50, 100, 200, 400, 400}},
		{"middle", 0.5, []time.Duration{75, 150, 300, 600, 600}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := New(100, 800, func() float64 { return tt.jitter })
			for i, w := range tt.want {
				if got := b.Next(); got != w {
					t.Fatalf("attempt %d: got %v, want %v", i, got, w)
				}
			}
			b.Reset()
			if got := b.Next(); got != tt.want[0] {
				t.Fatalf("after Reset: got %v, want %v", got, tt.want[0])
			}
		})
	}
}

func TestDrawStaysInHalfOpenRange(t *testing.T) {
	for _, j := range []float64{0, 0.25, 0.999999, 1, -1, 7} {
		got := Draw(time.Second, func() float64 { return j })
		if got < 500*time.Millisecond || got >= time.Second {
			t.Errorf("jitter %v: %v outside [500ms, 1s)", j, got)
		}
	}
}

func TestMaxBelowInitialIsRaised(t *testing.T) {
	b := New(time.Second, time.Millisecond, func() float64 { return 0 })
	b.Next()
	if got := b.Next(); got != 500*time.Millisecond {
		t.Fatalf("got %v, want the initial 1s drawn at its low end", got)
	}
}

func TestSleepStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Fatal("Sleep reported a full wait on a cancelled context")
	}
	if !Sleep(context.Background(), time.Microsecond) {
		t.Fatal("Sleep reported a cancel on a live context")
	}
}
