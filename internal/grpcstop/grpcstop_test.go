package grpcstop

import (
	"sync"
	"testing"
	"time"
)

// fakeServer's GracefulStop blocks until Stop is called when stuck is set,
// as grpc.Server's does while a stream stays open.
type fakeServer struct {
	stuck   bool
	once    sync.Once
	cut     chan struct{}
	stopped bool
}

func (f *fakeServer) GracefulStop() {
	if f.stuck {
		<-f.cut
	}
}

func (f *fakeServer) Stop() {
	f.stopped = true
	f.once.Do(func() { close(f.cut) })
}

func TestStop(t *testing.T) {
	tests := []struct {
		name         string
		stuck        bool
		wantGraceful bool
	}{
		{"streams end by themselves", false, true},
		{"a stream never ends", true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeServer{stuck: tt.stuck, cut: make(chan struct{})}
			if got := Stop(f, 10*time.Millisecond); got != tt.wantGraceful {
				t.Fatalf("graceful = %v, want %v", got, tt.wantGraceful)
			}
			if f.stopped == tt.wantGraceful {
				t.Fatalf("Stop called = %v, want %v", f.stopped, !tt.wantGraceful)
			}
		})
	}
}
