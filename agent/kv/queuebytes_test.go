package kv

import (
	"context"
	"testing"
	"time"
)

func TestByteBudget(t *testing.T) {
	ctx := context.Background()
	b := newByteBudget(100)
	// Fits, fits exactly; the next must wait for a release.
	for _, n := range []int{60, 40} {
		if err := b.reserve(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := b.reserve(short, 1); err == nil {
		t.Fatal("reserved past a full budget")
	}
	done := make(chan error, 1)
	go func() { done <- b.reserve(ctx, 50) }()
	b.release(60)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a release did not make room for a waiting reserve")
	}
	b.release(40)
	b.release(50)
	// Empty: a message larger than the whole budget still passes.
	if err := b.reserve(short, 1000); err != nil {
		t.Fatalf("an oversized message with nothing queued: %v", err)
	}
	if b.used != 1000 {
		t.Fatalf("used %d, want 1000", b.used)
	}
}
