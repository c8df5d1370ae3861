package router

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestGCTunerPercent: a small live heap gets the GOGC that puts the next
// collection at about the minimum heap; a large one keeps the process's
// own GOGC.
func TestGCTunerPercent(t *testing.T) {
	const mib = 1 << 20
	tu := &gcTuner{minHeap: 64 * mib}
	tests := []struct {
		base int
		live uint64
		want int
	}{
		{100, 0, 1600},        // nothing measured yet: Go's own minimum moved to 64 MiB
		{100, 2 * mib, 1600},  // 2 MiB × 17 < 64 MiB: the minimum decides
		{100, 8 * mib, 700},   // 8 MiB × 8 = 64 MiB
		{100, 32 * mib, 100},  // 32 MiB × 2 = 64 MiB
		{100, 500 * mib, 100}, // a large heap: GOGC as the process has it
		{200, 500 * mib, 200}, // never below the process's own
		{2000, 2 * mib, 2000}, // nor when it is already higher
		{100, 70 * mib, 100},  // just over: no less than GOGC
	}
	for _, tt := range tests {
		if got := tu.percent(tt.base, tt.live); got != tt.want {
			t.Errorf("base %d, live %d MiB: %d, want %d", tt.base, tt.live/mib, got, tt.want)
		}
	}
}

// TestGCTunerRun: the tuner sets GOGC from the live heap, moves it only
// when the move is worth it, and gives the process's value back when it
// stops; GOGC=off is left alone.
func TestGCTunerRun(t *testing.T) {
	const mib = 1 << 20
	for _, tt := range []struct {
		name string
		base int
		want []int // the values set, before the restore
	}{
		{"tuned", 100, []int{1600, 700}},
		{"GOGC=off", -1, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var mu sync.Mutex
			gogc := tt.base
			var sets []int
			lives := []uint64{2 * mib, 2 * mib, 2*mib + 1, 8 * mib, 8 * mib}
			ticks := make(chan struct{}, 1)
			tu := &gcTuner{minHeap: 64 * mib, every: time.Millisecond, base: tt.base,
				live: func() uint64 {
					mu.Lock()
					defer mu.Unlock()
					v := lives[0]
					if len(lives) > 1 {
						lives = lives[1:]
					}
					select {
					case ticks <- struct{}{}:
					default:
					}
					return v
				},
				set: func(p int) int {
					mu.Lock()
					defer mu.Unlock()
					old := gogc
					gogc = p
					sets = append(sets, p)
					return old
				}}
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan struct{})
			go func() { defer close(done); tu.run(ctx) }()
			if tt.base >= 0 {
				deadline := time.After(5 * time.Second)
				for {
					mu.Lock()
					n := len(sets)
					mu.Unlock()
					if n == len(tt.want) {
						break
					}
					select {
					case <-ticks:
					case <-deadline:
						t.Fatalf("the tuner set %v, want %v", sets, tt.want)
					}
				}
			}
			cancel()
			<-done
			mu.Lock()
			defer mu.Unlock()
			if gogc != tt.base {
				t.Fatalf("GOGC %d after the tuner stopped, want the process's %d", gogc, tt.base)
			}
			got := sets
			if tt.base >= 0 {
				got = got[:len(got)-1] // the restore at the end
			}
			if len(got) != len(tt.want) {
				t.Fatalf("set %v, want %v then the restore", sets, tt.want)
			}
			for i := range tt.want {
				if got[i] != tt.want[i] {
					t.Fatalf("set %v, want %v then the restore", sets, tt.want)
				}
			}
		})
	}
}

func TestEnvGOGC(t *testing.T) {
	for v, want := range map[string]int{"": 100, "off": -1, "200": 200, "0": 0, "x": 100, "-5": 100} {
		if got := envGOGC(v); got != want {
			t.Errorf("GOGC=%q: %d, want %d", v, got, want)
		}
	}
}
